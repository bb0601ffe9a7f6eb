// Host-side launch attributes of the CUDA kernels and their launch (included by *_kernels.cu launchers; no fmt, nvcc
// host code).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace flashnext::cuda::detail {

/// Raises `kernel`'s dynamic shared-memory limit on the current device to at least `bytes`. The driver is asked once
/// per (device, kernel) and larger size; later launches cost a lookup under a lock, not a driver call (decode steps
/// launch such kernels once per layer). Returns the CUDA error of cudaGetDevice or cudaFuncSetAttribute.
inline cudaError_t ensure_dynamic_smem(const void* kernel, size_t bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> granted;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = granted[{device, kernel}];
  if (have >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err == cudaSuccess) have = bytes;
  return err;
}

/// Programmatic dependent launch (PDL): 1 unless the environment says FLASHNEXT_CUDA_PDL=0 (read at the first launch)
/// or set_cuda_programmatic_launch(false) (cuda_ops.h) was called.
inline std::atomic<int>& programmatic_launch_setting() {
  static std::atomic<int> setting{[] {
    const char* v = std::getenv("FLASHNEXT_CUDA_PDL");
    return v && std::strcmp(v, "0") == 0 ? 0 : 1;
  }()};
  return setting;
}

/// Whether the kernels that begin with pdl_begin_after_weights (device_math.cuh: the decode GEMV, the shared
/// expert's down product, the decode hyper-connection read) load their first weights before the wait on the kernel
/// ahead: true unless the environment says FLASHNEXT_CUDA_EARLY_WEIGHTS=0 (read once; for before/after
/// measurements). The results do not depend on it.
inline bool early_weights() {
  static const bool on = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_EARLY_WEIGHTS");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

/// The PTX version (major * 10 + minor of the compute capability it was compiled for) of `kernel`'s code for the
/// current device, the image cudaFuncGetAttributes picks; 0 when a query fails. It says which instructions the code
/// holds: a build whose only device code is compute_70 PTX (scripts/nvcc-ptx70.py), JIT-compiled on an H100, reports
/// 70 there, and its kernels hold neither griddepcontrol nor SM80 tensor-core instructions. Cached per thread, device
/// and kernel.
inline int kernel_ptx_version(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  thread_local std::map<std::pair<int, const void*>, int> known;
  const auto [it, added] = known.try_emplace({device, kernel}, 0);
  if (added) {
    cudaFuncAttributes attr{};
    it->second = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.ptxVersion : 0;
  }
  return it->second;
}

/// Whether `kernel`'s code for the current device was compiled for compute capability 9.0 or newer
/// (kernel_ptx_version), i.e. its pdl_begin() waits. That also says the GPU is 9.0 or newer.
inline bool kernel_waits_for_dependencies(const void* kernel) {
  return kernel_ptx_version(kernel) >= 90;
}

/// Launches `kernel` on `stream` as `kernel<<<grid, block, smem, stream>>>(args...)` does, with programmatic stream
/// serialization where programmatic_launch_setting() allows it and the kernel's code has the wait
/// (kernel_waits_for_dependencies): the GPU may then schedule the kernel's blocks as soon as every
/// block of the previous kernel in the stream has called griddepcontrol.launch_dependents, instead of after that
/// kernel's last block has finished (the launch latency and the previous kernel's tail overlap). Contract: the
/// kernel's first statement is pdl_begin() (device_math.cuh), which waits until the previous kernels have finished
/// and their writes are visible before the kernel touches global memory. Copies, sets, event waits and cuBLAS
/// kernels in the stream keep their plain ordering. Returns the launch's CUDA error (also left for
/// cudaGetLastError).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  const bool programmatic = programmatic_launch_setting().load(std::memory_order_relaxed) != 0 &&
                            kernel_waits_for_dependencies(reinterpret_cast<const void*>(kernel));
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashnext::cuda::detail
