// Normalisation kernels, one warp per normalised group. FP16 (or FP32: the kernels are templated on the activation
// type T) in/out, FP16 weights, FP32 statistics (MODEL.md: all norms compute mean/rsqrt in float32).
#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/norm_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kWarps = 8;

// y = x * rsqrt(mean(x^2) + eps) * (1 + w[col % w_len]) over each group of `group` columns.
template <class T>
__global__ void zc_rmsnorm_kernel(const T* __restrict__ x, int64_t ldx, T* y, int64_t ldy, const __half* __restrict__ w,
                                  int w_len, int rows, int width, int group, float eps) {
  pdl_begin();
  const int groups = width / group;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(rows) * groups) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = item / groups;
  const int g0 = int(item % groups) * group;
  const T* xr = x + row * ldx + g0;
  float ss = 0.f;
  for (int i = lane; i < group; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(group) + eps);
  T* yr = y + row * ldy + g0;
  for (int i = lane; i < group; i += 32) yr[i] = from_f<T>(to_f(xr[i]) * r * (1.f + to_f(w[(g0 + i) % w_len])));
}

// The same for wide groups (>= kWideGroup columns, e.g. the 2560-wide HC streams): one block per group.
constexpr int kWideGroup = 512;
template <class T>
__global__ void zc_rmsnorm_wide_kernel(const T* __restrict__ x, int64_t ldx, T* y, int64_t ldy,
                                       const __half* __restrict__ w, int w_len, int width, int group, float eps) {
  pdl_begin();
  __shared__ float scratch[32];
  const int groups = width / group;
  const int64_t row = blockIdx.x / groups;
  const int g0 = int(blockIdx.x % groups) * group;
  const T* xr = x + row * ldx + g0;
  float ss = 0.f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(group) + eps);
  T* yr = y + row * ldy + g0;
  for (int i = threadIdx.x; i < group; i += blockDim.x)
    yr[i] = from_f<T>(to_f(xr[i]) * r * (1.f + to_f(w[(g0 + i) % w_len])));
}

// One head's row xr [dim] into yr (may alias xr): ZC-RMSNorm with weight w[dim], then NeoX rotary on the first
// rotary_dims at position p; a warp's lanes call it together.
template <class T>
__device__ __forceinline__ void norm_rope_row(const T* xr, T* yr, const __half* __restrict__ w, int64_t p, int dim,
                                              int rotary_dims, float theta, float eps, int lane) {
  float ss = 0.f;
  for (int i = lane; i < dim; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(dim) + eps);
  const int half_r = rotary_dims / 2;
  // Read everything this lane needs before writing: y may alias x.
  for (int i = lane; i < half_r; i += 32) {
    float a = to_f(xr[i]) * r * (1.f + to_f(w[i]));
    float b = to_f(xr[i + half_r]) * r * (1.f + to_f(w[i + half_r]));
    float c, s;
    rope_cos_sin(i, rotary_dims, theta, p, &c, &s);
    yr[i] = from_f<T>(a * c - b * s);
    yr[i + half_r] = from_f<T>(b * c + a * s);
  }
  for (int i = rotary_dims + lane; i < dim; i += 32) yr[i] = from_f<T>(to_f(xr[i]) * r * (1.f + to_f(w[i])));
}

// Per (token, head): ZC-RMSNorm over `dim` with weight w[dim], then NeoX rotary on the first rotary_dims.
template <class T>
__global__ void head_norm_rope_kernel(const T* __restrict__ x, int64_t xts, int64_t xhs, T* y, int64_t yts, int64_t yhs,
                                      const __half* __restrict__ w, const int32_t* __restrict__ pos, int tokens,
                                      int heads, int dim, int rotary_dims, float theta, float eps) {
  pdl_begin();
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(tokens) * heads) return;
  const int64_t t = item / heads;
  const int h = int(item % heads);
  norm_rope_row(x + t * xts + h * xhs, y + t * yts + h * yhs, w, pos[t], dim, rotary_dims, theta, eps,
                int(threadIdx.x & 31));
}

