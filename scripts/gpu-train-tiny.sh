#!/usr/bin/env bash
# Trains the bundled tiny model (models/tiny-fortunes) on the GPU machine in one repeatable call (tools/train_tiny.py).
#
#   bash scripts/gpu-train-tiny.sh --prepare   HERE: downloads the Debian `fortunes` and `fortunes-min` packages (the
#                                              training text, BSD licence) into gpu/train/fortunes and cuts the Qwen
#                                              tokenizer to 4,096 ids with its added tokens into gpu/train/tokenizer
#                                              (tools/truncate_tokenizer.py --keep-added). The flashnext checks
#                                              after training take `flashnext` from gpu/bench/bundle.tar.xz
#                                              (scripts/gpu-bench.sh --prepare) when it is carried too.
#   bash scripts/gpu-train-tiny.sh             ON THE GPU MACHINE from the repo root (the `run` tool: carry
#                                              ["gpu/train"]): trains for MINUTES (default 6) into the
#                                              model folder tiny-fortunes, with transformers' held-out perplexity and
#                                              greedy sample in its perplexity.json, packed as
#                                              $OUT/tiny-fortunes.tar.part-* (default OUT gpu/out-train); then, where
#                                              the bundle is there, flashnext's perplexity of the same tokens on the GPU
#                                              and the CPU, and a greedy answer, into $OUT/summary.txt.
# Unpack it into models/ (cat tiny-fortunes.tar.part-* | tar -x -C models) and check it on the CPU (ctest -R TinyFortunes).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
TRAIN=gpu/train
if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf "$TRAIN/fortunes"
  mkdir -p "$TRAIN/deb" "$TRAIN/fortunes"
  (cd "$TRAIN/deb" && apt-get download fortunes fortunes-min)
  x=$(mktemp -d)
  for d in "$TRAIN"/deb/*.deb; do dpkg-deb -x "$d" "$x"; done
  find "$x/usr/share/games/fortunes" -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$TRAIN/fortunes/" \;
  cp "$x"/usr/share/doc/fortunes/copyright "$TRAIN/fortunes.copyright"
  rm -rf "$x" "$TRAIN/deb"
  python3 tools/truncate_tokenizer.py models/tiny-b-random "$TRAIN/tokenizer" 4096 --keep-added
  du -sh "$TRAIN"
  exit 0
fi
OUT=${OUT:-gpu/out-train}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" |
  tee -a "$OUT/summary.txt"
PYTHONUNBUFFERED=1 python3 tools/train_tiny.py --text "$TRAIN/fortunes" --tokenizer "$TRAIN/tokenizer" \
  --out "$OUT/tiny-fortunes" --minutes "${MINUTES:-6}" ${TRAIN_ARGS:-} >"$OUT/train.log" 2>&1
status=$?
grep -E "^train_tiny: [^{]" "$OUT/train.log" | tee -a "$OUT/summary.txt"
[ $status = 0 ] || { tail -n 30 "$OUT/train.log"; exit $status; }
cp "$TRAIN/fortunes.copyright" "$OUT/tiny-fortunes/" 2>/dev/null
# What comes back from the device is at most 8 files of 16 MiB: the model folder as tiny-fortunes.tar.part-aa, -ab, ...
# (cat them, then tar -x). The flashnext checks below read it from /tmp.
M=/tmp/tiny-fortunes
rm -rf "$M" && mv "$OUT/tiny-fortunes" "$M"
tar -C /tmp -cf - tiny-fortunes | split -b 15m - "$OUT/tiny-fortunes.tar.part-"
BUNDLE=${BUNDLE:-gpu/bench/bundle.tar.xz}
if [ -f "$BUNDLE" ]; then
  unpack_bundle "$BUNDLE" gpu-train
  n=$(python3 -c "import json; print(json.load(open('$M/perplexity.json'))['eval_tokens'])")
  c=$(python3 -c "import json; print(json.load(open('$M/perplexity.json'))['eval_ctx'])")
  for dev in cuda cpu; do
    echo "flashnext perplexity ($dev): $("$G/bin/flashnext" perplexity --model "$M" --file "$M/heldout.txt" \
      --max-tokens "$n" --ctx "$c" --device $dev --json 2>>"$OUT/flashnext.log")" | tee -a "$OUT/summary.txt"
  done
  echo "flashnext generate --device cuda --temperature 0: $("$G/bin/flashnext" generate --model "$M" --device cuda \
    --prompt "Tell me a joke about GPUs." --temperature 0 --max-tokens 64 2>>"$OUT/flashnext.log")" |
    tee -a "$OUT/summary.txt"
fi
exit 0
