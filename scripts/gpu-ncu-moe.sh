#!/usr/bin/env bash
# ncu over the routed-expert kernels of batched decode steps (issue 13), ON THE GPU MACHINE from the repo root after
# `bash scripts/gpu-bench.sh --prepare` here (carry ["gpu/bench/bundle.tar.xz"]): the released widths with 4 layers,
# 512 experts, batch ${BATCH:-32} at a ${CONTEXT:-512}-token context; every w4_* / moe_* launch of the timed steps with
# its grid, duration, DRAM bytes, occupancy and issue activity, into $OUT/ncu-moe.csv and a per-launch table.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
OUT=${OUT:-gpu/out-ncu}
mkdir -p "$OUT"
unpack_bundle gpu/bench/bundle.tar.xz gpu-ncu
timeout 300 ncu --clock-control none --print-units base --kernel-name 'regex:w4_|moe_' \
  --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-400}" --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size \
  "$G/bin/flashnext" bench --layers 4 --ple-rows 1000000 --prompts none --decode-tokens 0 --batches "${BATCH:-32}" \
  --batch-context "${CONTEXT:-512}" --batch-steps 3 --repeat 1 >"$OUT/ncu-moe.csv" 2>"$OUT/ncu-moe.log"
echo "gpu-ncu-moe: exit $?, $(grep -c gpu__time_duration "$OUT/ncu-moe.csv") launches"
python3 tools/ncu_summary.py "$OUT/ncu-moe.csv" --launches 24
