#!/usr/bin/env bash
# `flashnext bench` on the GPU machine in one repeatable command: a quick correctness pass (the CUDA backend's
# end-to-end tests on the tiny fixtures, and a small bench geometry), then the released geometry at full size
# (48 layers, 512 W4A16 experts, vocab 248,320, the 51.2 GB FP8 PLE table in pinned host memory), default
# precision, with the per-phase profile; optionally also with FLASHNEXT_CUDA_ACTIVATIONS=fp16.
#
#   bash scripts/gpu-bench.sh --prepare   HERE: builds `flashnext` and `test_cuda_e2e` in $BUILD (default
#                                         build-cudabe, configured for sm_90 if absent) and packs them with the shared
#                                         libraries the GPU machine lacks into gpu/bench/bundle.tar.xz.
#   bash scripts/gpu-bench.sh             ON THE GPU MACHINE from the repo root (the `run` tool: carry ["gpu/bench"]).
# Output in $OUT (default gpu/out-bench): sm90-*.log (and ptx70-*.log), bench-small.json, bench-full.json
# (+ bench-full-fp16.json), their logs, and summary.txt, which says what was run and what was not.
# Env: BUILD; E2E=0 skips the tests (the end-to-end tests, the op-case registry against the CPU oracle in both
#      precisions, and the W4A16 kernel tests); E2E_NCCL=0 skips their second pass through NCCL and the check of
#      tensor parallelism over two processes (run_nodes below);
#      OPS_PERF=1 adds the per-op table (bench_ops, both precisions); W4_BENCH=1 the W4A16 expert kernels alone
#      (bench_moe_w4a16; W4_FILTER: a format name, e.g. nvfp4; W4_TOKENS: the token counts, e.g. 8,16,32,64);
#      OPS_FILTER (a regex of case names) and OPS_PRECISIONS (default "fp16x2 fp16") narrow that table;
#      E2E_FILTER: a gtest filter that narrows test_cuda_e2e (e.g. '*QuantGpu*'; with it the NCCL pass is not run);
#      TEST_OPS=0 leaves out the op-case registry runs (test_ops), for a call that checks only the W4A16 kernels and
#      the end-to-end tests (e.g. E2E_FILTER='*QuantGpu*' TEST_OPS=0);
#      FULL=0 skips the released-geometry bench, which runs only after every check above passed unless
#      FULL_AFTER_FAILURE=1 (a scarce GPU call that should bring figures back whatever the tests say);
#      PTX70=1 (also with --prepare) runs the tests again from binaries
#      whose device code is compute_70 PTX only (scripts/nvcc-ptx70.py), JIT-compiled by the driver as for a V100;
#      MEDIUM=1 adds the medium fixture's tests (made with tools/make_fixtures.py into FIXTURE_DIR, default /tmp/fx);
#      FP16=1 adds the fp16 run; BENCH_ARGS: extra arguments of the full-size run (e.g. "--prompts 1024,4096");
#      BASELINE_ENV="VAR=VALUE ...": the full-size run once more with those variables (bench-full-baseline.json), the
#      before of a before/after on one machine (e.g. FLASHNEXT_CUDA_PDL=0: plain launches); BASELINE_BIN=PATH with
#      --prepare packs a flashnext built from the baseline commit, and the run then benches it as that baseline;
#      BASELINE_OPS=DIR with --prepare packs the bench_ops and bench_moe_w4a16 of DIR (built from the baseline commit),
#      and OPS_PERF / W4_BENCH then run them too (ops-perf-PREC-baseline.txt, bench-moe-w4a16-baseline.txt);
#      BASELINE=0 skips the packed baseline builds' benches (one bundle, a run that needs no before);
#      ENV_VARIANTS="VAR=VALUE ...|VAR=VALUE ...": the full-size run of this build once more per '|'-separated set of
#      variables (bench-full-variant-N.json, N from 1): one binary's alternative kernels side by side;
#      BASELINE2_BIN=PATH with --prepare packs a second baseline build (another commit), which the run then benches
#      as bench-full-baseline2.json (three commits in one call: e.g. a change, its parent, an older one);
#      BASELINE2_ENV="VAR=VALUE ...": the baseline build once more with those variables (bench-full-baseline2.json),
#      e.g. BASELINE_BIN=<main> BASELINE2_ENV=FLASHNEXT_CUDA_GRAPHS=0: a change, its parent, and the parent without
#      graphs in one call;
#      NCU=1 adds per-kernel figures of decode steps (ncu: duration, DRAM throughput, occupancy, instructions and
#      issue activity, registers of every kernel of NCU_COUNT launches after NCU_SKIP, default 400 / 1200) at the
#      released widths with 4 layers, 512 experts and an 8K context, into ncu-decode.csv (ncu's clock control off:
#      the clocks bench runs at), and their medians per kernel into ncu-summary.txt (tools/ncu_summary.py);
#      NCU_OPS=REGEX: ncu over the kernels matching REGEX in the bench_ops cases OPS_FILTER selects (ncu-ops.csv,
#      ncu-ops-summary.txt), e.g. NCU_OPS='gdn_chunk' OPS_FILTER='gdn_rule_batch/.*steps=4096'.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
BUILD=${BUILD:-build-cudabe}
BUNDLE=${BUNDLE:-gpu/bench/bundle.tar.xz}
BUILD_PTX70=${BUILD_PTX70:-build-ptx70}
BUNDLE_PTX70=gpu/bench/bundle-ptx70.tar.xz

