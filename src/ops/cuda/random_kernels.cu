// Random-weight fills on the GPU (random_kernels.h): grid-stride loops, one element (or one 32-bit code word) per
// thread and iteration.
#include "ops/cuda/random_kernels.h"
#include "ops/random_uniform.h"

namespace flashnext::cuda::detail {
namespace {

__global__ void random_f16_kernel(__half* __restrict__ out, int64_t n, float lo, float hi, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(lo + (hi - lo) * random_uniform(seed, uint64_t(i)));
}

__global__ void random_w4_codes_kernel(uint32_t* __restrict__ codes, int64_t n, int wpr, int valid, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    codes[i] = int(i % wpr) < valid ? uint32_t(random_bits(seed, uint64_t(i)) >> 32) : 0u;
}

template <class T>
__global__ void fill_kernel(T* __restrict__ out, int64_t n, T v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = v;
}

// The templates as sm_70 kernels for the NVRTC check (scripts/check-sm70.sh compiles device code only).
template __global__ void fill_kernel<__half>(__half*, int64_t, __half);
template __global__ void fill_kernel<float>(float*, int64_t, float);

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers
namespace {
constexpr int kThreads = 256;
int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65536 ? (b > 0 ? b : 1) : 65536);
}
}  // namespace

cudaError_t launch_random_f16(__half* out, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  random_f16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, n, lo, hi, seed);
  return cudaGetLastError();
}

cudaError_t launch_random_w4_codes(uint32_t* codes, int64_t rows, int wpr, int valid_words, uint64_t seed,
                                   cudaStream_t stream) {
  const int64_t n = rows * wpr;
  if (n == 0) return cudaSuccess;
  random_w4_codes_kernel<<<blocks_for(n), kThreads, 0, stream>>>(codes, n, wpr, valid_words, seed);
  return cudaGetLastError();
}

cudaError_t launch_fill_f16(__half* out, int64_t n, float v, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_kernel<__half><<<blocks_for(n), kThreads, 0, stream>>>(out, n, __float2half_rn(v));
  return cudaGetLastError();
}

cudaError_t launch_fill_f32(float* out, int64_t n, float v, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(out, n, v);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
