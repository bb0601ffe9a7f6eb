#!/usr/bin/env python3
"""CUDA compiler launcher that makes nvcc 13 emit compute_70 (V100) PTX, for the JIT run of issue 12.

CUDA 13 dropped Volta: `nvcc -gencode arch=compute_70,code=compute_70` fails ("Unsupported gpu architecture") and
its cicc refuses `-arch compute_70`. This launcher (CMAKE_CUDA_COMPILER_LAUNCHER, with CMAKE_CUDA_ARCHITECTURES
75-virtual) runs nvcc's own compile steps (`nvcc --dryrun`) with three changes, so that a binary carries only PTX
that the driver JIT-compiles at load, as it would for a V100:
  1. the device-side preprocessing sees __CUDA_ARCH__ = 700 (and __CUDA_ARCH_LIST__ = 700), so every
     `#if __CUDA_ARCH__` choice in our code and in CUDA's headers takes its SM70 branch;
  2. the PTX that cicc wrote declares `.target sm_70`, and ptxas checks it (`--gpu-name sm_75`): an instruction the
     V100 lacks (ldmatrix, the m16n8k8 mma, cp.async, bf16/fp8 arithmetic, ...) is then a build error that names
     the instruction and the source line, as it is at JIT time;
  3. the fat binary declares the PTX as `sm=70`, so the driver JIT-compiles it for the GPU it runs on.
cicc still generates code for compute_75 internally (its instruction selection may differ from CUDA 12's for
compute_70); what the driver then compiles is PTX restricted to the SM70 feature set, checked by ptxas.
scripts/check-sm70.sh is the exact V100 machine-code proof (CUDA 12.9's NVRTC + ptxas for sm_70); this launcher is
what lets the end-to-end tests run those kernels through the JIT. Anything that is not a .cu compile is run as is.

Usage (CMake): -DCMAKE_CUDA_ARCHITECTURES=75-virtual -DCMAKE_CUDA_COMPILER_LAUNCHER=/path/scripts/nvcc-ptx70.py
Errors: a failing step is printed with its command and the launcher exits with its status.
"""
import os
import re
import shlex
import subprocess
import sys


def run_steps(nvcc_cmd):
    dry = subprocess.run(nvcc_cmd + ["--dryrun"], capture_output=True, text=True)
    if dry.returncode != 0:
        sys.stderr.write(dry.stderr)
        sys.exit(dry.returncode)
    env = dict(os.environ)
    ptx_files = []
    for raw in dry.stderr.splitlines():
        if not raw.startswith("#$ "):
            continue
        line = raw[3:]
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:  # nvcc's environment for the steps (PATH, CICC_PATH, INCLUDES, ...)
            env[m.group(1)] = os.path.expandvars(m.group(2).strip().strip('"')) if m.group(1) != "_SPACE_" else " "
            continue
        if "-D__CUDA_ARCH__=750" in line:  # device-side preprocessing (and cudafe/cicc inputs)
            line = line.replace("-D__CUDA_ARCH__=750", "-D__CUDA_ARCH__=700")
            line = line.replace("-D__CUDA_ARCH_LIST__=750", "-D__CUDA_ARCH_LIST__=700")
        if "fatbinary" in line.split()[0] and "kind=ptx,sm=75" in line:
            for ptx in ptx_files:
                retarget(ptx, env)
            line = line.replace("kind=ptx,sm=75", "kind=ptx,sm=70")
        if line.startswith("rm "):  # nvcc removes intermediates that --embedded-fatbin never wrote
            line = "rm -f " + line[3:]
        m = re.search(r'-arch compute_75 .* -o "([^"]+\.ptx)"', line)
        if m:
            ptx_files.append(m.group(1))
        rc = subprocess.run(["bash", "-c", line], env=env).returncode
        if rc != 0:
            sys.stderr.write(f"nvcc-ptx70: step failed ({rc}): {line}\n")
            sys.exit(rc)


def retarget(ptx, env):
    """Rewrites `.target sm_75` to `.target sm_70` in PTX file `ptx` and checks it with ptxas (exit on error)."""
    text = open(ptx).read()
    if not re.search(r"^\.target sm_75\b", text, re.M):
        sys.exit(f"nvcc-ptx70: {ptx}: no '.target sm_75' line to retarget")
    open(ptx, "w").write(re.sub(r"^\.target sm_75\b", ".target sm_70", text, flags=re.M))
    check = subprocess.run(["ptxas", "--gpu-name", "sm_75", ptx, "-o", os.devnull], env=env,
                           capture_output=True, text=True)
    if check.returncode != 0:
        sys.stderr.write(f"nvcc-ptx70: {ptx} is not SM70 PTX:\n{check.stderr}")
        sys.exit(check.returncode)


def main():
    cmd = sys.argv[1:]
    if not cmd:
        sys.exit("usage: nvcc-ptx70.py nvcc ARGS...")
    compiles_cu = "-c" in cmd and any(a.endswith(".cu") for a in cmd)
    if not compiles_cu:
        os.execvp(cmd[0], cmd)
    # nvcc writes dependency files with an internal step that --dryrun cannot show: they are made by `nvcc -M`.
    deps, rest, i = [], [], 0
    while i < len(cmd):
        if cmd[i] in ("-MT", "-MF"):
            deps += cmd[i:i + 2]
            i += 2
            continue
        if cmd[i] != "-MD":
            rest.append(cmd[i])
        i += 1
    if deps:
        out = rest.index("-o")
        dep_cmd = [a for a in rest[:out] + rest[out + 2:] if a != "-c"] + ["-M"] + deps
        rc = subprocess.run(dep_cmd).returncode
        if rc != 0:
            sys.exit(rc)
    run_steps(rest)


if __name__ == "__main__":
    main()
