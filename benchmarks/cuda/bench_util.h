// Timing helpers shared by the CUDA benchmarks (bench_cuda, bench_moe_w4a16): CUDA events around back-to-back calls
// on the default stream, and the device-to-device copy bandwidth that LIMITS.md uses as the memory ceiling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>

#include "ops/cuda/buffer.h"

namespace flashnext::cuda::bench {

/// Mean milliseconds per call of `fn` over `iters` calls, after 3 warm-up calls; prints any pending CUDA error.
inline double time_ms(const std::function<void()>& fn, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(err));
  return ms / iters;
}

/// Device-to-device copy bandwidth in GB/s, read + write bytes, of a 2 GiB cudaMemcpyAsync (10 timed copies).
inline double measure_copy_gbs() {
  const size_t bytes = size_t(2) << 30;
  DeviceMemory a(bytes, "copy src"), b(bytes, "copy dst");
  cudaMemset(a.get(), 1, bytes);
  const double ms = time_ms([&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); }, 10);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

}  // namespace flashnext::cuda::bench
