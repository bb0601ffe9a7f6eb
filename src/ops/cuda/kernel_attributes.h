// Host-side launch attributes of the CUDA kernels (included by *_kernels.cu launchers; no fmt, nvcc host code).
#pragma once

#include <cuda_runtime_api.h>

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

}  // namespace flashnext::cuda::detail
