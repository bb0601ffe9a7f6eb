// Hyper-connection (gated residual) kernels: MODEL.md "Hyper-connection (gated residual) read" and the layer's
// `X = Xin + w ⊗ out` inject. The two low-rank products between hc_norm and hc_mix run in cuBLAS (hc_ops.cpp).
#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/hc_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;

// One block per token. Optionally applies a pending inject first (x += w_prev[b] * y_prev, rounded to FP16 and
// written back), then the grouped ZC-RMSNorm n = x * rsqrt(mean_b(x^2) + eps) * (1 + norm_w) per stream b, and the
// inject weights w[s] = 2 * sigmoid((W_inject[s] · n) / S) from the FP16-rounded n (as the reference's bf16 n).
// With n_lo (the FP16x2 form of the FP32 path): n_out = fp16(n), n_lo = fp16(n - n_out), and the inject weights from
// the float32 n. Launched with 1024 threads for a few tokens (decode) and 256 for many. TX: the residual's type
// (FP16, or FP32 for the ops interface's float32 residual stream).
template <class TX>
__global__ void __launch_bounds__(1024)
    hc_norm_kernel(TX* __restrict__ x, const TX* __restrict__ y_prev, const float* __restrict__ w_prev,
                   const __half* __restrict__ norm_w, const __half* __restrict__ w_inject, __half* __restrict__ n_out,
                   __half* __restrict__ n_lo, float* __restrict__ inject_out, int streams, int hidden, float eps) {
  pdl_begin();
  __shared__ float scratch[32];
  __shared__ float rstd[kHcMaxStreams];
  const int64_t t = blockIdx.x;
  const int64_t width = int64_t(streams) * hidden;
  TX* xr = x + t * width;
  for (int b = 0; b < streams; ++b) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      const int64_t c = int64_t(b) * hidden + i;
      float v = to_f(xr[c]);
      if (y_prev) {
        TX nv = from_f<TX>(v + w_prev[t * streams + b] * to_f(y_prev[t * hidden + i]));
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
      const float n32 = to_f(xr[c]) * r * (1.f + to_f(norm_w[c]));
      const __half nh = to_h(n32);
      nr[c] = nh;
      if (n_lo) n_lo[t * width + c] = to_h(n32 - to_f(nh));
      if (w_inject) {
        const float nv = n_lo ? n32 : to_f(nh);
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
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) a[i] = to_h(siluf_(d[i] * inv_streams));
}

// The FP16x2 form of hc_act: d = y2[i] + y2[n + i] (the FP32 down product's hi and lo halves from cuBLAS over
// [n_hi; n_lo]), a = silu(d / S), a2[i] = fp16(a), a2[n + i] = fp16(a - a2[i]): the up product's [a_hi; a_lo].
__global__ void hc_act_split_kernel(const float* __restrict__ y2, __half* __restrict__ a2, int64_t n,
                                    float inv_streams) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const float a = siluf_((y2[i] + y2[n + i]) * inv_streams);
  const __half hi = to_h(a);
  a2[i] = hi;
  a2[n + i] = to_h(a - to_f(hi));
}

