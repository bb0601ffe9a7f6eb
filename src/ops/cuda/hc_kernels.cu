// Hyper-connection (gated residual) kernels: MODEL.md "Hyper-connection (gated residual) read" and the layer's
// `X = Xin + w ⊗ out` inject. The two low-rank products between hc_norm and hc_mix run in cuBLAS (hc.cpp).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/hc_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;

// One block per token. Optionally applies a pending inject first (x += w_prev[b] * y_prev, rounded to FP16 and
// written back), then the grouped ZC-RMSNorm n = x * rsqrt(mean_b(x^2) + eps) * (1 + norm_w) per stream b, and the
// inject weights w[s] = 2 * sigmoid((W_inject[s] · n) / S) from the FP16-rounded n (as the reference's bf16 n).
// Launched with 1024 threads for a few tokens (decode) and 256 for many.
__global__ void __launch_bounds__(1024)
    hc_norm_kernel(__half* __restrict__ x, const __half* __restrict__ y_prev, const float* __restrict__ w_prev,
                   const __half* __restrict__ norm_w, const __half* __restrict__ w_inject, __half* __restrict__ n_out,
                   float* __restrict__ inject_out, int streams, int hidden, float eps) {
  __shared__ float scratch[32];
  __shared__ float rstd[kHcMaxStreams];
  const int64_t t = blockIdx.x;
  const int64_t width = int64_t(streams) * hidden;
  __half* xr = x + t * width;
  for (int b = 0; b < streams; ++b) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const int64_t c = int64_t(b) * hidden + i;
      float v = to_f(xr[c]);
      if (y_prev) {
        __half nv = to_h(v + w_prev[t * streams + b] * to_f(y_prev[t * hidden + i]));
        xr[c] = nv;
        v = to_f(nv);
      }
      ss += v * v;
    }
    ss = block_sum(ss, scratch);
    if (threadIdx.x == 0) rstd[b] = rsqrtf(ss / float(hidden) + eps);
  }
  __syncthreads();
  float dot[kHcMaxStreams];
#pragma unroll
  for (int s = 0; s < kHcMaxStreams; ++s) dot[s] = 0.f;
  __half* nr = n_out + t * width;
  for (int b = 0; b < streams; ++b) {
    const float r = rstd[b];
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const int64_t c = int64_t(b) * hidden + i;
      const __half nh = to_h(to_f(xr[c]) * r * (1.f + to_f(norm_w[c])));
      nr[c] = nh;
      if (w_inject) {
        const float nv = to_f(nh);
#pragma unroll
        for (int s = 0; s < kHcMaxStreams; ++s)
          if (s < streams) dot[s] += to_f(w_inject[int64_t(s) * width + c]) * nv;
      }
    }
  }
  if (!w_inject) return;
  for (int s = 0; s < streams; ++s) {
    const float d = block_sum(dot[s], scratch);
    if (threadIdx.x == 0) inject_out[t * streams + s] = 2.f * sigmoidf_(d / float(streams));
  }
}

// a = silu(d / S), d = W_down · n in FP32 from cuBLAS.
__global__ void hc_act_kernel(const float* __restrict__ d, __half* __restrict__ a, int64_t n, float inv_streams) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) a[i] = to_h(siluf_(d[i] * inv_streams));
}

// u[t, i] = mean over streams b of sigmoid(m[t, b*H + i]) * n[t, b*H + i].
__global__ void hc_mix_kernel(const __half* __restrict__ m, const __half* __restrict__ nrm, __half* __restrict__ u,
                              int tokens, int streams, int hidden) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(tokens) * hidden) return;
  const int64_t t = idx / hidden, i = idx % hidden;
  const int64_t base = t * streams * int64_t(hidden) + i;
  float acc = 0.f;
  for (int b = 0; b < streams; ++b) {
    const int64_t c = base + int64_t(b) * hidden;
    acc += sigmoidf_(to_f(m[c])) * to_f(nrm[c]);
  }
  u[idx] = to_h(acc / float(streams));
}

// x[t, b*H + i] += w[t, b] * y[t, i].
__global__ void hc_inject_kernel(__half* __restrict__ x, const __half* __restrict__ y, const float* __restrict__ w,
                                 int tokens, int streams, int hidden) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t width = int64_t(streams) * hidden;
  if (idx >= int64_t(tokens) * width) return;
  const int64_t t = idx / width, c = idx % width;
  const int b = int(c / hidden);
  const int64_t i = c % hidden;
  x[idx] = to_h(to_f(x[idx]) + w[t * streams + b] * to_f(y[t * hidden + i]));
}

unsigned grid_for(int64_t n) {
  return unsigned((n + kThreads - 1) / kThreads);
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)

cudaError_t launch_hc_norm(__half* x, const __half* y_prev, const float* w_prev, const __half* norm_w,
                           const __half* w_inject, __half* n_out, float* inject_out, int tokens, int streams,
                           int hidden, float eps, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (tokens < 256)
    hc_norm_kernel<<<tokens, 1024, 0, stream>>>(x, y_prev, w_prev, norm_w, w_inject, n_out, inject_out, streams, hidden,
                                                eps);
  else
    hc_norm_kernel<<<tokens, 256, 0, stream>>>(x, y_prev, w_prev, norm_w, w_inject, n_out, inject_out, streams, hidden,
                                               eps);
  return cudaGetLastError();
}

cudaError_t launch_hc_act(const float* d, __half* a, int tokens, int rank, int streams, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * rank;
  if (n == 0) return cudaSuccess;
  hc_act_kernel<<<grid_for(n), kThreads, 0, stream>>>(d, a, n, 1.f / float(streams));
  return cudaGetLastError();
}

cudaError_t launch_hc_mix(const __half* m, const __half* n, __half* u, int tokens, int streams, int hidden,
                          cudaStream_t stream) {
  const int64_t total = int64_t(tokens) * hidden;
  if (total == 0) return cudaSuccess;
  hc_mix_kernel<<<grid_for(total), kThreads, 0, stream>>>(m, n, u, tokens, streams, hidden);
  return cudaGetLastError();
}

cudaError_t launch_hc_inject(__half* x, const __half* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream) {
  const int64_t total = int64_t(tokens) * streams * hidden;
  if (total == 0) return cudaSuccess;
  hc_inject_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, y, w, tokens, streams, hidden);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