// QSA q/k preparation (qsa_prepare_qk_batch) in one launch, a warp per (token, head) over the nh query heads, then
// the nkv key heads: query head h of qg [T, nh, 2, dim] (query half, gate half) normalised and rotated into q
// [T, nh, dim] with q_norm, its gate half copied to gate [T, nh, dim]; key head h of k [T, nkv, dim] in place with
// k_norm. The same arithmetic as two head_norm_rope_kernel launches and a copy.
__global__ void qsa_prepare_qk_kernel(const float* __restrict__ qg, float* __restrict__ q, float* __restrict__ gate,
                                      float* k, const __half* __restrict__ q_norm, const __half* __restrict__ k_norm,
                                      const int32_t* __restrict__ pos, int tokens, int nh, int nkv, int dim,
                                      int rotary_dims, float theta, float eps) {
  pdl_begin();
  const int heads = nh + nkv;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(tokens) * heads) return;
  const int lane = int(threadIdx.x & 31);
  const int64_t t = item / heads;
  const int h = int(item % heads);
  if (h < nh) {
    const float* xr = qg + (t * nh + h) * 2 * dim;
    float* gr = gate + (t * nh + h) * dim;
    for (int i = lane; i < dim; i += 32) gr[i] = xr[dim + i];
    norm_rope_row(xr, q + (t * nh + h) * dim, q_norm, pos[t], dim, rotary_dims, theta, eps, lane);
  } else {
    float* kr = k + (t * nkv + (h - nh)) * dim;
    norm_rope_row(kr, kr, k_norm, pos[t], dim, rotary_dims, theta, eps, lane);
  }
}

// Per (token, head): y = w * (x * rsqrt(mean(x^2) + eps)) * act(z)   (GDN output norm, plain w); act is sigmoid
// (silu_gate false: output_gate_type "sigmoid") or silu (silu_gate true: hidden_act when no output_gate_type).
template <class T>
__global__ void gated_rmsnorm_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ z, int64_t ldz, T* y,
                                     int64_t ldy, const __half* __restrict__ w, int tokens, int heads, int dim,
                                     float eps, bool silu_gate) {
  pdl_begin();
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(tokens) * heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = item / heads;
  const int h = int(item % heads);
  const T* xr = x + t * ldx + int64_t(h) * dim;
  const T* zr = z + t * ldz + int64_t(h) * dim;
  T* yr = y + t * ldy + int64_t(h) * dim;
  float ss = 0.f;
  for (int i = lane; i < dim; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(dim) + eps);
  for (int i = lane; i < dim; i += 32) {
    const float zv = to_f(zr[i]);
    yr[i] = from_f<T>(to_f(w[i]) * to_f(xr[i]) * r * (silu_gate ? siluf_(zv) : sigmoidf_(zv)));
  }
}

unsigned blocks_for(int64_t items) {
  return unsigned((items + kWarps - 1) / kWarps);
}

// Both activation types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_NORM_INSTANTIATE(T)                                                                                       \
  template __global__ void zc_rmsnorm_kernel<T>(const T*, int64_t, T*, int64_t, const __half*, int, int, int, int,   \
                                                float);                                                              \
  template __global__ void zc_rmsnorm_wide_kernel<T>(const T*, int64_t, T*, int64_t, const __half*, int, int, int,   \
                                                     float);                                                         \
  template __global__ void head_norm_rope_kernel<T>(const T*, int64_t, int64_t, T*, int64_t, int64_t, const __half*, \
                                                    const int32_t*, int, int, int, int, float, float);               \
  template __global__ void gated_rmsnorm_kernel<T>(const T*, int64_t, const T*, int64_t, T*, int64_t, const __half*, \
                                                   int, int, int, float, bool);
