#!/usr/bin/env bash
# The whole GPU check of the CUDA backend (src/ops/cuda) in one repeatable command: kernel tests, the ops interface
# op by op against the CPU oracle, the model end to end against the tiny-a, tiny-b and medium reference fixtures,
# and `flashnext logits/generate --device cuda` timings.
#
#   bash scripts/gpu-e2e.sh --prepare   HERE (no GPU needed): builds `flashnext`, `test_cuda` (kernels) and
#                                       `test_cuda_e2e` in $BUILD (default build-cudabe, configured with
#                                       -DFLASHNEXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 if absent) and packs them,
#                                       stripped, with the shared libraries the GPU machine lacks (fmt, spdlog, PCRE2,
#                                       utf8proc) into gpu/bundle.tar.xz (gpu/ is git-ignored).
#   bash scripts/gpu-e2e.sh             ON THE GPU MACHINE from the repo root, with gpu/ carried (the `run` tool:
#                                       carry ["gpu"]): unpacks the bundle, makes the medium fixture with
#                                       tools/make_fixtures.py (torch + transformers there; about a minute, in the
#                                       background) while test_cuda and the tiny-a/tiny-b tests run, then the medium
#                                       tests and the timings.
# Output: logs in $OUT (default gpu/out): kernel.log, e2e.log, e2e-medium.log, fixture.log, bench.log, and
# summary.txt (gtest verdicts, every `E2E:` line, the timing lines, and `NOT RUN:` lines naming each part that did
# not run and why; `NOT RUN: nothing` when every part ran).
# Env: BUILD; FIXTURE_DIR (default /tmp/fx; an existing $FIXTURE_DIR/medium/reference.safetensors is reused);
#      SKIP_MEDIUM=1 to skip the medium fixture; BENCH=0 to skip the timings; FILTER='<gtest filter>' to run only
#      those test_cuda_e2e tests (no kernel tests, medium fixture or timings; log $OUT/e2e.log).
# Exit status: non-zero when a build (prepare), a test or the fixture generation fails.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
BUILD=${BUILD:-build-cudabe}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  [ -f "$BUILD/CMakeCache.txt" ] ||
    cmake -S . -B "$BUILD" -G Ninja -DFLASHNEXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$BUILD" --target flashnext test_cuda test_cuda_e2e test_ops --parallel 2
  pack_bundle gpu/bundle.tar.xz "$BUILD/flashnext" "$BUILD/tests/test_cuda" "$BUILD/tests/test_cuda_e2e" \
    "$BUILD/tests/test_ops"
  echo "gpu-e2e: packed gpu/bundle.tar.xz ($(du -h gpu/bundle.tar.xz | cut -f1)); run: bash scripts/gpu-e2e.sh"
  exit 0
fi

