#!/usr/bin/env bash
# The device tool copies at most 64 MiB of working tree; the tracked tree is larger. This moves what no GPU script
# reads (the server and fuzz suites, the tokenizer and chat-template data, the bundled model's tokenizer, the sources
# baked into the bundles, docs, the quantized fixtures whose GPU paths others cover) to $ASIDE and back.
#   bash scripts/gpu-slim.sh            moves them aside and prints the bytes that will travel
#   bash scripts/gpu-slim.sh --restore  puts them back (run it before committing; with the same SLIM_EXTRA)
set -euo pipefail
cd "$(dirname "$0")/.."
ASIDE=${ASIDE:-/tmp/flashnext-aside}
# The quantized fixtures left behind are covered on the GPU by others: awq-int4-g32's experts are those of
# awq-int4-g32-ple-int8, nvfp4-nvidia's codes those of nvfp4-radixark, gptq-int4-g32's and autoround-mixed-g32's
# 2- to 8-bit GPTQ experts and dequantized dense GPTQ weights are in autoround-tool-rtn (scripts/gpu-bench.sh names
# them as not run).
PATHS=(src docs tests/server tests/fuzz tests/data/tokenizer tests/data/chat tests/data/quant/awq-int4-g128
       tests/data/quant/awq-int4-g32 tests/data/quant/nvfp4-nvidia tests/data/quant/gptq-int4-g32
       tests/data/quant/autoround-mixed-g32
       models/tiny-b-random/tokenizer.json models/tiny-fortunes)
# SLIM_EXTRA: more paths to leave behind for a call that carries more (e.g. gpu/train with the bundle:
# SLIM_EXTRA="tests/data/quant tests/data/fixtures/tiny-b"), the same value for --restore.
# shellcheck disable=SC2206
PATHS+=(${SLIM_EXTRA:-})
# Both ways the last paths first: a SLIM_EXTRA folder moves whole, before (and instead of) the paths inside it.
ORDER=()
for ((i = ${#PATHS[@]} - 1; i >= 0; i--)); do ORDER+=("${PATHS[i]}"); done
if [ "${1:-}" = "--restore" ]; then
  for p in "${ORDER[@]}"; do
    if [ -e "$ASIDE/$p" ] && [ ! -e "$p" ]; then mkdir -p "$(dirname "$p")" && mv "$ASIDE/$p" "$p"; fi
  done
  # Whatever is still aside (a folder whose place a restored path inside it re-created, or a SLIM_EXTRA path this
  # restore was not told about) goes back file by file, never over an existing file.
  if [ -d "$ASIDE" ]; then
    (cd "$ASIDE" && find . -type f) | while read -r f; do
      [ -e "$f" ] || { mkdir -p "$(dirname "$f")" && mv "$ASIDE/$f" "$f"; }
    done
    find "$ASIDE" -depth -type d -empty -delete
  fi
  git status --short | head -n 5
  exit 0
fi
[ -d "$ASIDE" ] && find "$ASIDE" -depth -type d -empty -delete  # folders an earlier restore emptied
for p in "${ORDER[@]}"; do
  [ -e "$p" ] || continue
  if [ -e "$ASIDE/$p" ]; then echo "gpu-slim: $ASIDE/$p is already there: restore first" >&2; exit 1; fi
  mkdir -p "$ASIDE/$(dirname "$p")"
  mv "$p" "$ASIDE/$p"
done
bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | { xargs -0 -r stat -c %s 2>/dev/null || true; } | awk '{s+=$1} END {print s}')
echo "gpu-slim: $bytes bytes of working tree travel (plus what carry names; limit 67108864)"