FN_NORM_INSTANTIATE(__half)
FN_NORM_INSTANTIATE(float)
#undef FN_NORM_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
namespace {
template <class T>
cudaError_t zc_rmsnorm_launch(const T* x, int64_t ldx, T* y, int64_t ldy, const __half* w, int w_len, int rows,
                              int width, int group, float eps, cudaStream_t stream) {
  int64_t items = int64_t(rows) * (width / group);
  if (items == 0) return cudaSuccess;
  if (group >= kWideGroup && items < 2048)  // few wide groups (decode): a block each; else a warp each
    launch(zc_rmsnorm_wide_kernel<T>, unsigned(items), 256, 0, stream, x, ldx, y, ldy, w, w_len, width, group, eps);
  else
    launch(zc_rmsnorm_kernel<T>, blocks_for(items), kWarps * 32, 0, stream, x, ldx, y, ldy, w, w_len, rows, width,
           group, eps);
  return cudaGetLastError();
}

template <class T>
cudaError_t head_norm_rope_launch(const T* x, int64_t xts, int64_t xhs, T* y, int64_t yts, int64_t yhs, const __half* w,
                                  const int32_t* pos, int tokens, int heads, int dim, int rotary_dims, float theta,
                                  float eps, cudaStream_t stream) {
  int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  launch(head_norm_rope_kernel<T>, blocks_for(items), kWarps * 32, 0, stream, x, xts, xhs, y, yts, yhs, w, pos, tokens,
         heads, dim, rotary_dims, theta, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_qsa_prepare_qk(const float* qg, float* q, float* gate, float* k, const __half* q_norm,
                                  const __half* k_norm, const int32_t* pos, int tokens, int nh, int nkv, int dim,
                                  int rotary_dims, float theta, float eps, cudaStream_t stream) {
  const int64_t items = int64_t(tokens) * (nh + nkv);
  if (items == 0) return cudaSuccess;
  launch(qsa_prepare_qk_kernel, blocks_for(items), kWarps * 32, 0, stream, qg, q, gate, k, q_norm, k_norm, pos, tokens,
         nh, nkv, dim, rotary_dims, theta, eps);
  return cudaGetLastError();
}

namespace {
template <class T>
cudaError_t gated_rmsnorm_launch(const T* x, int64_t ldx, const T* z, int64_t ldz, T* y, int64_t ldy, const __half* w,
                                 int tokens, int heads, int dim, float eps, bool silu_gate, cudaStream_t stream) {
  int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  launch(gated_rmsnorm_kernel<T>, blocks_for(items), kWarps * 32, 0, stream, x, ldx, z, ldz, y, ldy, w, tokens, heads,
         dim, eps, silu_gate);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_zc_rmsnorm(const __half* x, int64_t ldx, __half* y, int64_t ldy, const __half* w, int w_len,
                              int rows, int width, int group, float eps, cudaStream_t stream) {
  return zc_rmsnorm_launch(x, ldx, y, ldy, w, w_len, rows, width, group, eps, stream);
}
cudaError_t launch_zc_rmsnorm(const float* x, int64_t ldx, float* y, int64_t ldy, const __half* w, int w_len, int rows,
                              int width, int group, float eps, cudaStream_t stream) {
  return zc_rmsnorm_launch(x, ldx, y, ldy, w, w_len, rows, width, group, eps, stream);
}

cudaError_t launch_head_norm_rope(const __half* x, int64_t xts, int64_t xhs, __half* y, int64_t yts, int64_t yhs,
                                  const __half* w, const int32_t* pos, int tokens, int heads, int dim, int rotary_dims,
                                  float theta, float eps, cudaStream_t stream) {
  return head_norm_rope_launch(x, xts, xhs, y, yts, yhs, w, pos, tokens, heads, dim, rotary_dims, theta, eps, stream);
}
cudaError_t launch_head_norm_rope(const float* x, int64_t xts, int64_t xhs, float* y, int64_t yts, int64_t yhs,
                                  const __half* w, const int32_t* pos, int tokens, int heads, int dim, int rotary_dims,
                                  float theta, float eps, cudaStream_t stream) {
  return head_norm_rope_launch(x, xts, xhs, y, yts, yhs, w, pos, tokens, heads, dim, rotary_dims, theta, eps, stream);
}

cudaError_t launch_gated_rmsnorm(const __half* x, int64_t ldx, const __half* z, int64_t ldz, __half* y, int64_t ldy,
                                 const __half* w, int tokens, int heads, int dim, float eps, cudaStream_t stream) {
  return gated_rmsnorm_launch(x, ldx, z, ldz, y, ldy, w, tokens, heads, dim, eps, /*silu_gate=*/false, stream);
}
cudaError_t launch_gated_rmsnorm(const float* x, int64_t ldx, const float* z, int64_t ldz, float* y, int64_t ldy,
                                 const __half* w, int tokens, int heads, int dim, float eps, bool silu_gate,
                                 cudaStream_t stream) {
  return gated_rmsnorm_launch(x, ldx, z, ldz, y, ldy, w, tokens, heads, dim, eps, silu_gate, stream);
}
#endif

}  // namespace flashnext::cuda::detail
