#!/usr/bin/env bash
# Builds the request-parser fuzz target (tests/fuzz/request_parser_fuzz.cpp) with clang's libFuzzer under
# AddressSanitizer + UBSan into ${FUZZ_DIR:-build-fuzz}/ and runs it for FUZZ_SECONDS (default 60) from the seed
# corpus in tests/fuzz/corpus (the corpus it grows stays in build-fuzz/corpus). A finding stops it with a non-zero
# status and leaves the input as build-fuzz/crash-* (replay: build-fuzz/request_parser_fuzz FILE).
#   scripts/fuzz.sh                 (env: FUZZ_SECONDS, FUZZ_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
# clang + compiler-rt (libFuzzer) only for this target: the README's first command does not need them.
if ! command -v clang++ >/dev/null 2>&1 || ! dpkg -s libclang-rt-dev >/dev/null 2>&1; then
  echo "fuzz: installing clang libclang-rt-dev" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
out=${FUZZ_DIR:-build-fuzz}
mkdir -p "$out/corpus"
# Only the parser and what it calls: the schema checks and the engine's sampling-parameter validation.
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer -Isrc $(pkg-config --cflags fmt) \
  tests/fuzz/request_parser_fuzz.cpp src/server/openai_schema.cpp src/engine/sampling.cpp \
  -o "$out/request_parser_fuzz" $(pkg-config --libs fmt)
cp tests/fuzz/corpus/* "$out/corpus/"
cd "$out"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ./request_parser_fuzz -max_total_time="${FUZZ_SECONDS:-60}" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
  -dict=../tests/fuzz/json.dict -print_final_stats=1 corpus
