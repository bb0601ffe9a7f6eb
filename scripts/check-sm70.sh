#!/usr/bin/env bash
# SM70 proof for the baseline CUDA kernel set: compiles every src/ops/cuda/*.cu to V100 (sm_70) machine code with a
# CUDA 12.9 toolchain from PyPI, so that any instruction a V100 lacks (bf16 or fp8 arithmetic, cp.async, ldmatrix,
# newer mma shapes, ...) is a build error. The installed CUDA 13 cannot target sm_70, and the nvcc-cu12 wheel holds
# ptxas but no C++ front end, so the front end is CUDA 12.9's NVRTC: it compiles each file's device code with
# __CUDA_ARCH__ = 700 and assembles it with ptxas for sm_70 (host launchers are fenced off with __CUDACC_RTC__).
# Every kernel a file defines must come out as an sm_70 entry point.
# Usage: bash scripts/check-sm70.sh   (installs the wheels into build-sm70/venv on first use; needs python3 + PyPI)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build-sm70/venv
PKGS=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79
      nvidia-cuda-cccl-cu12==12.9.27)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import nvidia.cuda_nvrtc, nvidia.cuda_cccl, nvidia.cuda_runtime' 2>/dev/null; then
  echo "check-sm70: installing ${PKGS[*]} into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${PKGS[@]}"
fi
exec "$VENV/bin/python" - src/ops/cuda/*.cu <<'PY'
import ctypes, os, re, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
nv = os.path.join(site, "nvidia")
lib = ctypes.CDLL(os.path.join(nv, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
incs = ["src", os.path.join(nv, "cuda_runtime", "include"), os.path.join(nv, "cuda_cccl", "include"),
        os.path.join(nv, "cuda_nvcc", "include")]
opts = [b"--gpu-architecture=sm_70", b"-std=c++17",
        b"--device-as-default-execution-space", b"--diag-suppress=177"] + [b"-I" + i.encode() for i in incs]
ver = (ctypes.c_int(), ctypes.c_int())
lib.nvrtcVersion(ctypes.byref(ver[0]), ctypes.byref(ver[1]))
print(f"check-sm70: NVRTC {ver[0].value}.{ver[1].value}, target sm_70")

def call(name, *args):
    return getattr(lib, name)(*args)

failed = 0
for src in sys.argv[1:]:
    code = open(src, "rb").read()
    prog = ctypes.c_void_p()
    call("nvrtcCreateProgram", ctypes.byref(prog), code, src.encode(), 0, None, None)
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = call("nvrtcCompileProgram", prog, len(opts), arr)
    n = ctypes.c_size_t()
    call("nvrtcGetProgramLogSize", prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    call("nvrtcGetProgramLog", prog, log)
    text = log.value.decode(errors="replace").strip()
    text = "\n".join(l for l in text.splitlines() if "Architectures prior to" not in l).strip()
    if rc != 0:
        print(f"FAIL {src}: NVRTC error {rc}\n{text}")
        failed += 1
        continue
    call("nvrtcGetCUBINSize", prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    call("nvrtcGetCUBIN", prog, cubin)
    call("nvrtcGetPTXSize", prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    call("nvrtcGetPTX", prog, ptx)
    entries = re.findall(r"\.entry\s+(\S+)\(", ptx.value.decode())
    kernels = re.findall(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?(?:void\s+)?(\w+)\s*\(", code.decode())
    missing = [k for k in kernels if not any(k in e for e in entries)]
    if missing:
        print(f"FAIL {src}: kernels not compiled for sm_70: {missing}")
        failed += 1
        continue
    print(f"ok   {src}: {len(entries)} sm_70 kernels, {len(cubin.raw)} bytes of cubin" + (f"\n{text}" if text else ""))
    call("nvrtcDestroyProgram", ctypes.byref(prog))
if failed:
    print(f"check-sm70: {failed} file(s) failed")
    sys.exit(1)
print(f"check-sm70: all {len(sys.argv) - 1} kernel files build for sm_70")
PY