OUT=${OUT:-gpu/out}
mkdir -p "$OUT"
unpack_bundle gpu/bundle.tar.xz gpu-e2e
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
notrun=()  # the parts that did not run, each with its reason: listed in the summary
# Appends the NOT RUN lines to the summary and prints them.
report_not_run() {
  if ((${#notrun[@]})); then printf 'NOT RUN: %s\n' "${notrun[@]}"; else echo "NOT RUN: nothing (every part ran)"; fi |
    tee -a "$OUT/summary.txt"
}
if [ -n "${FILTER:-}" ]; then
  echo "gpu-e2e: test_cuda_e2e --gtest_filter='$FILTER'"
  timeout 450 "$G/bin/test_cuda_e2e" --gtest_color=no --gtest_filter="$FILTER" >"$OUT/e2e.log" 2>&1 || status=1
  grep -h -E '^\[  (PASSED|FAILED) |tests? ran|^E2E' "$OUT/e2e.log" >"$OUT/summary.txt"
  tail -n 3 "$OUT/e2e.log"
  notrun=("kernel tests (test_cuda): FILTER set" "test_cuda_e2e tests outside --gtest_filter='$FILTER'"
          "timings: FILTER set")
  [ -z "${FLASHNEXT_MEDIUM_FIXTURE:-}" ] && notrun+=("medium fixture tests: FILTER set, FLASHNEXT_MEDIUM_FIXTURE unset")
  report_not_run
  echo "gpu-e2e: exit status $status (logs in $OUT)"
  exit $status
fi
FX=${FIXTURE_DIR:-/tmp/fx}
fx_pid=""
if [ -z "${SKIP_MEDIUM:-}" ] && [ ! -f "$FX/medium/reference.safetensors" ]; then
  (PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py "$FX" medium >"$OUT/fixture.log" 2>&1) &
  fx_pid=$!
fi

echo "gpu-e2e: kernel tests (test_cuda)"
timeout 150 "$G/bin/test_cuda" --gtest_color=no >"$OUT/kernel.log" 2>&1 || status=1
tail -n 3 "$OUT/kernel.log"
for prec in fp16x2 fp16; do
  echo "gpu-e2e: every op against the CPU oracle (test_ops, FLASHNEXT_TEST_PRECISION=$prec)"
  FLASHNEXT_TEST_BACKEND=cuda FLASHNEXT_TEST_PRECISION=$prec timeout 300 "$G/bin/test_ops" --gtest_color=no \
    >"$OUT/ops-$prec.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED) " "$OUT/ops-$prec.log"
done
echo "gpu-e2e: ops interface and tiny fixtures (test_cuda_e2e)"
timeout 200 "$G/bin/test_cuda_e2e" --gtest_color=no --gtest_filter='-*Medium*' >"$OUT/e2e.log" 2>&1 || status=1
tail -n 3 "$OUT/e2e.log"

if [ -z "${SKIP_MEDIUM:-}" ]; then
  if [ -n "$fx_pid" ]; then
    wait "$fx_pid" || { status=1; echo "gpu-e2e: make_fixtures.py medium failed:"; tail -n 20 "$OUT/fixture.log"; }
  fi
  if [ -f "$FX/medium/reference.safetensors" ]; then
    echo "gpu-e2e: medium fixture (test_cuda_e2e)"
    FLASHNEXT_MEDIUM_FIXTURE="$FX/medium" timeout 240 "$G/bin/test_cuda_e2e" --gtest_color=no \
      --gtest_filter='*Medium*' >"$OUT/e2e-medium.log" 2>&1 || status=1
    tail -n 3 "$OUT/e2e-medium.log"
  else
    notrun+=("medium fixture tests (6) and medium timings: no $FX/medium/reference.safetensors (see fixture.log)")
    status=1
  fi
else
  notrun+=("medium fixture tests (6) and medium timings: SKIP_MEDIUM set")
fi

if [ "${BENCH:-1}" != 0 ]; then
  echo "gpu-e2e: timings" | tee "$OUT/bench.log"
  if [ -f "$FX/medium/reference.safetensors" ]; then
    ids=$(python3 -c "
from safetensors.numpy import load_file
print(','.join(str(int(i)) for i in load_file('$FX/medium/reference.safetensors')['long.input_ids']))")
    for act in fp16x2 fp16; do
      echo "\$ FLASHNEXT_CUDA_ACTIVATIONS=$act flashnext logits --device cuda --model $FX/medium/model --ids <medium long.input_ids, 3000> --out /tmp/medium-long-$act.npy --warmup --greedy 65" >>"$OUT/bench.log"
      FLASHNEXT_CUDA_ACTIVATIONS=$act timeout 150 "$G/bin/flashnext" logits --device cuda --model "$FX/medium/model" \
        --ids "$ids" --out "/tmp/medium-long-$act.npy" --warmup --greedy 65 >>"$OUT/bench.log" 2>&1 || status=1
    done
    echo "\$ flashnext logits --device cpu --model $FX/medium/model --ids <the same> --out /tmp/medium-long-cpu.npy" >>"$OUT/bench.log"
    timeout 200 "$G/bin/flashnext" logits --device cpu --model "$FX/medium/model" --ids "$ids" \
      --out /tmp/medium-long-cpu.npy >>"$OUT/bench.log" 2>&1 || echo "gpu-e2e: the CPU run did not finish" >>"$OUT/bench.log"
    # Each run's logits against the reference (the CPU oracle's error is the scale of "exact" at this length).
    python3 - "$FX/medium/reference.safetensors" >>"$OUT/bench.log" 2>&1 <<'PY'
import os, sys, numpy as np
from safetensors.numpy import load_file
ref = load_file(sys.argv[1])["long.logits"]
for name in ("fp16x2", "fp16", "cpu"):
    path = f"/tmp/medium-long-{name}.npy"
    if not os.path.exists(path):
        continue
    got = np.load(path)
    d = np.abs(got - ref)
    print(f"COMPARE: medium long, {name}: max|dlogit| {d.max():.3e} (reference scale {np.abs(ref).max():.3f}), "
          f"argmax differences {int((got.argmax(-1) != ref.argmax(-1)).sum())} of {ref.shape[0]}")
PY
  fi
  gen=("$G/bin/flashnext" generate --model models/tiny-b-random --device cuda --raw --prompt "The quick brown fox jumps over the lazy dog."
    --max-tokens 128 --temperature 0 --ignore-eos)
  echo "\$ flashnext generate --model models/tiny-b-random --device cuda --raw --prompt 'The quick brown fox jumps over the lazy dog.' --max-tokens 128 --temperature 0 --ignore-eos" >>"$OUT/bench.log"
  timeout 60 "${gen[@]}" >/dev/null 2>>"$OUT/bench.log" || status=1
  cat "$OUT/bench.log"
else
  notrun+=("timings: BENCH=0")
fi

{
  grep -h -E '^\[  (PASSED|FAILED) |tests? ran|^E2E:' "$OUT"/kernel.log "$OUT"/e2e.log "$OUT"/e2e-medium.log 2>/dev/null
  grep -h -E 'tokens/s|wrote|loaded|greedy:|COMPARE:|^\$' "$OUT/bench.log" 2>/dev/null | cut -c1-400
} >"$OUT/summary.txt"
report_not_run
echo "gpu-e2e: exit status $status (logs in $OUT)"
exit $status