if [ "${1:-}" = "--prepare" ]; then
  set -e
  [ -f "$BUILD/CMakeCache.txt" ] ||
    cmake -S . -B "$BUILD" -G Ninja -DFLASHNEXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
  cmake --build "$BUILD" --target flashnext test_cuda_e2e test_ops test_cuda bench_ops bench_moe_w4a16 --parallel 2
  extra=()
  if [ -n "${BASELINE_BIN:-}" ]; then  # a flashnext built from the baseline commit, packed as bin/flashnext-baseline
    mkdir -p gpu/bench/baseline && cp "$BASELINE_BIN" gpu/bench/baseline/flashnext-baseline
    extra=(gpu/bench/baseline/flashnext-baseline)
  fi
  if [ -n "${BASELINE2_BIN:-}" ]; then  # a second baseline build (another commit), packed as bin/flashnext-baseline2
    mkdir -p gpu/bench/baseline && cp "$BASELINE2_BIN" gpu/bench/baseline/flashnext-baseline2
    extra+=(gpu/bench/baseline/flashnext-baseline2)
  fi
  if [ -n "${BASELINE_OPS:-}" ]; then  # the op benchmarks of the baseline commit, as bin/*-baseline
    mkdir -p gpu/bench/baseline
    cp "$BASELINE_OPS/bench_ops" gpu/bench/baseline/bench_ops-baseline
    cp "$BASELINE_OPS/bench_moe_w4a16" gpu/bench/baseline/bench_moe_w4a16-baseline
    extra+=(gpu/bench/baseline/bench_ops-baseline gpu/bench/baseline/bench_moe_w4a16-baseline)
  fi
  pack_bundle "$BUNDLE" "$BUILD/flashnext" "$BUILD/tests/test_cuda_e2e" "$BUILD/tests/test_ops" "$BUILD/tests/test_cuda" \
    "$BUILD/benchmarks/bench_ops" "$BUILD/benchmarks/bench_moe_w4a16" "${extra[@]}"
  echo "gpu-bench: packed $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); run: bash scripts/gpu-bench.sh"
  if [ "${PTX70:-0}" = 1 ]; then
    # The same tests with only compute_70 PTX in them (scripts/nvcc-ptx70.py), JIT-compiled by the driver there.
    [ -f "$BUILD_PTX70/CMakeCache.txt" ] ||
      cmake -S . -B "$BUILD_PTX70" -G Ninja -DFLASHNEXT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=75-virtual -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
        -DCMAKE_CUDA_COMPILER_LAUNCHER="$PWD/scripts/nvcc-ptx70.py" >/dev/null
    cmake --build "$BUILD_PTX70" --target flashnext test_cuda_e2e test_ops test_cuda --parallel 2
    pack_bundle "$BUNDLE_PTX70" "$BUILD_PTX70/flashnext" "$BUILD_PTX70/tests/test_cuda_e2e" \
      "$BUILD_PTX70/tests/test_ops" "$BUILD_PTX70/tests/test_cuda"
    echo "gpu-bench: packed $BUNDLE_PTX70 ($(du -h "$BUNDLE_PTX70" | cut -f1)); run: PTX70=1 bash scripts/gpu-bench.sh"
  fi
  exit 0
