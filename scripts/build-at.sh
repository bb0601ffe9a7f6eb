#!/usr/bin/env bash
# Builds `flashnext` as it was at an earlier commit, for the before of a before/after on the GPU machine
# (scripts/gpu-bench.sh --prepare with BASELINE_BIN / BASELINE2_BIN):
#
#   bash scripts/build-at.sh COMMIT [OUT]     OUT defaults to /tmp/flashnext-at/flashnext-<short commit>
#
# The commit is checked out into a git worktree under /tmp/flashnext-at (the working tree here is not touched) and
# configured like build-cudabe (sm_90, Release, ccache), so a second build of the same commit, or of a near one,
# is fast. Prints the binary's path. Env: ARCHS (default 90), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/build-at.sh COMMIT [OUT]" >&2; exit 2; }
commit=$(git rev-parse --short "$1^{commit}") || { echo "build-at: $1 is not a commit here" >&2; exit 2; }
root=/tmp/flashnext-at
out=${2:-$root/flashnext-$commit}
wt=$root/src-$commit
mkdir -p "$root"
[ -d "$wt" ] || git worktree add --detach "$wt" "$commit" >/dev/null
[ -f "$wt/build/CMakeCache.txt" ] ||
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHNEXT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-90}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
CCACHE_BASEDIR="$wt" cmake --build "$wt/build" --target flashnext --parallel "${JOBS:-2}" >/dev/null
mkdir -p "$(dirname "$out")"
cp "$wt/build/flashnext" "$out"
echo "$out"
