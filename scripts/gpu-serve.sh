#!/usr/bin/env bash
# Batched steps and serving on the GPU in one repeatable command: the batch tests of the CUDA backend (8 sequences
# in one step = each alone, tiny-a and the medium fixture), the rest of test_cuda_e2e, then `flashnext serve
# --device cuda` on the medium fixture driven by tools/bench_serve.py at concurrency 1, 8 and 32, and optionally
# (PREFIX=1) the multi-turn chat benchmark of prefix caching (tools/bench_multiturn.py) with the cache off and on.
#
#   bash scripts/gpu-serve.sh --prepare   HERE: builds `flashnext` and `test_cuda_e2e` in $BUILD (default build,
#                                         which must be configured for the GPU's architecture, e.g. 90) and packs
#                                         them with the shared libraries the GPU machine lacks into
#                                         gpu/serve/bundle.tar.xz (gpu/ is git-ignored), and cuts the bundled
#                                         tokenizer to 4096 ids into gpu/serve/tokenizer-4096 (so that the run
#                                         needs no models/tiny-b-random/tokenizer.json there).
#   bash scripts/gpu-serve.sh             ON THE GPU MACHINE from the repo root (the `run` tool: carry ["gpu"]).
# The medium fixture (tools/make_fixtures.py, torch + transformers there) has vocab_size 4096 and no tokenizer: the
# server gets the bundled Qwen3 tokenizer cut to 4096 ids (tools/truncate_tokenizer.py).
# Output in $OUT (default gpu/out-serve): e2e.log, e2e-medium.log, fixture.log, serve.log, bench.log, summary.txt
# (which ends with `NOT RUN:` lines naming each part that did not run and why, or `NOT RUN: nothing`).
# Env: BUILD, FIXTURE_DIR (default /tmp/fx), E2E=0 to skip the tests, BENCH_ARGS (extra bench_serve.py arguments),
#      SERVE_ARGS (extra `flashnext serve` arguments, e.g. --sampler host), BUNDLE (default gpu/serve/bundle.tar.xz;
#      gpu-bench.sh's bundle has the same binaries), SERVE_BENCH=0 skips bench_serve.py, PREFIX=1 adds the multi-turn
#      runs (the cache off, then on with each --prefix-cache-snapshot-interval of PREFIX_INTERVALS, default
#      "4 16 64"; MULTITURN_ARGS: extra bench_multiturn.py arguments) into $OUT/multiturn.log; MAX_MODEL_LEN
#      (default 4096) for every server; SPEC=1 adds `serve --speculative` against the server without it
#      (tools/check_spec_serve.py: tiny-a ngram:4, tiny-mtp mtp:3 and ngram:4, with the tokenizers --prepare cut to
#      their vocabularies in gpu/serve/tok-N) into $OUT/spec.log; RELEASED=1 adds the released geometry with dummy
#      weights (models/release/config.json, `serve --load-format dummy --hf-overrides '{"num_experts": N}'`, N =
#      RELEASED_EXPERTS, default 512 on a GPU of 100 GB or more, else 256, with the 4096-id tokenizer) driven at
#      concurrency 1 with 8,192-token prompts and 256 output tokens, beside `flashnext bench`'s batch-1 decode at the
#      same geometry and context (issue 13: serve's per-token latency for one stream against bench's step) into
#      $OUT/released.log.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-bundle.sh
BUILD=${BUILD:-build}
BUNDLE=${BUNDLE:-gpu/serve/bundle.tar.xz}
TOKENIZER=gpu/serve/tokenizer-4096

if [ "${1:-}" = "--prepare" ]; then
  set -e
  cmake --build "$BUILD" --target flashnext test_cuda_e2e --parallel 2
  pack_bundle "$BUNDLE" "$BUILD/flashnext" "$BUILD/tests/test_cuda_e2e"
  python3 tools/truncate_tokenizer.py models/tiny-b-random "$TOKENIZER" 4096
  for n in 512 1024; do python3 tools/truncate_tokenizer.py models/tiny-b-random gpu/serve/tok-$n $n; done
  echo "gpu-serve: packed $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); run: bash scripts/gpu-serve.sh"
  exit 0
fi

OUT=${OUT:-gpu/out-serve}
mkdir -p "$OUT"
unpack_bundle "$BUNDLE" gpu-serve
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
notrun=()  # the parts that did not run, each with its reason: listed in the summary
[ "${E2E:-1}" = 0 ] && notrun+=("test_cuda_e2e (all, medium included): E2E=0")
FX=${FIXTURE_DIR:-/tmp/fx}
fx_pid=""
# The medium fixture serves the tests, the serving benchmark and the multi-turn runs; RELEASED and SPEC need none.
need_fx=$([ "${E2E:-1}" != 0 ] || [ "${SERVE_BENCH:-1}" != 0 ] || [ "${PREFIX:-0}" = 1 ] && echo 1 || echo 0)
if [ "$need_fx" = 1 ] && [ ! -f "$FX/medium/reference.safetensors" ]; then
  (PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py "$FX" medium >"$OUT/fixture.log" 2>&1) &
  fx_pid=$!
