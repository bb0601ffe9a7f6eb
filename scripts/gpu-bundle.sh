# Shared by the GPU scripts (gpu-e2e.sh, gpu-serve.sh, gpu-bench.sh): pack built binaries here, unpack them on the GPU
# machine. Sourced, not run.

# pack_bundle BUNDLE BINARY...: the binaries (stripped) with the shared libraries the GPU machine (Ubuntu 24.04, CUDA
# 13) lacks or has in other versions (fmt, spdlog, PCRE2, utf8proc, CUPTI; cudart is static, Boost is header-only,
# cuBLAS is there), and the source folder the tests have baked in (FLASHNEXT_SOURCE_DIR), into BUNDLE (.tar.xz).
pack_bundle() {
  local bundle=$1 stage bin
  shift
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$@" "$stage/bin/"
  strip "$stage"/bin/*
  for bin in "$stage"/bin/*; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
    grep -E 'lib(fmt|spdlog|pcre2-8|utf8proc|cupti)\.so' | while read -r lib; do
      cp -L "$lib" "$stage/lib/"
    done
  pwd >"$stage/source_dir"
  mkdir -p "$(dirname "$bundle")"
  XZ_OPT=-9 tar -C "$stage" -cJf "$bundle" .  # one 64 MiB window: the binaries share most of their bytes
  rm -rf "$stage"
}

# unpack_bundle BUNDLE NAME: unpacks BUNDLE into a fresh folder whose path it sets in G, puts its libraries on
# LD_LIBRARY_PATH and links the baked-in source folder to this checkout. Exits 2 naming the missing bundle.
unpack_bundle() {
  local bundle=$1 name=$2 src
  G=$(mktemp -d "/tmp/flashnext-$name.XXXX")
  tar -C "$G" -xJf "$bundle" || { echo "$name: no $bundle: run --prepare first" >&2; exit 2; }
  export LD_LIBRARY_PATH="$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  src=$(cat "$G/source_dir")
  if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
}
