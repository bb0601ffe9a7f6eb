#!/usr/bin/env bash
# ncu's detailed report (speed of light, occupancy, warp stall reasons, instruction mix, memory) of the W4A16 expert
# kernels at the released expert geometry (bench_moe_w4a16: 512 experts x [1280, 2560] + [2560, 640], top-10), ON THE
# GPU MACHINE from the repo root after `bash scripts/gpu-bench.sh --prepare` here (carry ["gpu/bench/bundle.tar.xz"]).
#   KERNELS  regex of kernel names (default: the decode GEMVs, w4_gemv); COUNT launches profiled (default 4: the
#            gate/up and down kernels of the first two calls, one token); FORMAT a bench_moe_w4a16 format filter
#            (default nvfp4); TOKENS its token counts (default all; e.g. KERNELS=w4_gemm_mma COUNT=2 TOKENS=4096: the
#            prefill GEMM of a 4K prompt).
# Writes $OUT/ncu-w4.txt (and prints per kernel its duration, issue rate and main stall reasons), and $OUT/sass-w4.txt
# (the SASS of the kernels matching SASS, default w4_gemv, where cuobjdump is installed).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
OUT=${OUT:-gpu/out-ncu}
mkdir -p "$OUT"
unpack_bundle gpu/bench/bundle.tar.xz gpu-ncu-w4
timeout 300 ncu --clock-control none --kernel-name "regex:${KERNELS:-w4_gemv}" --launch-count "${COUNT:-4}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
  "$G/bin/bench_moe_w4a16" "${FORMAT:-nvfp4}" ${TOKENS:+"$TOKENS"} >"$OUT/ncu-w4.txt" 2>&1
echo "gpu-ncu-w4: ncu exit $?, $(grep -c 'Section: GPU Speed Of Light' "$OUT/ncu-w4.txt") kernel reports in $OUT/ncu-w4.txt"
# Per kernel: duration, issue rate, and the stall reasons that cost more than 0.3 cycles per issued instruction.
awk '/^  [a-z_].*\(/{print substr($0, 1, 90)} /Duration|Issued Warp Per Scheduler|Achieved Occupancy|Issued Instructions  /{print}
     /smsp__average_warps_issue_stalled_/{if ($NF + 0 > 0.3) print}' "$OUT/ncu-w4.txt"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$G/bin/bench_moe_w4a16" 2>/dev/null | awk '/Function :/{keep = ($0 ~ /'"${SASS:-w4_gemv}"'/)} keep' \
    >"$OUT/sass-w4.txt"
  echo "gpu-ncu-w4: $(wc -l <"$OUT/sass-w4.txt") lines of SASS in $OUT/sass-w4.txt"
else
  echo "gpu-ncu-w4: no cuobjdump here: no SASS"
fi