fi
if [ "${E2E:-1}" != 0 ]; then
  echo "gpu-serve: test_cuda_e2e without the medium tests"
  timeout 240 "$G/bin/test_cuda_e2e" --gtest_color=no --gtest_filter='-*Medium*' >"$OUT/e2e.log" 2>&1 || status=1
  tail -n 3 "$OUT/e2e.log"
fi
if [ -n "$fx_pid" ]; then
  wait "$fx_pid" || { echo "gpu-serve: make_fixtures.py medium failed"; tail -n 20 "$OUT/fixture.log"; exit 1; }
fi
if [ "${E2E:-1}" != 0 ]; then
  echo "gpu-serve: medium fixture tests"
  FLASHNEXT_MEDIUM_FIXTURE="$FX/medium" timeout 200 "$G/bin/test_cuda_e2e" --gtest_color=no \
    --gtest_filter='*Medium*' >"$OUT/e2e-medium.log" 2>&1 || status=1
  tail -n 3 "$OUT/e2e-medium.log"
fi

if [ "$need_fx" = 0 ]; then
  :
elif [ -f "$TOKENIZER/tokenizer.json" ]; then
  cp "$TOKENIZER"/* "$FX/medium/model/"
else
  python3 tools/truncate_tokenizer.py models/tiny-b-random "$FX/medium/model" 4096
fi
port=8011
get() { python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
# start_server LOG ARGS...: `flashnext serve` on the medium fixture in the background (pid in srv); waits for
# /health, returns 1 if the server does not come up.
start_server() {
  local log=$1
  shift
  "$G/bin/flashnext" serve --device cuda --model "${SERVE_MODEL:-$FX/medium/model}" --port $port \
    --served-model-name "${SERVE_NAME:-medium}" --max-model-len "${MAX_MODEL_LEN:-4096}" "$@" >"$log" 2>&1 &
  srv=$!
  for _ in $(seq 1 "${SERVE_WAIT:-120}"); do
    get "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 $srv 2>/dev/null || break
    sleep 1
  done
  get "http://127.0.0.1:$port/health" >/dev/null 2>&1
}
if [ "${SERVE_BENCH:-1}" = 0 ]; then
  notrun+=("bench_serve.py: SERVE_BENCH=0")
# shellcheck disable=SC2086
elif start_server "$OUT/serve.log" ${SERVE_ARGS:-}; then
  echo "\$ flashnext serve --device cuda --model <medium> --port $port --served-model-name medium --max-model-len 4096 ${SERVE_ARGS:-}" \
    >"$OUT/bench.log"
  echo "\$ python3 tools/bench_serve.py --url http://127.0.0.1:$port --concurrency 1 8 32 --num-requests 32 --vocab-size 4096 ${BENCH_ARGS:-}" \
    >>"$OUT/bench.log"
  # shellcheck disable=SC2086
  timeout 300 python3 tools/bench_serve.py --url "http://127.0.0.1:$port" --concurrency 1 8 32 --num-requests 32 \
    --vocab-size 4096 ${BENCH_ARGS:-} >>"$OUT/bench.log" 2>&1 || status=1
  get "http://127.0.0.1:$port/metrics" | grep -E '^flashnext_(kv|num|engine|generation|prompt)' >>"$OUT/bench.log"
  cat "$OUT/bench.log"
else
  echo "gpu-serve: the server did not come up:"; tail -n 20 "$OUT/serve.log"; status=1
  notrun+=("serving benchmark: the server did not come up")
fi
if [ "${SERVE_BENCH:-1}" != 0 ]; then
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  grep -E 'GPU memory|memory [0-9]+ bytes' "$OUT/serve.log" >>"$OUT/bench.log"
fi
if [ "${PREFIX:-0}" = 1 ]; then
  # Multi-turn chat TTFT, prefix cache off and on (issue 19); one server per setting, the same conversations.
  : >"$OUT/multiturn.log"
  for n in off ${PREFIX_INTERVALS:-4 16 64}; do
    args=(--no-enable-prefix-caching)
    [ "$n" != off ] && args=(--enable-prefix-caching --prefix-cache-snapshot-interval "$n")
    if start_server "$OUT/serve-prefix-$n.log" "${args[@]}"; then
      # shellcheck disable=SC2086
      cmd="python3 tools/bench_multiturn.py --url http://127.0.0.1:$port --conversations 4 --turns 8 --user-words 120 --output-len 32 ${MULTITURN_ARGS:-}"
      { echo "\$ flashnext serve --device cuda --model <medium> --max-model-len ${MAX_MODEL_LEN:-4096} ${args[*]}"; echo "\$ $cmd"; } >>"$OUT/multiturn.log"
      timeout 300 $cmd >>"$OUT/multiturn.log" 2>&1 || status=1
      get "http://127.0.0.1:$port/metrics" | grep -E '^flashnext_prefix_cache' >>"$OUT/multiturn.log"
      grep -E 'GPU memory|memory [0-9]+ bytes|snapshot' "$OUT/serve-prefix-$n.log" >>"$OUT/multiturn.log"
    else
      echo "gpu-serve: the server ($n) did not come up:"; tail -n 20 "$OUT/serve-prefix-$n.log"; status=1
      notrun+=("multi-turn $n: the server did not come up")
    fi
    kill $srv 2>/dev/null; wait $srv 2>/dev/null
  done
  cat "$OUT/multiturn.log"
else
  notrun+=("multi-turn prefix-cache runs: PREFIX=0")
fi
if [ "${SPEC:-0}" = 1 ]; then
  : >"$OUT/spec.log"
  for run in "tiny-a 1024 ngram:4" "tiny-mtp 512 mtp:3" "tiny-mtp 512 ngram:4"; do
    read -r fx n spec <<<"$run"
    d=$(mktemp -d "/tmp/spec-$fx.XXXX")
    cp tests/data/fixtures/$fx/model/* "$d/"
    cp gpu/serve/tok-$n/* "$d/" 2>/dev/null || python3 tools/truncate_tokenizer.py models/tiny-b-random "$d" "$n"
    echo "\$ python3 tools/check_spec_serve.py flashnext <$fx + tokenizer cut to $n> $spec cuda" >>"$OUT/spec.log"
    timeout 200 python3 tools/check_spec_serve.py "$G/bin/flashnext" "$d" "$spec" cuda >>"$OUT/spec.log" 2>&1 || status=1
  done
  grep -E '^\$|RESULT|spec metrics' "$OUT/spec.log"
else
  notrun+=("serve --speculative check: SPEC=0")
fi
if [ "${RELEASED:-0}" = 1 ]; then
  : >"$OUT/released.log"
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  experts=${RELEASED_EXPERTS:-$([ "${gpu_mib:-0}" -ge 100000 ] && echo 512 || echo 256)}
  d=$(mktemp -d /tmp/released.XXXX)
  cp models/release/config.json "$d/"
  cp "$TOKENIZER"/* "$d/" 2>/dev/null || python3 tools/truncate_tokenizer.py models/tiny-b-random "$d" 4096
  cmd="flashnext bench --experts $experts --prompts none --batches none --decode-context 8192 --decode-tokens 256"
  echo "\$ $cmd" >>"$OUT/released.log"
  # shellcheck disable=SC2086
  timeout 420 "$G/bin/"$cmd --out "$OUT/released-bench.json" >>"$OUT/released.log" 2>&1 || status=1
  if SERVE_MODEL=$d SERVE_NAME=released MAX_MODEL_LEN=9216 SERVE_WAIT=400 start_server "$OUT/serve-released.log" \
    --load-format dummy --hf-overrides "{\"num_experts\": $experts}" --max-num-seqs 8; then
    bcmd="python3 tools/bench_serve.py --url http://127.0.0.1:$port --concurrency 1 --num-requests 4 --input-len 8192 --output-len 256 --vocab-size 4096"
    { echo "\$ flashnext serve --device cuda --model <models/release/config.json + the 4096-id tokenizer> --load-format dummy --hf-overrides '{\"num_experts\": $experts}' --max-model-len 9216 --max-num-seqs 8"
      echo "\$ $bcmd"; } >>"$OUT/released.log"
    # shellcheck disable=SC2086
    timeout 400 $bcmd >>"$OUT/released.log" 2>&1 || status=1
  else
    echo "gpu-serve: the released-geometry server did not come up:"; tail -n 20 "$OUT/serve-released.log"; status=1
    notrun+=("released geometry serving: the server did not come up")
  fi
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  grep -E 'GPU memory|memory [0-9]+ bytes' "$OUT/serve-released.log" >>"$OUT/released.log"
  cat "$OUT/released.log"
else
  notrun+=("released geometry serving (dummy weights) against bench: RELEASED=0")
fi
{
  grep -h -E '^\[  (PASSED|FAILED) |tests? ran|^E2E:' "$OUT"/e2e.log "$OUT"/e2e-medium.log 2>/dev/null
  cat "$OUT/bench.log" "$OUT/multiturn.log" "$OUT/spec.log" "$OUT/released.log" 2>/dev/null
} >"$OUT/summary.txt"
if ((${#notrun[@]})); then printf 'NOT RUN: %s\n' "${notrun[@]}"; else echo "NOT RUN: nothing (every part ran)"; fi |
  tee -a "$OUT/summary.txt"
echo "gpu-serve: exit status $status (logs in $OUT)"
exit $status