// The FP16x2 form of hc_mix: m = m2[c] + m2[T*W + c] (the up product's halves), n = n2[c] + n2[T*W + c] (n's FP16x2
// pair from hc_norm), u[t, i] = mean over streams b of sigmoid(m) * n; V consecutive hidden columns a thread (4 with
// vector loads where H is a multiple of 4, else 1).
template <int V>
__global__ void hc_mix_split_kernel(const float* __restrict__ m2, const __half* __restrict__ n2, float* __restrict__ u,
                                    int tokens, int streams, int hidden) {
  pdl_begin();
  const int hv = hidden / V;
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(tokens) * hv) return;
  const int64_t t = idx / hv, i = (idx % hv) * V, width = int64_t(streams) * hidden, total = int64_t(tokens) * width;
  float acc[V] = {};
  for (int b = 0; b < streams; ++b) {
    const int64_t c = t * width + int64_t(b) * hidden + i;
    float m[V], n[V];
    if constexpr (V == 4) {
      const float4 mh = *reinterpret_cast<const float4*>(m2 + c), ml = *reinterpret_cast<const float4*>(m2 + total + c);
      const uint2 nh = *reinterpret_cast<const uint2*>(n2 + c), nl = *reinterpret_cast<const uint2*>(n2 + total + c);
      const float2 h01 = __half22float2(*reinterpret_cast<const __half2*>(&nh.x)),
                   h23 = __half22float2(*reinterpret_cast<const __half2*>(&nh.y)),
                   l01 = __half22float2(*reinterpret_cast<const __half2*>(&nl.x)),
                   l23 = __half22float2(*reinterpret_cast<const __half2*>(&nl.y));
      m[0] = mh.x + ml.x, m[1] = mh.y + ml.y, m[2] = mh.z + ml.z, m[3] = mh.w + ml.w;
      n[0] = h01.x + l01.x, n[1] = h01.y + l01.y, n[2] = h23.x + l23.x, n[3] = h23.y + l23.y;
    } else {
      m[0] = m2[c] + m2[total + c];
      n[0] = to_f(n2[c]) + to_f(n2[total + c]);
    }
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] += sigmoidf_(m[v]) * n[v];
  }
  const float inv = 1.f / float(streams);
#pragma unroll
  for (int v = 0; v < V; ++v) u[t * hidden + i + v] = acc[v] * inv;
}

// u[t, i] = mean over streams b of sigmoid(m[t, b*H + i]) * n[t, b*H + i].
template <class TU>
__global__ void hc_mix_kernel(const __half* __restrict__ m, const __half* __restrict__ nrm, TU* __restrict__ u,
                              int tokens, int streams, int hidden) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(tokens) * hidden) return;
  const int64_t t = idx / hidden, i = idx % hidden;
  const int64_t base = t * streams * int64_t(hidden) + i;
  float acc = 0.f;
  for (int b = 0; b < streams; ++b) {
    const int64_t c = base + int64_t(b) * hidden;
    acc += sigmoidf_(to_f(m[c])) * to_f(nrm[c]);
  }
  u[idx] = from_f<TU>(acc / float(streams));
}

// x[t, b*H + i] += w[t, b] * y[t, i].
template <class T>
__global__ void hc_inject_kernel(T* __restrict__ x, const T* __restrict__ y, const float* __restrict__ w, int tokens,
                                 int streams, int hidden) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t width = int64_t(streams) * hidden;
  if (idx >= int64_t(tokens) * width) return;
  const int64_t t = idx / width, c = idx % width;
  const int b = int(c / hidden);
  const int64_t i = c % hidden;
  x[idx] = from_f<T>(to_f(x[idx]) + w[t * streams + b] * to_f(y[t * hidden + i]));
}

unsigned grid_for(int64_t n) {
  return unsigned((n + kThreads - 1) / kThreads);
}

// Both activation types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_HC_INSTANTIATE(T)                                                                                    \
  template __global__ void hc_norm_kernel<T>(T*, const T*, const float*, const __half*, const __half*, __half*, \
                                             __half*, float*, int, int, float);                                 \
  template __global__ void hc_mix_kernel<T>(const __half*, const __half*, T*, int, int, int);                   \
  template __global__ void hc_inject_kernel<T>(T*, const T*, const float*, int, int, int);