fi

OUT=${OUT:-gpu/out-bench}
mkdir -p "$OUT"
unpack_bundle "$BUNDLE" gpu-bench
S="$OUT/summary.txt"
: >"$S"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc; free -g | head -2; } | tee -a "$S"
status=0
# NCCL is loaded at run time (src/ops/cuda/nccl_communicator.h): where the loader does not know a libnccl.so.2, the
# one of the Python packages (PyTorch's nvidia-nccl) is used.
if [ -z "${FLASHNEXT_NCCL_LIBRARY:-}" ] && ! ldconfig -p | grep -q 'libnccl\.so\.2 '; then
  nccl_lib=$(find /usr /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
    -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  [ -n "$nccl_lib" ] && export FLASHNEXT_NCCL_LIBRARY=$nccl_lib
fi
echo "gpu-bench: NCCL ${FLASHNEXT_NCCL_LIBRARY:-from the loader path}" | tee -a "$S"
FX=${FIXTURE_DIR:-/tmp/fx}
fx_pid=""
if [ "${MEDIUM:-0}" = 1 ] && [ ! -f "$FX/medium/reference.safetensors" ]; then
  (PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py "$FX" medium >"$OUT/fixture.log" 2>&1) &
  fx_pid=$!
fi
# run_nodes BIN LABEL GPUS: tensor parallelism over two processes of this machine (--nnodes 2, docs/ENGINE.md
# "Several processes"): tiny-a's long prompt through `logits --tp 2 --nnodes 2 --device cuda`, its greedy ids against
# --tp 1 on one GPU and the largest logit difference printed; staged collectives with both processes on GPU 0, and with
# two GPUs NCCL across the processes (one GPU each by CUDA_VISIBLE_DEVICES). Sets status=1 on a failure.
run_nodes() {
  local bin=$1 label=$2 gpus=$3 comm port=29561 ids
  ids=$(python3 -c "from safetensors.numpy import load_file as l; print(','.join(map(str, l('tests/data/fixtures/tiny-a/reference.safetensors')['long.input_ids'])))")
  local common=(logits --model tests/data/fixtures/tiny-a/model --ids "$ids" --chunk 7 --greedy 8 --device cuda)
  "$bin/flashnext" "${common[@]}" --out "$OUT/nodes-tp1.npy" >"$OUT/nodes-tp1.txt" 2>>"$OUT/$label-nodes.log" || status=1
  for comm in staged nccl; do
    local vis0="" vis1=""
    if [ "$comm" = nccl ]; then
      [ "$gpus" -ge 2 ] || { echo "gpu-bench: [$label] --nnodes 2 over NCCL NOT run ($gpus GPU)" | tee -a "$S"; continue; }
      vis0=0 vis1=1
    fi
    port=$((port + 1))
    (CUDA_VISIBLE_DEVICES=${vis1:-${CUDA_VISIBLE_DEVICES:-0}} FLASHNEXT_TP_COMM=$comm timeout 120 "$bin/flashnext"       "${common[@]}" --out "$OUT/nodes-$comm-1.npy" --tp 2 --nnodes 2 --node-rank 1 --master-port $port       >>"$OUT/$label-nodes.log" 2>&1) &
    CUDA_VISIBLE_DEVICES=${vis0:-${CUDA_VISIBLE_DEVICES:-0}} FLASHNEXT_TP_COMM=$comm timeout 120 "$bin/flashnext"       "${common[@]}" --out "$OUT/nodes-$comm.npy" --tp 2 --nnodes 2 --master-port $port >"$OUT/nodes-$comm.txt"       2>>"$OUT/$label-nodes.log" || status=1
    wait
    if cmp -s "$OUT/nodes-$comm.txt" "$OUT/nodes-tp1.txt"; then
      echo "gpu-bench: [$label] --tp 2 --nnodes 2 ($comm): greedy ids equal --tp 1's: $(cat "$OUT/nodes-tp1.txt")" | tee -a "$S"
    else
      echo "gpu-bench: [$label] --tp 2 --nnodes 2 ($comm): greedy ids DIFFER from --tp 1's" | tee -a "$S"
      status=1
    fi
    python3 -c "import numpy as n; a=n.load('$OUT/nodes-$comm.npy'); b=n.load('$OUT/nodes-tp1.npy'); print(f'gpu-bench: [$label] --nnodes 2 ($comm): max |logits - tp1| / max|tp1| = {abs(a-b).max()/abs(b).max():.3g}')" 2>&1 | tee -a "$S"
  done
}

# run_tests BIN LABEL: the end-to-end tests on the tiny fixtures, the op-case registry against the CPU oracle in both
# precisions and the W4A16 kernel tests, from the binaries in BIN; logs in $OUT/LABEL*.log; sets status=1 on failure.
run_tests() {
  local bin=$1 label=$2 prec absent=""
  # A quantized fixture left behind by scripts/gpu-slim.sh (the copy's 64 MiB; SLIM_EXTRA's included) is named and
  # its cases skipped: the fixtures are the parameters of the binary's QuantGpu cases.
  local fx
  for fx in $("$bin/test_cuda_e2e" --gtest_list_tests --gtest_filter='*QuantGpu*' 2>/dev/null |
    sed -n 's/.*GetParam() = "\([^"]*\)".*/\1/p' | sort -u); do
    if [ ! -f "tests/data/quant/$fx/reference.safetensors" ]; then
      absent="$absent:*/${fx//-/_}"
      echo "gpu-bench: [$label] tests/data/quant/$fx absent: its cases NOT run" | tee -a "$S"
    fi
  done
  echo "gpu-bench: [$label] test_cuda_e2e on the tiny fixtures" | tee -a "$S"
  timeout 300 "$bin/test_cuda_e2e" --gtest_color=no --gtest_filter="${E2E_FILTER:-*}-*Medium*:*MultiGpu*$absent" \
    >"$OUT/$label-e2e.log" 2>&1 ||
    status=1
  grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/$label-e2e.log" | tee -a "$S"
  if [ "$label" = sm90 ] && [ "${E2E_NCCL:-1}" != 0 ] && [ -z "${E2E_FILTER:-}" ]; then
    # Every end-to-end test again through the tensor-parallel code path as a group of one over NCCL
    # (tests/cuda/e2e/gpu_model_options.h); then TP over NCCL across GPUs where the machine has several.
    echo "gpu-bench: [$label] test_cuda_e2e through a TP group of one over NCCL (FLASHNEXT_TEST_TP1_NCCL=1)" | tee -a "$S"
    FLASHNEXT_TEST_TP1_NCCL=1 timeout 300 "$bin/test_cuda_e2e" --gtest_color=no \
      --gtest_filter="-*Medium*:*MultiGpu*:*TinyATp*$absent" >"$OUT/$label-e2e-nccl.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |tests ran|^NCCL" "$OUT/$label-e2e-nccl.log" | tee -a "$S"
    local gpus filter=""
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    [ "$gpus" -ge 2 ] && filter='*MultiGpu*/0:*MultiGpu*/1:*MultiGpu*/2'
    [ "$gpus" -ge 4 ] && filter='*MultiGpu*'
    if [ -n "$filter" ]; then
      echo "gpu-bench: [$label] tensor parallelism over NCCL on $gpus GPUs ($filter)" | tee -a "$S"
      timeout 300 "$bin/test_cuda_e2e" --gtest_color=no --gtest_filter="$filter" >"$OUT/$label-e2e-multigpu.log" 2>&1 ||
        status=1
      grep -E "^\[  (PASSED|FAILED) |tests ran|E2E" "$OUT/$label-e2e-multigpu.log" | tee -a "$S"
    else
      echo "gpu-bench: [$label] tensor parallelism across GPUs NOT run ($gpus GPU)" | tee -a "$S"
    fi
    run_nodes "$bin" "$label" "$gpus"
  fi
  local precs="fp16x2 fp16" qsas="tile_union per_query"
  if [ "${TEST_OPS:-1}" = 0 ]; then
    precs="" qsas=""
    echo "gpu-bench: [$label] test_ops NOT run (TEST_OPS=0)" | tee -a "$S"
  fi
  for prec in $precs; do
    echo "gpu-bench: [$label] test_ops (op-case registry vs the CPU oracle), FLASHNEXT_TEST_PRECISION=$prec" | tee -a "$S"
    # (KernelSource reads src/, which scripts/gpu-slim.sh leaves behind: it runs in the CPU test suite.)
    FLASHNEXT_TEST_BACKEND=cuda FLASHNEXT_TEST_PRECISION=$prec timeout 300 "$bin/test_ops" --gtest_color=no \
      --gtest_filter='-KernelSource.*' >"$OUT/$label-ops-$prec.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |tests ran|^\[  FAILED  \]" "$OUT/$label-ops-$prec.log" | head -40 | tee -a "$S"
  done
  # The QSA attention cases through each kernel (Auto takes the tile-union kernel only for steps of a full wave of
  # blocks, which the small cases are not).
  for qsa in $qsas; do
    echo "gpu-bench: [$label] test_ops QSA attention cases, FLASHNEXT_CUDA_QSA=$qsa" | tee -a "$S"
    FLASHNEXT_TEST_BACKEND=cuda FLASHNEXT_CUDA_QSA=$qsa timeout 120 "$bin/test_ops" --gtest_color=no \
      --gtest_filter='*sparseattention*' >"$OUT/$label-ops-qsa-$qsa.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/$label-ops-qsa-$qsa.log" | head -20 | tee -a "$S"
  done
  # The gated delta rule cases through the float32 FMA chunk kernels too (Auto takes the tensor-core ones).
  if [ "${TEST_OPS:-1}" != 0 ]; then
    echo "gpu-bench: [$label] test_ops gated delta rule cases, FLASHNEXT_CUDA_GDN_CHUNK=cuda_cores" | tee -a "$S"
    FLASHNEXT_TEST_BACKEND=cuda FLASHNEXT_CUDA_GDN_CHUNK=cuda_cores timeout 120 "$bin/test_ops" --gtest_color=no \
      --gtest_filter='*gdnrulebatch*' >"$OUT/$label-ops-gdn-cuda_cores.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/$label-ops-gdn-cuda_cores.log" | head -20 | tee -a "$S"
  fi
  echo "gpu-bench: [$label] test_cuda (W4A16 kernels)" | tee -a "$S"
  timeout 300 "$bin/test_cuda" --gtest_color=no >"$OUT/$label-test_cuda.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/$label-test_cuda.log" | tee -a "$S"
}
if [ "${E2E:-1}" != 0 ]; then
  run_tests "$G/bin" sm90
else
  echo "gpu-bench: test_cuda_e2e NOT run (E2E=0)" | tee -a "$S"
fi
if [ "${PTX70:-0}" = 1 ]; then
  # Binaries whose only device code is compute_70 PTX: the driver JIT-compiles every kernel as for a V100.
  G_SM90=$G
  unpack_bundle "$BUNDLE_PTX70" gpu-ptx70
  G70=$G
  G=$G_SM90
  if command -v cuobjdump >/dev/null; then
    echo "gpu-bench: [ptx70] device code in test_cuda_e2e (cuobjdump -lptx / -lelf):" | tee -a "$S"
    { cuobjdump -lptx "$G70/bin/test_cuda_e2e" | sort | uniq -c | sed 's/\.[0-9]*\.sm/.N.sm/' | head -5
      echo "SASS images: $(cuobjdump -lelf "$G70/bin/test_cuda_e2e" 2>/dev/null | grep -c ELF)"; } | tee -a "$S"
  fi
  export CUDA_CACHE_MAXSIZE=4294967296
  run_tests "$G70/bin" ptx70
  echo "gpu-bench: [ptx70] small geometry bench (JIT-compiled compute_70 kernels)" | tee -a "$S"
  timeout 180 "$G70/bin/flashnext" bench --layers 4 --experts 16 --vocab 4096 --ple-rows 1000000 --prompts 256,2100 \
    --decode-context 2100 --decode-tokens 40 --batches 4 --batch-context 300 --batch-steps 6 --repeat 1 \
    --out "$OUT/ptx70-bench-small.json" >"$OUT/ptx70-bench-small.txt" 2>&1 || { status=1; tail -n 20 "$OUT/ptx70-bench-small.txt"; }
  grep -v "^bench:" "$OUT/ptx70-bench-small.txt" | tee -a "$S"
  if [ "${MEDIUM:-0}" = 1 ]; then MEDIUM_BINS=("$G/bin" "$G70/bin"); fi
fi
if [ "${MEDIUM:-0}" = 1 ]; then
  if [ -n "$fx_pid" ]; then wait "$fx_pid" || { echo "gpu-bench: make_fixtures.py medium failed" | tee -a "$S"; status=1; }; fi
  for bin in "${MEDIUM_BINS[@]:-$G/bin}"; do
    label=$([ "$bin" = "$G/bin" ] && echo sm90 || echo ptx70)
    echo "gpu-bench: [$label] test_cuda_e2e on the medium fixture" | tee -a "$S"
    FLASHNEXT_MEDIUM_FIXTURE="$FX/medium" timeout 240 "$bin/test_cuda_e2e" --gtest_color=no --gtest_filter='*Medium*' \
      >"$OUT/$label-e2e-medium.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |tests ran|E2E" "$OUT/$label-e2e-medium.log" | tee -a "$S"
  done
else
  echo "gpu-bench: the medium fixture tests NOT run (MEDIUM=0; scripts/gpu-e2e.sh runs them)" | tee -a "$S"
fi
# The op benchmarks, and those of the baseline build where --prepare packed them (BASELINE_OPS).
op_bench_suffixes=("")
[ -x "$G/bin/bench_ops-baseline" ] && op_bench_suffixes+=("-baseline")
if [ "${OPS_PERF:-0}" = 1 ]; then
  for suffix in "${op_bench_suffixes[@]}"; do
    for prec in ${OPS_PRECISIONS:-fp16x2 fp16}; do
      echo "gpu-bench: bench_ops$suffix --backend cuda --precision $prec ${OPS_FILTER:+--filter $OPS_FILTER}" | tee -a "$S"
      timeout 300 "$G/bin/bench_ops$suffix" --backend cuda --precision $prec ${OPS_FILTER:+--filter "$OPS_FILTER"} \
        --json "$OUT/ops-perf-$prec$suffix.json" >"$OUT/ops-perf-$prec$suffix.txt" 2>&1 ||
        { echo "gpu-bench: bench_ops$suffix failed" | tee -a "$S"; tail -n 5 "$OUT/ops-perf-$prec$suffix.txt"; }
      cat "$OUT/ops-perf-$prec$suffix.txt" | tee -a "$S"
    done
  done
fi
if [ "${W4_BENCH:-0}" = 1 ]; then
  # The W4A16 routed experts alone at the released expert geometry (512 x [1280, 2560] + [2560, 640], top-10): the
  # tensor-core GEMV, the FP32-FMA GEMV and the GEMM at 1..4096 tokens, per format.
  for suffix in "${op_bench_suffixes[@]}"; do
    echo "gpu-bench: bench_moe_w4a16$suffix ${W4_FILTER:-}" | tee -a "$S"
    w4_args=(${W4_FILTER:-})
    [ -n "${W4_TOKENS:-}" ] && w4_args=("${W4_FILTER:-}" "$W4_TOKENS")
    timeout 300 "$G/bin/bench_moe_w4a16$suffix" "${w4_args[@]}" >"$OUT/bench-moe-w4a16$suffix.txt" 2>&1 ||
      echo "gpu-bench: bench_moe_w4a16$suffix failed" | tee -a "$S"
    cat "$OUT/bench-moe-w4a16$suffix.txt" | tee -a "$S"
  done
fi
if [ -n "${NCU_OPS:-}" ]; then
  # Per-kernel figures of the op cases OPS_FILTER selects (bench_ops, one timed run each), for the kernels whose
  # names match the regex NCU_OPS: duration, DRAM and L2 throughput, occupancy, issue activity, shared-memory bank
  # conflicts; medians per kernel in ncu-ops-summary.txt.
  echo "gpu-bench: ncu over bench_ops --filter '${OPS_FILTER:-}' kernels /${NCU_OPS}/" | tee -a "$S"
  timeout 300 ncu --clock-control none --print-units base --kernel-name "regex:${NCU_OPS}" \
    --launch-count "${NCU_COUNT:-40}" --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,launch__registers_per_thread,launch__grid_size \
    "$G/bin/bench_ops" --backend cuda --filter "${OPS_FILTER:-.}" --repeat 1 >"$OUT/ncu-ops.csv" 2>"$OUT/ncu-ops.log" ||
    { echo "gpu-bench: ncu failed" | tee -a "$S"; tail -n 5 "$OUT/ncu-ops.log" | tee -a "$S"; }
  python3 tools/ncu_summary.py "$OUT/ncu-ops.csv" >"$OUT/ncu-ops-summary.txt" 2>&1 && cat "$OUT/ncu-ops-summary.txt" | tee -a "$S"
fi
echo "gpu-bench: small geometry (4 layers, 16 experts, vocab 4096)" | tee -a "$S"
timeout 120 "$G/bin/flashnext" bench --layers 4 --experts 16 --vocab 4096 --ple-rows 1000000 --prompts 256,2100 \
  --decode-context 2100 --decode-tokens 40 --batches 4 --batch-context 300 --batch-steps 6 --repeat 1 --profile \
  --out "$OUT/bench-small.json" >"$OUT/bench-small.txt" 2>&1 || { status=1; tail -n 20 "$OUT/bench-small.txt"; }
cat "$OUT/bench-small.txt" | grep -v "^bench:" | tee -a "$S"
if [ "${NCU:-0}" = 1 ]; then
  if command -v ncu >/dev/null; then
    echo "gpu-bench: ncu over decode steps (4 layers at the released widths, 512 experts, 8K context)" | tee -a "$S"
    timeout 200 ncu --clock-control none --print-units base --launch-skip "${NCU_SKIP:-1200}" --launch-count "${NCU_COUNT:-400}" --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size \
      "$G/bin/flashnext" bench --layers 4 --ple-rows 1000000 --prompts 64 --decode-context 8192 --decode-tokens 40 \
      --batches none --repeat 1 >"$OUT/ncu-decode.csv" 2>"$OUT/ncu-decode.log" ||
      { echo "gpu-bench: ncu failed" | tee -a "$S"; tail -n 5 "$OUT/ncu-decode.log" | tee -a "$S"; }
    echo "gpu-bench: ncu-decode.csv $(grep -c gpu__time_duration "$OUT/ncu-decode.csv") kernel launches" | tee -a "$S"
    python3 tools/ncu_summary.py "$OUT/ncu-decode.csv" >"$OUT/ncu-summary.txt" 2>&1 && cat "$OUT/ncu-summary.txt" | tee -a "$S"
  else
    echo "gpu-bench: ncu NOT run (not installed)" | tee -a "$S"
  fi
fi
# The released geometry holds 86.6 GB of GPU memory after build (docs/BENCHMARKS.md): on a smaller card (an H100)
# it is said and skipped unless BENCH_ARGS shrinks it (e.g. --experts 256); the device tool's needs_h200 gets an H200.
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
if [ "${FULL:-1}" != 0 ] && [ "${gpu_mib:-0}" -lt 100000 ] && [[ "${BENCH_ARGS:-}" != *--experts* ]] &&
  [[ "${BENCH_ARGS:-}" != *--layers* ]]; then
  echo "gpu-bench: the released geometry NOT run: it needs about 87 GB of GPU memory, this GPU has $gpu_mib MiB" \
    "(run on an H200, or shrink it with BENCH_ARGS=\"--experts 256 ...\")" | tee -a "$S"
  FULL=0
fi
if [ "$status" != 0 ] && [ "${FULL:-1}" != 0 ] && [ "${FULL_AFTER_FAILURE:-0}" = 1 ]; then
  echo "gpu-bench: a check above FAILED; the released geometry runs anyway (FULL_AFTER_FAILURE=1): its figures are" \
    "those of a build that failed a check" | tee -a "$S"
fi
if { [ "$status" = 0 ] || [ "${FULL_AFTER_FAILURE:-0}" = 1 ]; } && [ "${FULL:-1}" != 0 ]; then
  echo "gpu-bench: released geometry, default precision: flashnext bench --profile ${BENCH_ARGS:-}" | tee -a "$S"
  # shellcheck disable=SC2086
  timeout 420 "$G/bin/flashnext" bench --profile --repeat 2 ${BENCH_ARGS:-} --out "$OUT/bench-full.json" \
    >"$OUT/bench-full.txt" 2>&1 || { status=1; tail -n 20 "$OUT/bench-full.txt"; }
  grep -v "^bench:" "$OUT/bench-full.txt" | tee -a "$S"
  if [ "${FP16:-0}" = 1 ] && [ "$status" = 0 ]; then
    echo "gpu-bench: released geometry, FLASHNEXT_CUDA_ACTIVATIONS=fp16" | tee -a "$S"
    # shellcheck disable=SC2086
    FLASHNEXT_CUDA_ACTIVATIONS=fp16 timeout 420 "$G/bin/flashnext" bench --profile --repeat 1 ${BENCH_ARGS:-} \
      --out "$OUT/bench-full-fp16.json" >"$OUT/bench-full-fp16.txt" 2>&1 || { status=1; tail -n 20 "$OUT/bench-full-fp16.txt"; }
    grep -v "^bench:" "$OUT/bench-full-fp16.txt" | tee -a "$S"
  else
    echo "gpu-bench: the fp16 run NOT done (FP16=${FP16:-0}, status $status)" | tee -a "$S"
  fi
  baseline_bin="$G/bin/flashnext"
  [ -x "$G/bin/flashnext-baseline" ] && [ "${BASELINE:-1}" != 0 ] && baseline_bin="$G/bin/flashnext-baseline"
  if { [ -n "${BASELINE_ENV:-}" ] || [ "$baseline_bin" != "$G/bin/flashnext" ]; } && [ "$status" = 0 ]; then
    # The same bench once more under BASELINE_ENV (e.g. FLASHNEXT_CUDA_PDL=0) and/or with the baseline build packed by
    # --prepare BASELINE_BIN=..., on the same machine: before/after.
    echo "gpu-bench: released geometry again with ${BASELINE_ENV:-} $(basename "$baseline_bin") (the baseline)" | tee -a "$S"
    # shellcheck disable=SC2086
    env ${BASELINE_ENV:-} timeout 420 "$baseline_bin" bench --profile --repeat 2 ${BENCH_ARGS:-} \
      --out "$OUT/bench-full-baseline.json" >"$OUT/bench-full-baseline.txt" 2>&1 ||
      { status=1; tail -n 20 "$OUT/bench-full-baseline.txt"; }
    grep -v "^bench:" "$OUT/bench-full-baseline.txt" | tee -a "$S"
  fi
  baseline2_bin=$baseline_bin
  [ -x "$G/bin/flashnext-baseline2" ] && [ "${BASELINE:-1}" != 0 ] && baseline2_bin="$G/bin/flashnext-baseline2"
  if { [ -n "${BASELINE2_ENV:-}" ] || [ "$baseline2_bin" != "$baseline_bin" ]; } && [ "$status" = 0 ]; then
    # A second baseline: the build BASELINE2_BIN packed, or the baseline build once more under BASELINE2_ENV
    # (bench-full-baseline2.json).
    echo "gpu-bench: released geometry again with ${BASELINE2_ENV:-} $(basename "$baseline2_bin") (second baseline)" | tee -a "$S"
    # shellcheck disable=SC2086
    env ${BASELINE2_ENV:-} timeout 420 "$baseline2_bin" bench --profile --repeat 2 ${BENCH_ARGS:-} \
      --out "$OUT/bench-full-baseline2.json" >"$OUT/bench-full-baseline2.txt" 2>&1 ||
      { status=1; tail -n 20 "$OUT/bench-full-baseline2.txt"; }
    grep -v "^bench:" "$OUT/bench-full-baseline2.txt" | tee -a "$S"
  fi
  # One more run of this build per '|'-separated set of variables of ENV_VARIANTS (bench-full-variant-N.json, N from 1).
  IFS='|' read -r -a variants <<<"${ENV_VARIANTS:-}"
  n=0
  for v in "${variants[@]}"; do
    n=$((n + 1))
    [ "$status" = 0 ] || break
    echo "gpu-bench: released geometry again with $v (variant $n)" | tee -a "$S"
    # shellcheck disable=SC2086
    env $v timeout 420 "$G/bin/flashnext" bench --profile --repeat 2 ${BENCH_ARGS:-} \
      --out "$OUT/bench-full-variant-$n.json" >"$OUT/bench-full-variant-$n.txt" 2>&1 ||
      { status=1; tail -n 20 "$OUT/bench-full-variant-$n.txt"; }
    grep -v "^bench:" "$OUT/bench-full-variant-$n.txt" | tee -a "$S"
  done
else
  echo "gpu-bench: the released geometry NOT run (FULL=${FULL:-1}, status $status)" | tee -a "$S"
fi
exit $status
