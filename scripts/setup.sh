#!/usr/bin/env bash
# Installs flashnext's build dependencies (Debian packages), configures build/ and builds the `flashnext` CLI.
# Usage: bash scripts/setup.sh            (env: BUILD_DIR, CMAKE_CUDA_ARCHITECTURES, FLASHNEXT_CUDA=AUTO|ON|OFF)
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config git python3 python3-venv
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libboost-dev libcli11-dev libspdlog-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
args=(-G Ninja -DFLASHNEXT_CUDA="${FLASHNEXT_CUDA:-AUTO}")
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
# Rebuilds (other worktrees, build-asan, the GPU builds) reuse compiled objects when ccache is installed.
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" "${args[@]}" >/dev/null
# Only the CLI: the tests and benchmarks are built by scripts/test.sh, so the README's first command stays fast. Its
# progress goes to stderr: the README's first command's stdout is the generated text alone.
cmake --build "$BUILD_DIR" --target flashnext --parallel "$(nproc)" >&2
echo "setup: built $BUILD_DIR/flashnext" >&2
