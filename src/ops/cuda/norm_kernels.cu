// Normalisation kernels, one warp per normalised group. FP16 in/out, FP32 statistics (MODEL.md: all norms compute
// mean/rsqrt in float32).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/norm_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kWarps = 8;

// y = x * rsqrt(mean(x^2) + eps) * (1 + w[col % w_len]) over each group of `group` columns.
__global__ void zc_rmsnorm_kernel(const __half* __restrict__ x, int64_t ldx, __half* y, int64_t ldy,
                                  const __half* __restrict__ w, int w_len, int rows, int width, int group, float eps) {
  const int groups = width / group;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(rows) * groups) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = item / groups;
  const int g0 = int(item % groups) * group;
  const __half* xr = x + row * ldx + g0;
  float ss = 0.f;
  for (int i = lane; i < group; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(group) + eps);
  __half* yr = y + row * ldy + g0;
  for (int i = lane; i < group; i += 32) yr[i] = to_h(to_f(xr[i]) * r * (1.f + to_f(w[(g0 + i) % w_len])));
}

// The same for wide groups (>= kWideGroup columns, e.g. the 2560-wide HC streams): one block per group.
constexpr int kWideGroup = 512;
__global__ void zc_rmsnorm_wide_kernel(const __half* __restrict__ x, int64_t ldx, __half* y, int64_t ldy,
                                       const __half* __restrict__ w, int w_len, int width, int group, float eps) {
  __shared__ float scratch[32];
  const int groups = width / group;
  const int64_t row = blockIdx.x / groups;
  const int g0 = int(blockIdx.x % groups) * group;
  const __half* xr = x + row * ldx + g0;
  float ss = 0.f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(group) + eps);
  __half* yr = y + row * ldy + g0;
  for (int i = threadIdx.x; i < group; i += blockDim.x)
    yr[i] = to_h(to_f(xr[i]) * r * (1.f + to_f(w[(g0 + i) % w_len])));
}

// Per (token, head): ZC-RMSNorm over `dim` with weight w[dim], then NeoX rotary on the first rotary_dims.
__global__ void head_norm_rope_kernel(const __half* __restrict__ x, int64_t xts, int64_t xhs, __half* y, int64_t yts,
                                      int64_t yhs, const __half* __restrict__ w, const int32_t* __restrict__ pos,
                                      int tokens, int heads, int dim, int rotary_dims, float theta, float eps) {
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(tokens) * heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = item / heads;
  const int h = int(item % heads);
  const __half* xr = x + t * xts + h * xhs;
  __half* yr = y + t * yts + h * yhs;
  float ss = 0.f;
  for (int i = lane; i < dim; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(dim) + eps);
  const int half_r = rotary_dims / 2;
  const int64_t p = pos[t];
  // Read everything this lane needs before writing: y may alias x.
  for (int i = lane; i < half_r; i += 32) {
    float a = to_f(xr[i]) * r * (1.f + to_f(w[i]));
    float b = to_f(xr[i + half_r]) * r * (1.f + to_f(w[i + half_r]));
    float c, s;
    rope_cos_sin(i, rotary_dims, theta, p, &c, &s);
    yr[i] = to_h(a * c - b * s);
    yr[i + half_r] = to_h(b * c + a * s);
  }
  for (int i = rotary_dims + lane; i < dim; i += 32) yr[i] = to_h(to_f(xr[i]) * r * (1.f + to_f(w[i])));
}

// Per (token, head): y = w * (x * rsqrt(mean(x^2) + eps)) * sigmoid(z)   (GDN output norm, plain w).
__global__ void gated_rmsnorm_kernel(const __half* __restrict__ x, int64_t ldx, const __half* __restrict__ z,
                                     int64_t ldz, __half* y, int64_t ldy, const __half* __restrict__ w, int tokens,
                                     int heads, int dim, float eps) {
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= int64_t(tokens) * heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = item / heads;
  const int h = int(item % heads);
  const __half* xr = x + t * ldx + int64_t(h) * dim;
  const __half* zr = z + t * ldz + int64_t(h) * dim;
  __half* yr = y + t * ldy + int64_t(h) * dim;
  float ss = 0.f;
  for (int i = lane; i < dim; i += 32) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(dim) + eps);
  for (int i = lane; i < dim; i += 32) yr[i] = to_h(to_f(w[i]) * to_f(xr[i]) * r * sigmoidf_(to_f(zr[i])));
}

unsigned blocks_for(int64_t items) {
  return unsigned((items + kWarps - 1) / kWarps);
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)

cudaError_t launch_zc_rmsnorm(const __half* x, int64_t ldx, __half* y, int64_t ldy, const __half* w, int w_len,
                              int rows, int width, int group, float eps, cudaStream_t stream) {
  int64_t items = int64_t(rows) * (width / group);
  if (items == 0) return cudaSuccess;
  if (group >= kWideGroup && items < 2048)  // few wide groups (decode): a block each; else a warp each
    zc_rmsnorm_wide_kernel<<<unsigned(items), 256, 0, stream>>>(x, ldx, y, ldy, w, w_len, width, group, eps);
  else
    zc_rmsnorm_kernel<<<blocks_for(items), kWarps * 32, 0, stream>>>(x, ldx, y, ldy, w, w_len, rows, width, group, eps);
  return cudaGetLastError();
}

cudaError_t launch_head_norm_rope(const __half* x, int64_t xts, int64_t xhs, __half* y, int64_t yts, int64_t yhs,
                                  const __half* w, const int32_t* pos, int tokens, int heads, int dim, int rotary_dims,
                                  float theta, float eps, cudaStream_t stream) {
  int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  head_norm_rope_kernel<<<blocks_for(items), kWarps * 32, 0, stream>>>(x, xts, xhs, y, yts, yhs, w, pos, tokens, heads,
                                                                       dim, rotary_dims, theta, eps);
  return cudaGetLastError();
}

cudaError_t launch_gated_rmsnorm(const __half* x, int64_t ldx, const __half* z, int64_t ldz, __half* y, int64_t ldy,
                                 const __half* w, int tokens, int heads, int dim, float eps, cudaStream_t stream) {
  int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  gated_rmsnorm_kernel<<<blocks_for(items), kWarps * 32, 0, stream>>>(x, ldx, z, ldz, y, ldy, w, tokens, heads, dim,
                                                                      eps);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
