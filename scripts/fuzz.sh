#!/usr/bin/env bash
# Builds the fuzz targets of `flashnext serve` with clang's libFuzzer under AddressSanitizer + UBSan into
# ${FUZZ_DIR:-build-fuzz}/ and runs each for FUZZ_SECONDS (default 60) from its seed corpus:
#   request_parser_fuzz (tests/fuzz/request_parser_fuzz.cpp): a request body through the OpenAI request parsers;
#   http_request_fuzz (tests/fuzz/http_request_fuzz.cpp): raw bytes through the HTTP layer's request reader
#     (Boost.Beast's parser and our limits), the header checks and the body parsers, pipelined requests included.
# The corpus a target grows stays in build-fuzz/<target>-corpus. A finding stops it with a non-zero status and
# leaves the input as build-fuzz/crash-* (replay: build-fuzz/<target> FILE).
#   scripts/fuzz.sh [TARGET...]     (default: both; env: FUZZ_SECONDS, FUZZ_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
# clang + compiler-rt (libFuzzer) only for these targets: the README's first command does not need them.
if ! command -v clang++ >/dev/null 2>&1 || ! dpkg -s libclang-rt-dev >/dev/null 2>&1; then
  echo "fuzz: installing clang libclang-rt-dev" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
out=${FUZZ_DIR:-build-fuzz}
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
       -Isrc -DBOOST_BEAST_USE_STD_STRING_VIEW -DBOOST_ASIO_NO_DEPRECATED -pthread)
# Only the parsers and what they call: the schema checks, the engine's sampling-parameter validation, and for the
# HTTP target the request reader and the header policies.
common=(src/server/openai_schema.cpp src/engine/sampling.cpp)
declare -A sources=(
  [request_parser_fuzz]="tests/fuzz/request_parser_fuzz.cpp src/server/responses_api.cpp"
  [http_request_fuzz]="tests/fuzz/http_request_fuzz.cpp src/server/http_request_reader.cpp src/server/http_policy.cpp"
)
declare -A corpus=([request_parser_fuzz]=tests/fuzz/corpus [http_request_fuzz]=tests/fuzz/http_corpus)
declare -A dict=([request_parser_fuzz]=tests/fuzz/json.dict [http_request_fuzz]=tests/fuzz/http.dict)
targets=("$@")
((${#targets[@]})) || targets=(request_parser_fuzz http_request_fuzz)
for t in "${targets[@]}"; do
  [ -n "${sources[$t]:-}" ] || { echo "fuzz: no target $t" >&2; exit 2; }
  # shellcheck disable=SC2086
  clang++ "${flags[@]}" $(pkg-config --cflags fmt) ${sources[$t]} "${common[@]}" -o "$out/$t" $(pkg-config --libs fmt)
  mkdir -p "$out/$t-corpus"
  cp "${corpus[$t]}"/* "$out/$t-corpus/"
  echo "fuzz: running $t for ${FUZZ_SECONDS:-60} s" >&2
  (cd "$out" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "./$t" -max_total_time="${FUZZ_SECONDS:-60}" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
    -dict="../${dict[$t]}" -print_final_stats=1 "$t-corpus")
done
