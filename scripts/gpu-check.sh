#!/usr/bin/env bash
# Builds and runs the W4A16 kernel tests (test_cuda) and their benchmark (bench_moe_w4a16) on a machine with a GPU,
# from tests/cuda/CMakeLists.txt: a standalone build that needs only CUDA, cuBLAS, a C++ compiler, CMake and
# GoogleTest + fmt headers (carried as source when the machine lacks them).
#   bash scripts/gpu-check.sh --prepare   here (no GPU needed): copies GoogleTest's source and fmt's headers from the
#                                         Debian packages into build-cuda/gpu-deps, to carry to the GPU machine
#   bash scripts/gpu-check.sh             on the GPU machine: configure, build, run the tests, then the benchmark
# Env: GPU_BUILD_DIR (default build-gpu), CUDA_ARCH (default 90), GPU_DEPS (default build-cuda/gpu-deps),
#      BENCH=0 to skip the benchmark, TEST_FILTER=<gtest filter> to run only
#      those tests, SANITIZE_FILTER=<gtest filter> to also run those tests under
#      compute-sanitizer memcheck, OUT (if set, logs are copied there).
# Exit status: non-zero if the build or any test fails (the benchmark's status is reported, not fatal).
# The whole GPU check (these kernel tests, the ops-interface backend and the model end to end): scripts/gpu-e2e.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${GPU_DEPS:-build-cuda/gpu-deps}

if [ "${1:-}" = "--prepare" ]; then
  rm -rf "$DEPS" && mkdir -p "$DEPS/fmt"
  cp -r /usr/src/googletest "$DEPS/googletest"
  cp -r /usr/include/fmt "$DEPS/fmt/fmt"
  echo "gpu-check: prepared $DEPS ($(du -sh "$DEPS" | cut -f1))"
  exit 0
fi

BUILD=${GPU_BUILD_DIR:-build-gpu}
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}")
[ -d "$DEPS/googletest" ] && args+=(-DGTEST_SOURCE_DIR="$PWD/$DEPS/googletest")
[ -d "$DEPS/fmt/fmt" ] && args+=(-DFMT_INCLUDE_DIR="$PWD/$DEPS/fmt")
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S tests/cuda -B "$BUILD" "${args[@]}" >/dev/null
cmake --build "$BUILD" --parallel "$(nproc)"
status=0
"$BUILD/test_cuda" --gtest_color=no ${TEST_FILTER:+--gtest_filter="$TEST_FILTER"} 2>&1 | tee "$BUILD/test.log" ||
  status=$?
if [ -n "${SANITIZE_FILTER:-}" ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/test_cuda" --gtest_color=no \
    --gtest_filter="$SANITIZE_FILTER" 2>&1 | tail -n 30 | tee "$BUILD/sanitizer.log" || status=$?
fi
if [ "${BENCH:-1}" != 0 ]; then
  "$BUILD/bench_moe_w4a16" 2>&1 | tee "$BUILD/bench_w4a16.md" || echo "gpu-check: bench_moe_w4a16 failed" >&2
fi
if [ -n "${OUT:-}" ]; then cp "$BUILD"/test.log "$OUT"/ 2>/dev/null || true; cp "$BUILD"/bench.md "$BUILD"/bench_w4a16.md "$OUT"/ 2>/dev/null || true
  cp "$BUILD"/sanitizer.log "$OUT"/ 2>/dev/null || true; fi
echo "gpu-check: test_cuda exit status $status"
exit $status