template __global__ void hc_mix_split_kernel<4>(const float*, const __half*, float*, int, int, int);
template __global__ void hc_mix_split_kernel<1>(const float*, const __half*, float*, int, int, int);
FN_HC_INSTANTIATE(__half)
FN_HC_INSTANTIATE(float)
#undef FN_HC_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
namespace {
template <class TX>
cudaError_t hc_norm_launch(TX* x, const TX* y_prev, const float* w_prev, const __half* norm_w, const __half* w_inject,
                           __half* n_out, __half* n_lo, float* inject_out, int tokens, int streams, int hidden,
                           float eps, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  launch(hc_norm_kernel<TX>, tokens, tokens < 256 ? 1024 : 256, 0, stream, x, y_prev, w_prev, norm_w, w_inject, n_out,
         n_lo, inject_out, streams, hidden, eps);
  return cudaGetLastError();
}

template <class TU>
cudaError_t hc_mix_launch(const __half* m, const __half* n, TU* u, int tokens, int streams, int hidden,
                          cudaStream_t stream) {
  const int64_t total = int64_t(tokens) * hidden;
  if (total == 0) return cudaSuccess;
  launch(hc_mix_kernel<TU>, grid_for(total), kThreads, 0, stream, m, n, u, tokens, streams, hidden);
  return cudaGetLastError();
}

template <class T>
cudaError_t hc_inject_launch(T* x, const T* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream) {
  const int64_t total = int64_t(tokens) * streams * hidden;
  if (total == 0) return cudaSuccess;
  launch(hc_inject_kernel<T>, grid_for(total), kThreads, 0, stream, x, y, w, tokens, streams, hidden);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_hc_norm(__half* x, const __half* y_prev, const float* w_prev, const __half* norm_w,
                           const __half* w_inject, __half* n_out, float* inject_out, int tokens, int streams,
                           int hidden, float eps, cudaStream_t stream) {
  return hc_norm_launch(x, y_prev, w_prev, norm_w, w_inject, n_out, static_cast<__half*>(nullptr), inject_out, tokens,
                        streams, hidden, eps, stream);
}
cudaError_t launch_hc_norm(float* x, const float* y_prev, const float* w_prev, const __half* norm_w,
                           const __half* w_inject, __half* n_out, float* inject_out, int tokens, int streams,
                           int hidden, float eps, cudaStream_t stream) {
  return hc_norm_launch(x, y_prev, w_prev, norm_w, w_inject, n_out, static_cast<__half*>(nullptr), inject_out, tokens,
                        streams, hidden, eps, stream);
}
cudaError_t launch_hc_norm_split(const float* x, const __half* norm_w, const __half* w_inject, __half* n2,
                                 float* inject_out, int tokens, int streams, int hidden, float eps,
                                 cudaStream_t stream) {
  return hc_norm_launch(const_cast<float*>(x), static_cast<const float*>(nullptr), nullptr, norm_w, w_inject, n2,
                        n2 + int64_t(tokens) * streams * hidden, inject_out, tokens, streams, hidden, eps, stream);
}

cudaError_t launch_hc_act(const float* d, __half* a, int tokens, int rank, int streams, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * rank;
  if (n == 0) return cudaSuccess;
  launch(hc_act_kernel, grid_for(n), kThreads, 0, stream, d, a, n, 1.f / float(streams));
  return cudaGetLastError();
}
cudaError_t launch_hc_act_split(const float* y2, __half* a2, int tokens, int rank, int streams, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * rank;
  if (n == 0) return cudaSuccess;
  launch(hc_act_split_kernel, grid_for(n), kThreads, 0, stream, y2, a2, n, 1.f / float(streams));
  return cudaGetLastError();
}
cudaError_t launch_hc_mix_split(const float* m2, const __half* n2, float* u, int tokens, int streams, int hidden,
                                cudaStream_t stream) {
  const bool vec = hidden % 4 == 0;
  const int64_t total = int64_t(tokens) * (vec ? hidden / 4 : hidden);
  if (total == 0) return cudaSuccess;
  launch(vec ? hc_mix_split_kernel<4> : hc_mix_split_kernel<1>, grid_for(total), kThreads, 0, stream, m2, n2, u, tokens,
         streams, hidden);
  return cudaGetLastError();
}

cudaError_t launch_hc_mix(const __half* m, const __half* n, __half* u, int tokens, int streams, int hidden,
                          cudaStream_t stream) {
  return hc_mix_launch(m, n, u, tokens, streams, hidden, stream);
}
cudaError_t launch_hc_mix(const __half* m, const __half* n, float* u, int tokens, int streams, int hidden,
                          cudaStream_t stream) {
  return hc_mix_launch(m, n, u, tokens, streams, hidden, stream);
}

cudaError_t launch_hc_inject(__half* x, const __half* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream) {
  return hc_inject_launch(x, y, w, tokens, streams, hidden, stream);
}
cudaError_t launch_hc_inject(float* x, const float* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream) {
  return hc_inject_launch(x, y, w, tokens, streams, hidden, stream);
}
#endif

}  // namespace flashnext::cuda::detail
