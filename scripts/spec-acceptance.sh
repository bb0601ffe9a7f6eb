#!/usr/bin/env bash
# Acceptance of speculative drafts on a model (default: the bundled models/tiny-fortunes), summed over eight chat
# requests decoded greedily (64 tokens each) by `flashnext generate --speculative SPEC`: verify steps, drafted and
# accepted tokens, acceptance rate and mean accepted length (tokens emitted a verify step). docs/BENCHMARKS.md records it.
#   bash scripts/spec-acceptance.sh mtp:1 mtp:2 ngram:4      env: BIN (default build/flashnext), MODEL, DEVICE (cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/flashnext}
MODEL=${MODEL:-models/tiny-fortunes}
prompts=("Tell me a joke about GPUs." "Tell me a joke." "Say something wise." "Tell me something about love."
         "Give me a quote about work." "Tell me a joke about computers." "What do you think about science?"
         "Make me laugh.")
for spec in "$@"; do
  steps=0 drafted=0 accepted=0
  for p in "${prompts[@]}"; do
    line=$("$BIN" generate --model "$MODEL" --device "${DEVICE:-cpu}" --prompt "$p" --temperature 0 --max-tokens 64 \
      --speculative "$spec" 2>&1 >/dev/null | grep "^speculative")
    read -r s d a <<<"$(sed -E 's/.*: ([0-9]+) verify steps, drafted ([0-9]+), accepted ([0-9]+).*/\1 \2 \3/' <<<"$line")"
    steps=$((steps + s)) drafted=$((drafted + d)) accepted=$((accepted + a))
  done
  awk -v spec="$spec" -v n="${#prompts[@]}" -v s=$steps -v d=$drafted -v a=$accepted 'BEGIN {
    printf "%s: %d requests, %d verify steps, drafted %d, accepted %d (%.1f%%), mean accepted length %.2f\n",
      spec, n, s, d, a, d ? 100 * a / d : 0, s ? 1 + a / s : 0 }'
done
