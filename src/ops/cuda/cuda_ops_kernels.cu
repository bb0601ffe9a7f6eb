// Kernels of the ops-interface backend (cuda_ops.cpp) that the batched kernel set has no form of: conversions, and
// float32-activation versions of small ops whose state layout or decomposition follows the ops interface (MODEL.md;
// the float32 CPU backend src/ops/cpu is the oracle they are tested against). SM70 instructions only.
#include "ops/cuda/cuda_ops_kernels.h"
#ifndef __CUDACC_RTC__
#include <cstdint>
#include <initializer_list>

#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/torch_topk_order.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxIndexDim = 256;     // indexer head dim (block keys kernel's shared row)
constexpr int kMaxIndexQuery = 2048;  // indexer heads * head dim held in shared memory by the scores kernel

// Elementwise FP32 -> FP16 passes, 8 elements a thread (two 16-byte loads, 16-byte stores) where `vec` (the launcher
// checks n % 8 == 0 and 16-byte aligned pointers), else one: the 2-byte stores of one element a thread took twice
// the copy time (split_f16x2 at 56 us for 4,096 x 2,560 in a prefill's kernel trace).
constexpr int kCastVec = 8;

// The 8 floats of x at 8-element group i.
__device__ __forceinline__ void load_f32x8(const float* __restrict__ x, int64_t i, float (&v)[kCastVec]) {
  const float4 a = reinterpret_cast<const float4*>(x)[2 * i], b = reinterpret_cast<const float4*>(x)[2 * i + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// y[i] = fp16(x[i]) (launch_f32_to_f16).
__global__ void f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t n, bool vec) {
  pdl_begin();
  const int64_t stride = int64_t(gridDim.x) * kThreads, first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (vec) {
    for (int64_t i = first; i < n / kCastVec; i += stride) {
      float v[kCastVec];
      load_f32x8(x, i, v);
      __align__(16) __half h[kCastVec];
#pragma unroll
      for (int k = 0; k < kCastVec; ++k) h[k] = to_h(v[k]);
      reinterpret_cast<uint4*>(y)[i] = *reinterpret_cast<const uint4*>(h);
    }
    return;
  }
  for (int64_t i = first; i < n; i += stride) y[i] = to_h(x[i]);
}

// Does nothing: the per-launch cost (cuda_launch_cost_us).
__global__ void noop_kernel() {}

__global__ void f16_to_f32_kernel(const __half* __restrict__ x, float* __restrict__ y, int64_t n) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    y[i] = to_f(x[i]);
}

// Converts one checkpoint tensor to FP16 and counts the values FP16 cannot hold (stats[0]) and the largest finite
// magnitude among the others (stats[1], float bits: unsigned order = float order for non-negative floats).
__global__ void weight_to_f16_kernel(const void* __restrict__ src, int src_type, __half* __restrict__ dst, int64_t n,
                                     uint32_t* stats) {
  pdl_begin();
  uint32_t bad = 0;
  float mx = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    float v;
    if (src_type == kSrcF16)
      v = __half2float(static_cast<const __half*>(src)[i]);
    else if (src_type == kSrcBF16)
      v = __uint_as_float(uint32_t(static_cast<const uint16_t*>(src)[i]) << 16);
    else
      v = static_cast<const float*>(src)[i];
    const float a = fabsf(v);
    if (a <= kF16Max)
      mx = fmaxf(mx, a);
    else
      ++bad;  // also NaN (a <= max is false)
    dst[i] = __float2half_rn(v);
  }
  mx = warp_max(mx);
  const float nbad = warp_sum(float(bad));
  if ((threadIdx.x & 31) == 0) {
    if (nbad > 0.f) atomicAdd(&stats[0], uint32_t(nbad));
    atomicMax(&stats[1], __float_as_uint(mx));
  }
}

__global__ void embedding_f32_kernel(const __half* __restrict__ table, int64_t vocab, int hidden,
                                     const int32_t* __restrict__ ids, int reps, float* __restrict__ out,
                                     int32_t* status) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  if (!ok && threadIdx.x == 0 && status) atomicOr(status, 1);
  float* o = out + t * reps * hidden;
  for (int j = threadIdx.x; j < hidden; j += kThreads) {
    const float v = ok ? to_f(table[id * hidden + j]) : 0.f;
    for (int r = 0; r < reps; ++r) o[int64_t(r) * hidden + j] = v;
  }
}

__global__ void add_bias_kernel(float* __restrict__ y, const __half* __restrict__ bias, int64_t n, int cols) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    y[i] += to_f(bias[i % cols]);
}

// One warp per output element y[t, o].
__global__ void linear_f32_narrow_kernel(const float* __restrict__ x, const __half* __restrict__ w,
                                         float* __restrict__ y, int tokens, int in, int out) {
  pdl_begin();
  const int64_t item = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= int64_t(tokens) * out) return;
  const int64_t t = item / out, o = item % out;
  const float* xr = x + t * in;
  const __half* wr = w + o * in;
  float acc = 0.f;
  for (int i = lane; i < in; i += 32) acc += xr[i] * to_f(wr[i]);
  acc = warp_sum(acc);
  if (lane == 0) y[item] = acc;
}

// Eight FP16 values (16 bytes) as floats.
__device__ __forceinline__ void unpack_f16x8(const uint4& raw, float (&wf)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    wf[2 * i] = f.x;
    wf[2 * i + 1] = f.y;
  }
}

// A lane's 8-wide slices v = lane, lane + 32, ... < n8 of an FP16 row `wr` (16-byte aligned), in that order:
// body(v, wf) with the slice's 8 weights as floats. The loads of P slices are issued before any of them is used: a
// decode GEMV has few rows (few warps in flight), so memory-level parallelism has to come from each lane; with more
// tokens each slice already brings T activation loads, and deeper prefetch only costs registers (gemv_prefetch).
template <int T>
__host__ __device__ constexpr int gemv_prefetch() {
  return T <= 2 ? 4 : T <= 4 ? 2 : 1;
}

// P of a lane's 16-byte weight slices in registers: load() takes slices v0, v0 + stride, ... (those below n8) of
// `wr`, R rows of n8 slices each, rows past nr left unloaded.
template <int P, int R = 1>
struct LaneSlicesF16 {
  uint4 raw[P][R];
  __device__ __forceinline__ void load(const uint4* __restrict__ wr, int nr, int v0, int n8, int stride) {
#pragma unroll
    for (int u = 0; u < P; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (v0 + stride * u < n8 && r < nr) raw[u][r] = __ldg(wr + int64_t(r) * n8 + v0 + stride * u);
  }
};

// The first slice of a lane (split-K, gemv_f16w_f32x_kernel: `part` of `parts` warps on the row takes the slices
// lane + 32 * (part + parts * i), so the stride between a lane's slices is 32 * parts).
__device__ __forceinline__ int lane_slice0(int lane, int part) {
  return lane + 32 * part;
}

// The loop over a lane's slices with its first P already in `cur` (cur.load(wr, 1, lane_slice0(lane, part), n8,
// 32 * parts), e.g. before the kernel's wait: pdl_begin_after_weights); it loads the later ones into `cur`.
template <int P, class Body>
__device__ __forceinline__ void for_lane_slices_f16(const uint4* __restrict__ wr, int n8, int lane,
                                                    LaneSlicesF16<P>& cur, Body&& body, int part = 0, int parts = 1) {
  const int stride = 32 * parts, v_first = lane_slice0(lane, part);
  for (int v0 = v_first; v0 < n8; v0 += stride * P) {
    if (v0 != v_first) cur.load(wr, 1, v0, n8, stride);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      if (v0 + stride * u >= n8) break;
      float wf[8];
      unpack_f16x8(cur.raw[u][0], wf);
      body(v0 + stride * u, wf);
    }
  }
}

// One lane's share of T dot products with one FP16 weight row: acc[t] += sum over the 8-wide slices v = lane +
// 32 part, then + 32 parts each, < K/8 of w[8v .. 8v+8) . x_t[8v .. 8v+8), x_t = x + t * ldx (float32, 16-byte
// aligned), w 16-byte aligned with K % 8 == 0, the first slices already in `first` (for_lane_slices_f16); the caller
// sums the lanes (warp_sum) and the parts. Weights are read once, with 16-byte loads.
template <int T>
__device__ __forceinline__ void lane_dots_f16w(const __half* __restrict__ w, const float* __restrict__ x, int64_t ldx,
                                               int K, int lane, LaneSlicesF16<gemv_prefetch<T>()>& first,
                                               float (&acc)[T], int part, int parts) {
  for_lane_slices_f16<gemv_prefetch<T>()>(
      reinterpret_cast<const uint4*>(w), K / 8, lane, first,
      [&](int v, const float(&wf)[8]) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const float4* xp = reinterpret_cast<const float4*>(x + t * ldx + int64_t(v) * 8);
          const float4 a = xp[0], b = xp[1];
          acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z +
                    wf[7] * b.w;
        }
      },
      part, parts);
}

// Slices in flight per row of lane_dots_rows_f16w.
template <int T>
__host__ __device__ constexpr int gemv_rows_prefetch() {
  return T <= 4 ? 2 : 1;
}

// One lane's share of the T dot products of each of R consecutive FP16 weight rows (rows nr..R-1 absent: the end of
// a segment): acc[r][t] += sum over the 8-wide slices v (as lane_dots_f16w) of w_r[8v .. 8v+8) . x_t[8v .. 8v+8), the
// first slices already in `cur`. The activations of a slice are loaded once for the R rows: at T tokens a slice
// brings 32 T bytes of activations (L1 hits) per 16 R bytes of weights, so one row per warp makes the L1, not DRAM,
// the limit past 2 tokens.
template <int T, int R>
__device__ __forceinline__ void lane_dots_rows_f16w(const __half* __restrict__ w, int nr, const float* __restrict__ x,
                                                    int64_t ldx, int K, int lane,
                                                    LaneSlicesF16<gemv_rows_prefetch<T>(), R>& cur, float (&acc)[R][T],
                                                    int part, int parts) {
  constexpr int P = gemv_rows_prefetch<T>();
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  const int n8 = K / 8, stride = 32 * parts, v_first = lane_slice0(lane, part);
  for (int v0 = v_first; v0 < n8; v0 += stride * P) {
    if (v0 != v_first) cur.load(wr, nr, v0, n8, stride);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const int v = v0 + stride * u;
      if (v >= n8) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < nr) unpack_f16x8(cur.raw[u][r], wf[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(x + t * ldx + int64_t(v) * 8);
        const float4 a = xp[0], b = xp[1];
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < nr)
            acc[r][t] += wf[r][0] * a.x + wf[r][1] * a.y + wf[r][2] * a.z + wf[r][3] * a.w + wf[r][4] * b.x +
                         wf[r][5] * b.y + wf[r][6] * b.z + wf[r][7] * b.w;
      }
    }
  }
}

// y_s[t, n] = sum_k x[t, k] * w_s[n, k] (+ bias_s[n]) for t < T <= kGemvMaxTokens over the segments s of `seg` (several
// projections of one input in one launch): a warp takes a group of R consecutive rows of one segment (groups_end[s]:
// the groups up to segment s; R = 1 for one token, where the weights alone bound the step), `parts` warps per group
// (1, 2, 4 or 8: split-K for products of few rows, whose one warp per group would leave most of the GPU's memory
// parallelism unused; warp p of a group takes its 8-wide slices p, p + parts, ... and the partial sums are added in
// warp order), 16-byte weight loads (8 FP16 values) shared by the T tokens and activation loads shared by the R rows,
// float32 products and sums (the decode GEMV: as exact as a float32 product of the FP16 weights, reading the weights
// once). With `early` each lane's first weight slices are loaded before the wait on the kernel ahead
// (pdl_begin_after_weights). K % 8 == 0, rows of x 16-byte aligned.
template <int T, int R>
__global__ void gemv_f16w_f32x_kernel(const float* __restrict__ x, int64_t ldx, int K, GemvSegments seg, int parts,
                                      bool early) {
  const int warp = int(threadIdx.x >> 5), lane = threadIdx.x & 31, part = warp % parts;
  const int g = int(blockIdx.x) * (kWarps / parts) + warp / parts;
  const bool active = g < seg.groups_end[seg.count - 1];
  int s = 0, n0 = 0, nr = 0;
  if (active) {
    while (g >= seg.groups_end[s]) ++s;
    const int first = s ? seg.rows_end[s - 1] : 0;
    n0 = (g - (s ? seg.groups_end[s - 1] : 0)) * R;
    nr = min(R, seg.rows_end[s] - first - n0);
  }
  const __half* w = seg.w[s] + int64_t(n0) * K;
  constexpr int P = R == 1 ? gemv_prefetch<T>() : gemv_rows_prefetch<T>();
  LaneSlicesF16<P, R> slices;
  pdl_begin_after_weights(early, [&] {
    if (active) slices.load(reinterpret_cast<const uint4*>(w), nr, lane_slice0(lane, part), K / 8, 32 * parts);
  });
  __shared__ float red[kWarps][R * T];
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  if (active) {
    if constexpr (R == 1) {
      lane_dots_f16w<T>(w, x, ldx, K, lane, slices, acc[0], part, parts);
    } else {
      lane_dots_rows_f16w<T, R>(w, nr, x, ldx, K, lane, slices, acc, part, parts);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (parts > 1) {  // the group's partials, added in warp order by its first warp
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) red[warp][r * T + t] = acc[r][t];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float a = red[warp][r * T + t];
        for (int p = 1; p < parts; ++p) a += red[warp + p][r * T + t];
        acc[r][t] = a;
      }
  }
  if (!active || lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= nr) break;
    const float bias = seg.bias[s] ? to_f(seg.bias[s][n0 + r]) : 0.f;
#pragma unroll
    for (int t = 0; t < T; ++t) seg.y[s][t * seg.ldy[s] + n0 + r] = acc[r][t] + bias;
  }
}

// ---------------------------------------------------------------- 8-bit weights (W8A16)
// Sixteen 8-bit codes (16 bytes) as floats, exactly: int8 through the float bias trick (the byte with its sign bit
// flipped under 0x4B000000 is 2^23 + 128 + q), E4M3 through FP16 (sign to bit 15, exponent and mantissa shifted
// into place: e4m3 * 2^-8 exactly, subnormals included), so FP8 values come out 2^-8 times their value.
template <bool FP8>
__device__ __forceinline__ void unpack_w8x16(const uint4& raw, float (&wf)[16]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (FP8) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const uint32_t x = __byte_perm(u[i], 0u, p ? 0x3424u : 0x1404u);  // bytes 2p, 2p + 1 to the high bytes
        const uint32_t h = ((x >> 1) & 0x3f803f80u) | (x & 0x80008000u);
        const float2 f = __half22float2(
            __halves2half2(__ushort_as_half(uint16_t(h & 0xffffu)), __ushort_as_half(uint16_t(h >> 16))));
        wf[4 * i + 2 * p] = f.x;
        wf[4 * i + 2 * p + 1] = f.y;
      }
    } else {
      const uint32_t v = u[i] ^ 0x80808080u;
#pragma unroll
      for (int b = 0; b < 4; ++b) wf[4 * i + b] = __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7440u + b)) - 8388736.f;
    }
  }
}

// y_s[t, n] = sum_k x[t, k] * code_s[n, k] * scale_s[n, k / group_s] (+ bias_s[n]): launch_gemv_w8_f32x. A warp (or
// `parts` warps, split-K, partials added in warp order) per row; lane slices of 16 codes, P of them in flight; each
// slice's 16 products summed in float32, then added to the token's sum, times its group's scale where a row has
// several groups, else the row's scale once at the end (FP8: times 2^8 as well). K % 16 == 0, groups multiples of 16.
template <int T, bool FP8>
__global__ void gemv_w8_f32x_kernel(const float* __restrict__ x, int64_t ldx, int K, GemvSegments8 seg, int parts,
                                    bool early) {
  constexpr int P = gemv_prefetch<T>();
  const int warp = int(threadIdx.x >> 5), lane = threadIdx.x & 31, part = warp % parts;
  const int n_all = int(blockIdx.x) * (kWarps / parts) + warp / parts;
  const bool active = n_all < seg.rows_end[seg.count - 1];
  int s = 0;
  if (active)
    while (n_all >= seg.rows_end[s]) ++s;
  const int n = n_all - (s ? seg.rows_end[s - 1] : 0);
  const uint4* wr = reinterpret_cast<const uint4*>(seg.w[s] + int64_t(n) * K);
  const int n16 = K / 16, stride = 32 * parts, v_first = lane + 32 * part;
  uint4 raw[P];
  auto load = [&](int v0) {
#pragma unroll
    for (int u = 0; u < P; ++u)
      if (v0 + stride * u < n16) raw[u] = __ldg(wr + v0 + stride * u);
  };
  pdl_begin_after_weights(early, [&] {
    if (active) load(v_first);
  });
  __shared__ float red[kWarps][T];
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  const int group = seg.group[s], G = (K + group - 1) / group;
  const bool row_scale = group >= K;
  const float* sc = seg.scale[s] + int64_t(n) * G;
  if (active) {
    for (int v0 = v_first; v0 < n16; v0 += stride * P) {
      if (v0 != v_first) load(v0);
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const int v = v0 + stride * u;
        if (v >= n16) break;
        float wf[16];
        unpack_w8x16<FP8>(raw[u], wf);
        const float gs = row_scale ? 1.f : __ldg(sc + (16 * v) / group);
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const float4* xp = reinterpret_cast<const float4*>(x + t * ldx + int64_t(v) * 16);
          float d = 0.f;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float4 a = xp[q];
            d += wf[4 * q] * a.x + wf[4 * q + 1] * a.y + wf[4 * q + 2] * a.z + wf[4 * q + 3] * a.w;
          }
          acc[t] = row_scale ? acc[t] + d : fmaf(d, gs, acc[t]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = warp_sum(acc[t]);
  if (parts > 1) {
    if (lane == 0)
#pragma unroll
      for (int t = 0; t < T; ++t) red[warp][t] = acc[t];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float a = red[warp][t];
      for (int p = 1; p < parts; ++p) a += red[warp + p][t];
      acc[t] = a;
    }
  }
  if (!active || lane != 0) return;
  const float f = (row_scale ? sc[0] : 1.f) * (FP8 ? 256.f : 1.f);
  const float bias = seg.bias[s] ? to_f(seg.bias[s][n]) : 0.f;
#pragma unroll
  for (int t = 0; t < T; ++t) seg.y[s][t * seg.ldy[s] + n] = acc[t] * f + bias;
}

// dst[n, k] = fp16(code) or fp16(float(code) * scale[n, k / group]): launch_w8_to_f16.
__global__ void w8_to_f16_kernel(const uint8_t* __restrict__ codes, bool fp8, const float* __restrict__ scale,
                                 int group, bool apply_scales, int64_t rows, int cols, __half* __restrict__ dst) {
  pdl_begin();
  const int G = (cols + group - 1) / group;
  const int64_t n_all = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * kThreads) {
    const uint8_t b = codes[i];
    float v;
    if (fp8) {
      const uint16_t h = uint16_t(((b & 0x7fu) << 7) | ((b & 0x80u) << 8));  // e4m3 * 2^-8 as FP16 bits
      v = __half2float(__ushort_as_half(h)) * 256.f;
    } else {
      v = float(int8_t(b));
    }
    if (apply_scales) v *= scale[(i / cols) * G + (i % cols) / group];
    dst[i] = __float2half_rn(v);
  }
}

// y[t, n] = y[t, n] * scale[n] (+ bias[n]): launch_scale_columns.
__global__ void scale_columns_kernel(float* __restrict__ y, int64_t rows, int cols, int64_t ldy,
                                     const float* __restrict__ scale, const __half* __restrict__ bias) {
  pdl_begin();
  const int64_t n_all = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * kThreads) {
    const int64_t t = i / cols;
    const int c = int(i % cols);
    float* p = y + t * ldy + c;
    *p = *p * scale[c] + (bias ? to_f(bias[c]) : 0.f);
  }
}

// The shared expert's down projection for T <= kGemvMaxTokens tokens with its activation and gate fused in (one warp
// per output column c of H): out[t, c] += sigmoid(gate_logit[t]) * sum_k down[c, k] * silu(g[t, k]) * up[t, k]
// (without `accumulate`: out[t, c] = that term); g,
// up [T, I] float32, down [H, I] FP16, I % 8 == 0, every pointer 16-byte aligned. Float32 throughout, the products
// and the order of the sums as silu_mul_f32 + gemv_f16w_f32x + gated_accumulate compute them. With `early` the first
// weight slices are loaded before the wait on the kernel ahead (pdl_begin_after_weights).
template <int T>
__global__ void shared_down_decode_kernel(const float* __restrict__ g, const float* __restrict__ up,
                                          const __half* __restrict__ down, const float* __restrict__ gate_logit, int I,
                                          int H, float* __restrict__ out, bool accumulate, bool early) {
  const int c = int((int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  const uint4* wr = reinterpret_cast<const uint4*>(down + int64_t(c < H ? c : 0) * I);
  LaneSlicesF16<gemv_prefetch<T>()> slices;
  pdl_begin_after_weights(early, [&] {
    if (c < H) slices.load(wr, 1, lane_slice0(lane, 0), I / 8, 32);
  });
  if (c >= H) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  for_lane_slices_f16<gemv_prefetch<T>()>(wr, I / 8, lane, slices, [&](int v, const float(&wf)[8]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float* gr = g + int64_t(t) * I + int64_t(v) * 8;
      const float* ur = up + int64_t(t) * I + int64_t(v) * 8;
      const float4 g0 = reinterpret_cast<const float4*>(gr)[0], g1 = reinterpret_cast<const float4*>(gr)[1];
      const float4 u0 = reinterpret_cast<const float4*>(ur)[0], u1 = reinterpret_cast<const float4*>(ur)[1];
      const float a[8] = {siluf_(g0.x) * u0.x, siluf_(g0.y) * u0.y, siluf_(g0.z) * u0.z, siluf_(g0.w) * u0.w,
                          siluf_(g1.x) * u1.x, siluf_(g1.y) * u1.y, siluf_(g1.z) * u1.z, siluf_(g1.w) * u1.w};
      acc[t] += wf[0] * a[0] + wf[1] * a[1] + wf[2] * a[2] + wf[3] * a[3] + wf[4] * a[4] + wf[5] * a[5] +
                wf[6] * a[6] + wf[7] * a[7];
    }
  });
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float sum = warp_sum(acc[t]);
    if (lane == 0) {
      float* o = out + int64_t(t) * H + c;
      const float v = sigmoidf_(gate_logit[t]) * sum;
      *o = accumulate ? *o + v : v;
    }
  }
}

// Decode hyper-connection read (hc_read for T <= kGemvMaxTokens tokens, float32 throughout), in two launches. With
// n = X * rstd * (1 + hc_norm), a row's product splits by stream: w . n[t] = sum_b rstd[t][b] * p[t][b], where
// p[t][b] = sum over stream b's inputs k of w[k] (1 + hc_norm[k]) X[t, k], so no statistics pass has to come first:
//   hc_down: block (g, b) for rows g*kHcDownRows .. +kHcDownRows of [input_mix_weight_down (R rows); block_inject
//            (S rows)] over stream b's H inputs, one thread per 8-wide slice with all of its weight, norm and X loads
//            in flight at once: the partial dots p[t][r][b] and (blocks g = 0) the stream's square sums ss[t][b].
//   hc_up:   rstd[t][b] = rsqrt(ss[t][b] / H + eps), d[t][r] = silu(sum_b rstd[t][b] p[t][r][b] / S) into shared
//            memory (block 0 also writes inj[t][s] = 2 sigmoid(sum_b rstd p / S) of the inject rows), then one warp per
//            hidden column j, lane group b (32 / S lanes) for stream b: m_b = up[b*H + j] . d[t];
//            u[t, j] = mean_b sigmoid(m_b) * n[t, b*H + j]. The up weights and the X' elements are loaded before the
//            prologue.
// Both kernels load their first weights (and norm weights) before the wait on the kernel ahead where `early`
// (pdl_begin_after_weights).
// With a pending injection (add_out [T, H], add_inj [T, S]; hc_inject_read) both kernels read X' = X + add_inj[t, b] *
// add_out[t, j] (the expression of hc_inject_kernel) instead of X, and hc_up, whose lanes own one X element each,
// stores X' in place. Needs H, R multiples of 8, S a power of two <= kHcMaxStreamsDecode, rows 16-byte aligned.
constexpr int kHcMaxStreamsDecode = 8;
constexpr int kHcDownRows = 4;  // rows per hc_down block: they share the block's X and norm loads
// Threads of an hc_down block: a slice of 8 inputs each, the 320 slices of a stream at the released width (2,560).
constexpr int kHcDownThreads = 320;
// Blocks per SM hc_down is compiled for (its registers capped to fit): with the per-token accumulators of 2-4 tokens
// it took 102 registers, one 320-thread block an SM, its 324 blocks (released widths) in 2.5 waves; 96 fit two (1.2
// waves; 3-4 tokens spill about 100 bytes). One token: capped for 3 blocks an SM, one wave (uncapped it took 70
// registers: 2 blocks an SM, 264 of the 324 blocks in the first wave); 5-8 tokens need more than 96.
template <int T>
constexpr int kHcDownMinBlocks = T == 1   ? 3
                                 : T <= 4 ? 2
                                          : 1;
constexpr int kHcUpSlices = 8;  // 8-wide up-row slices per lane in flight

// X'[t, b*H + 4i .. +4) as hc_read_decode reads it: X plus the pending injection, if any.
__device__ __forceinline__ float4 hc_x4(const float* __restrict__ X, const float* __restrict__ add_out,
                                        const float* __restrict__ add_inj, int t, int b, int i4, int S, int H) {
  float4 v = reinterpret_cast<const float4*>(X + int64_t(t) * S * H + int64_t(b) * H)[i4];
  if (add_out) {
    const float a = add_inj[t * S + b];
    const float4 o = reinterpret_cast<const float4*>(add_out + int64_t(t) * H)[i4];
    v.x = v.x + a * o.x;
    v.y = v.y + a * o.y;
    v.z = v.z + a * o.z;
    v.w = v.w + a * o.w;
  }
  return v;
}

// At most kHcDownThreads threads (one per 8-wide slice of a stream, looping beyond); the T * (kHcDownRows + 1)
// accumulators stay in registers (kHcDownMinBlocks).
template <int T>
__global__ void __launch_bounds__(kHcDownThreads, kHcDownMinBlocks<T>)
    hc_down_kernel(const float* __restrict__ X, const float* __restrict__ add_out, const float* __restrict__ add_inj,
                   const __half* __restrict__ norm_w, const __half* __restrict__ down,
                   const __half* __restrict__ inject, int S, int H, int R, int rows, float* __restrict__ part,
                   float* __restrict__ ss_out, bool early) {
  constexpr int RB = kHcDownRows, V = T * (RB + 1);  // per token: RB row dots, then the square sum
  const int g = int(blockIdx.x), b = int(blockIdx.y), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t W = int64_t(S) * H;
  const int n8 = H / 8;
  const uint4* wr[RB];
#pragma unroll
  for (int i = 0; i < RB; ++i) {
    const int r = min(g * RB + i, rows - 1);
    wr[i] = reinterpret_cast<const uint4*>(r < R ? down + int64_t(r) * W : inject + int64_t(r - R) * W);
  }
  // The weight and norm slices of this thread's first 8-wide slice (the only one at the released width), loaded
  // before the wait with `early`; the loop loads the later ones.
  uint4 wraw[RB], graw;
  auto load_slice = [&](int v) {
    const int64_t k8 = int64_t(b) * n8 + v;  // the slice in a row of S*H inputs
#pragma unroll
    for (int i = 0; i < RB; ++i) wraw[i] = __ldg(wr[i] + k8);
    graw = __ldg(reinterpret_cast<const uint4*>(norm_w) + k8);
  };
  pdl_begin_after_weights(early, [&] {
    if (int(threadIdx.x) < n8) load_slice(int(threadIdx.x));
  });
  __shared__ float red[kHcDownThreads / 32][V];
  float acc[T][RB + 1];
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i <= RB; ++i) acc[t][i] = 0.f;
  for (int v = threadIdx.x; v < n8; v += blockDim.x) {
    if (v != int(threadIdx.x)) load_slice(v);
    float gf[8];
    unpack_f16x8(graw, gf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4 p = hc_x4(X, add_out, add_inj, t, b, 2 * v, S, H),
                   q = hc_x4(X, add_out, add_inj, t, b, 2 * v + 1, S, H);
      float xf[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
      float sq = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        sq += xf[k] * xf[k];
        xf[k] *= 1.f + gf[k];
      }
      acc[t][RB] += sq;
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        float wf[8];
        unpack_f16x8(wraw[i], wf);
        acc[t][i] += wf[0] * xf[0] + wf[1] * xf[1] + wf[2] * xf[2] + wf[3] * xf[3] + wf[4] * xf[4] + wf[5] * xf[5] +
                     wf[6] * xf[6] + wf[7] * xf[7];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int i = 0; i <= RB; ++i) {
      const float a = warp_sum(acc[t][i]);
      if (lane == 0) red[warp][t * (RB + 1) + i] = a;
    }
  __syncthreads();
  const int warps = int(blockDim.x) >> 5;
  for (int q = threadIdx.x; q < V; q += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < warps; ++w) a += red[w][q];
    const int t = q / (RB + 1), i = q % (RB + 1), r = g * RB + i;
    if (i < RB) {
      if (r < rows) part[(int64_t(t) * rows + r) * S + b] = a;
    } else if (g == 0) {
      ss_out[t * S + b] = a;
    }
  }
}

template <int T>
__global__ void hc_up_kernel(float* __restrict__ X, const float* __restrict__ add_out,
                             const float* __restrict__ add_inj, const __half* __restrict__ norm_w,
                             const __half* __restrict__ up, const float* __restrict__ part,
                             const float* __restrict__ ss, int S, int H, int R, int rows, float eps,
                             float* __restrict__ u, float* __restrict__ inj, bool early) {
  extern __shared__ float d_s[];  // [T, R]
  __shared__ float rstd[T][kHcMaxStreamsDecode];
  constexpr int P = kHcUpSlices;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, L = 32 / S, b = lane / L, sub = lane % L;
  const int j = int(blockIdx.x) * kWarps + warp, r8 = R / 8;
  const bool active = j < H;  // per warp
  const uint4* wr = reinterpret_cast<const uint4*>(up + (int64_t(b) * H + (active ? j : 0)) * R);
  const int64_t W = int64_t(S) * H, c = int64_t(b) * H + j;
  // The first up-row slices and the norm weight of this lane's element, before the wait with `early`.
  uint4 raw[P];
  float gn = 0.f;
  pdl_begin_after_weights(early, [&] {
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (active && sub + i * L < r8) raw[i] = __ldg(wr + sub + i * L);
    if (active) gn = 1.f + to_f(norm_w[c]);
  });
  // The X' element this lane group mixes (its first lane), with the pending injection stored in place.
  float xv[T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    xv[t] = 0.f;
    if (active && sub == 0) {
      xv[t] = X[t * W + c];
      if (add_out) X[t * W + c] = xv[t] = xv[t] + add_inj[t * S + b] * add_out[int64_t(t) * H + j];
    }
  }
  if (threadIdx.x < T * S) {
    const int t = threadIdx.x / S, bb = threadIdx.x % S;
    rstd[t][bb] = rsqrtf(ss[t * S + bb] / float(H) + eps);
  }
  __syncthreads();
  // Row r's product with n[t]: the stream partials of hc_down (contiguous per (t, r)), each times its stream's rstd,
  // in stream order; the loop over streams unrolled so that the loads of several rows are in flight together.
  auto mixed_dot = [&](int t, int r) {
    const float* p = part + (int64_t(t) * rows + r) * S;
    float a = 0.f;
#pragma unroll
    for (int bb = 0; bb < kHcMaxStreamsDecode; ++bb)
      if (bb < S) a += rstd[t][bb] * p[bb];
    return a / float(S);
  };
  for (int q0 = threadIdx.x; q0 < T * R; q0 += 4 * kThreads) {
    float a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = q0 + i * kThreads;
      a[i] = q < T * R ? mixed_dot(q / R, q % R) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (q0 + i * kThreads < T * R) d_s[q0 + i * kThreads] = siluf_(a[i]);
  }
  if (blockIdx.x == 0 && inj)
    for (int q = threadIdx.x; q < T * S; q += kThreads) inj[q] = 2.f * sigmoidf_(mixed_dot(q / S, R + q % S));
  __syncthreads();
  if (!active) return;  // the whole warp; no barrier follows
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  for (int v0 = sub; v0 < r8; v0 += P * L) {
    if (v0 != sub) {
#pragma unroll
      for (int i = 0; i < P; ++i)
        if (v0 + i * L < r8) raw[i] = __ldg(wr + v0 + i * L);
    }
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int v = v0 + i * L;
      if (v >= r8) break;
      float wf[8];
      unpack_f16x8(raw[i], wf);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4* dp = reinterpret_cast<const float4*>(d_s + t * R + v * 8);
        const float4 p = dp[0], q = dp[1];
        acc[t] += wf[0] * p.x + wf[1] * p.y + wf[2] * p.z + wf[3] * p.w + wf[4] * q.x + wf[5] * q.y + wf[6] * q.z +
                  wf[7] * q.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float m = acc[t];
    for (int o = L / 2; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);  // the lane group's sum
    float term = sub == 0 ? sigmoidf_(m) * (xv[t] * rstd[t][b] * gn) : 0.f;
    for (int o = L; o < 32; o <<= 1) term += __shfl_xor_sync(0xffffffffu, term, o);  // over the streams
    if (lane == 0) u[int64_t(t) * H + j] = term / float(S);
  }
}

__global__ void gated_accumulate_kernel(float* __restrict__ out, const float* __restrict__ s,
                                        const float* __restrict__ gate_logit, int64_t n, int hidden, bool accumulate) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const float v = sigmoidf_(gate_logit[i / hidden]) * s[i];
    out[i] = accumulate ? out[i] + v : v;
  }
}

// The causal conv of a prefill chunk in place (launch_gdn_conv_f32), in two kernels. Rows are cut into runs of
// kGdnConvRun; a run's first K-1 taps lie in the run before, which its own thread overwrites, so gdn_conv_halo_kernel
// first copies them (and, for run 0, the conv state) into `halo` and writes the new state, then gdn_conv_runs_kernel
// walks each run with the last K-1 inputs in registers, reading every input once and writing its output in place.
// Register arrays are indexed by constants only (K is a run-time value: an index derived from it would put the array
// in local memory where the wait of pdl_begin() compiles to nothing, below 9.0).
constexpr int kConvBatch = 8;  // rows whose loads a gdn_conv_runs_kernel thread issues together
static_assert(kGdnConvMaxTaps - 1 <= kGdnConvRun, "only run 0 may read the conv state");

// halo[j][r][c] = in(j * kGdnConvRun - (K-1) + r, c) with in(p) = x[p, c] for p >= 0, else state[(K-1) + p, c], for
// run j = blockIdx.y; run 0's thread then replaces the state (time-major [K-1, C], oldest first) by the last K-1 rows
// of [state; x] in place: row r takes x's row tokens - (K-1) + r, or where that is negative the state's row tokens + r
// (> r: not yet overwritten).
__global__ void gdn_conv_halo_kernel(const float* __restrict__ x, float* __restrict__ state, float* __restrict__ halo,
                                     int tokens, int channels, int K) {
  pdl_begin();
  const int c = int(blockIdx.x) * kThreads + threadIdx.x, j = int(blockIdx.y), ctx = K - 1;
  if (c >= channels) return;
  for (int r = 0; r < ctx; ++r) {
    const int64_t p = int64_t(j) * kGdnConvRun - ctx + r;
    halo[(int64_t(j) * ctx + r) * channels + c] = p >= 0 ? x[p * channels + c] : state[(ctx + p) * channels + c];
  }
  if (j != 0) return;
  for (int r = 0; r < ctx; ++r) {
    const int64_t p = int64_t(tokens) - ctx + r;
    state[int64_t(r) * channels + c] = p >= 0 ? x[p * channels + c] : state[(int64_t(tokens) + r) * channels + c];
  }
}

// x[t, c] = silu(sum_k w[c, k] * in(t - (K-1) + k, c)) for the rows of run blockIdx.y, in place. The window is the
// last K entries of win[kGdnConvMaxTaps]: win[M-1] the row's own input, win[M-1-d] the input d rows back (M =
// kGdnConvMaxTaps), so tap k meets win[M-K+k] and the weights sit at the same places (wk[M-K+k] = w[c, k]); the run
// starts from halo, and kConvBatch rows are loaded before any is written. The products and sums in the order of the
// reference's conv (k = 0 .. K-1).
__global__ void gdn_conv_runs_kernel(float* __restrict__ x, const float* __restrict__ halo,
                                     const __half* __restrict__ w, int tokens, int channels, int K) {
  pdl_begin();
  constexpr int M = kGdnConvMaxTaps;
  const int c = int(blockIdx.x) * kThreads + threadIdx.x, j = int(blockIdx.y), ctx = K - 1;
  if (c >= channels) return;
  float wk[M], win[M];
#pragma unroll
  for (int q = 0; q < M; ++q) {
    const int k = q - (M - K);  // the tap at place q, if any
    wk[q] = k >= 0 ? to_f(w[int64_t(c) * K + k]) : 0.f;
    const int r = q - (M - 1 - ctx);  // halo row r = ctx - d sits at place M - 1 - d
    win[q] = r >= 0 && r < ctx ? halo[(int64_t(j) * ctx + r) * channels + c] : 0.f;
  }
  const int t0 = j * kGdnConvRun, t1 = min(tokens, t0 + kGdnConvRun);
  for (int tb = t0; tb < t1; tb += kConvBatch) {
    float v[kConvBatch];
#pragma unroll
    for (int u = 0; u < kConvBatch; ++u) v[u] = tb + u < t1 ? x[int64_t(tb + u) * channels + c] : 0.f;
#pragma unroll
    for (int u = 0; u < kConvBatch; ++u) {
      if (tb + u >= t1) break;
      win[M - 1] = v[u];
      float acc = 0.f;
#pragma unroll
      for (int q = 0; q < M; ++q)
        if (q >= M - K) acc += wk[q] * win[q];
      x[int64_t(tb + u) * channels + c] = siluf_(acc);
#pragma unroll
      for (int q = 0; q + 1 < M; ++q) win[q] = win[q + 1];
    }
  }
}

// New time-major conv state: the last `ctx` rows of [state; x]. One thread per channel walks the rows in order:
// row r reads old row tokens + r (> r) before any thread overwrites it, so the update is in place.
__global__ void conv_state_kernel(const float* __restrict__ x, float* __restrict__ state, int tokens, int channels,
                                  int ctx) {
  pdl_begin();
  const int c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= channels) return;
  for (int r = 0; r < ctx; ++r) {
    const int64_t p = int64_t(tokens) - ctx + r;
    state[int64_t(r) * channels + c] = p >= 0 ? x[p * channels + c] : state[(int64_t(tokens) + r) * channels + c];
  }
}

// One block per token: the PLE gate of every stream.
__global__ void ple_gate_f32_kernel(const float* __restrict__ kn, const float* __restrict__ v,
                                    const float* __restrict__ x, const __half* __restrict__ norm_query, int streams,
                                    int hidden, float eps, float* __restrict__ p) {
  pdl_begin();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x, W = int64_t(streams) * hidden;
  const float inv_sqrt_h = 1.f / sqrtf(float(hidden));
  for (int b = 0; b < streams; ++b) {
    const float* xr = x + t * W + int64_t(b) * hidden;
    const float* kr = kn + t * W + int64_t(b) * hidden;
    const __half* wr = norm_query + int64_t(b) * hidden;
    float ss = 0.f;
    for (int j = threadIdx.x; j < hidden; j += kThreads) ss += xr[j] * xr[j];
    const float r = rsqrtf(block_sum(ss, scratch) / float(hidden) + eps);
    float dot = 0.f;
    for (int j = threadIdx.x; j < hidden; j += kThreads) dot += kr[j] * ((xr[j] * r) * (1.f + to_f(wr[j])));
    float s = block_sum(dot, scratch) * inv_sqrt_h;
    const float sign = s > 0.f ? 1.f : (s < 0.f ? -1.f : 0.f);
    s = sqrtf(fmaxf(fabsf(s), 1e-6f)) * sign;
    const float g = sigmoidf_(s);
    float* pr = p + t * W + int64_t(b) * hidden;
    for (int j = threadIdx.x; j < hidden; j += kThreads) pr[j] = g * v[t * hidden + j];
  }
}

// X[t, c] += P[t, c] + silu(sum_k w[c, k] * n(t - (K-1-k)*d, c)); n(p) = N[p, c] (p >= 0) or state[ctx + p, c].
__global__ void ple_conv_add_f32_kernel(const float* __restrict__ p, const float* __restrict__ nrm,
                                        const __half* __restrict__ w, int tokens, int channels, int K, int dilation,
                                        const float* __restrict__ state, float* __restrict__ x) {
  pdl_begin();
  const int64_t n = int64_t(tokens) * channels;
  const int ctx = (K - 1) * dilation;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t t = i / channels;
    const int c = int(i % channels);
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      const int64_t q = t - int64_t(K - 1 - k) * dilation;
      const float v = q >= 0 ? nrm[q * channels + c] : state[(ctx + q) * channels + c];
      acc += to_f(w[int64_t(c) * K + k]) * v;
    }
    x[i] += p[i] + siluf_(acc);
  }
}

// Where the indexer's keys of a step live (the kernels below are written over this layout): query t of sequence
// tok_seq[t] at positions[t], rows through that sequence's block table (`page` positions per KV block,
// page % block == 0); the block-keys kernel's items are the tokens, each writing the block it completes (if any).
struct PagedIndex {
  const int32_t* tok_seq;
  const int32_t* positions;
  const int32_t* tables;
  int64_t ld;  // block-table row stride
  int page;    // positions per KV block
  int block;   // indexer block (compress ratio)
  __device__ int64_t position(int t) const { return positions[t]; }
  __device__ bool completed_block(int t, int64_t* j) const {
    const int64_t p = positions[t];
    *j = p / block;
    return (p + 1) % block == 0;
  }
  __device__ int64_t key_row(int t, int64_t p) const {
    return int64_t(tables[int64_t(tok_seq[t]) * ld + p / page]) * page + p % page;
  }
  __device__ int64_t block_row(int t, int64_t j) const {
    const int64_t p = j * block;
    return int64_t(tables[int64_t(tok_seq[t]) * ld + p / page]) * (page / block) + (p % page) / block;
  }
};

// One warp per item (see the layouts): block key j = RoPE(ZC-RMSNorm(mean of the block's raw keys; k_norm),
// position block*j), FP32.
template <class Layout>
__global__ void qsa_block_keys_f32_kernel(Layout lay, const float* __restrict__ keys, int items, int dim, int block,
                                          const __half* __restrict__ w, int rotary_dims, float theta, float eps,
                                          float* __restrict__ bkeys) {
  pdl_begin();
  __shared__ float buf[kWarps][kMaxIndexDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int item = blockIdx.x * kWarps + warp;
  int64_t j = 0;
  if (item >= items || !lay.completed_block(item, &j)) return;
  float ss = 0.f;
  for (int d = lane; d < dim; d += 32) {
    float m = 0.f;
    for (int r = 0; r < block; ++r) m += keys[lay.key_row(item, j * block + r) * dim + d];
    m /= float(block);
    buf[warp][d] = m;
    ss += m * m;
  }
  const float rs = rsqrtf(warp_sum(ss) / float(dim) + eps);
  __syncwarp();
  for (int d = lane; d < dim; d += 32) buf[warp][d] = (buf[warp][d] * rs) * (1.f + to_f(w[d]));
  __syncwarp();
  const int half_r = rotary_dims / 2;
  float* out = bkeys + lay.block_row(item, j) * dim;
  for (int d = lane; d < dim; d += 32) {
    float val = buf[warp][d];
    if (d < rotary_dims) {
      const int i = d < half_r ? d : d - half_r;
      float c, s;
      rope_cos_sin(i, rotary_dims, theta, j * block, &c, &s);
      val = d < half_r ? buf[warp][d] * c - buf[warp][d + half_r] * s : buf[warp][d] * c + buf[warp][d - half_r] * s;
    }
    out[d] = val;
  }
}

// Blocks (x: query token, y: a slice of the block keys); a warp per block key. The keys of one query are spread over
// gridDim.y blocks so that a decode step's few queries do not leave the GPU to one block each (score_slices).
template <class Layout>
__global__ void qsa_block_scores_f32_kernel(Layout lay, const float* __restrict__ qn, int heads, int dim,
                                            const float* __restrict__ bkeys, int block, int t0,
                                            float* __restrict__ scores, int64_t ld) {
  pdl_begin();
  __shared__ float qs[kMaxIndexQuery];
  const int t = t0 + blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nb = (lay.position(t) + 1) / block;
  const int width = heads * dim;
  for (int e = threadIdx.x; e < width; e += kThreads) qs[e] = qn[int64_t(t) * width + e];
  __syncthreads();
  const float sqrt_d = sqrtf(float(dim));
  float* out = scores + int64_t(blockIdx.x) * ld;
  for (int64_t j = int64_t(blockIdx.y) * kWarps + warp; j < nb; j += int64_t(kWarps) * gridDim.y) {
    const float* kr = bkeys + lay.block_row(t, j) * dim;
    float acc = 0.f;
    for (int h = 0; h < heads; ++h) {
      float dot = 0.f;
      for (int d = lane; d < dim; d += 32) dot += qs[h * dim + d] * kr[d];
      acc += fmaxf(warp_sum(dot), 0.f);
    }
    if (lane == 0) out[j] = acc / sqrt_d;
  }
}

// The same scores for a prefill's queries, tiled: block = (32 consecutive rows of the chunk, 64 block keys). When the
// tile's rows are of one sequence they share its keys: the keys and the rows' queries pass through shared memory in
// chunks of 32 dims, and thread (tq, tk) accumulates the dot products of rows 2tq, 2tq + 1 with keys tk + 16m (m <
// 4) for every head in registers (FP32 FMAs, as the warp-per-key kernel's products; the sum's order differs). A tile
// of rows of two sequences takes the warp-per-key loop over its keys.
constexpr int kScoreRows = 32, kScoreKeys = 64, kScoreDims = 32, kScorePitch = kScoreDims + 4;
constexpr int kScoreMaxHeads = 8;
template <class Layout>
__global__ void __launch_bounds__(kThreads)
    qsa_block_scores_tiled_f32_kernel(Layout lay, const float* __restrict__ qn, int heads, int dim,
                                      const float* __restrict__ bkeys, int block, int t0, int t1,
                                      float* __restrict__ scores, int64_t ld) {
  pdl_begin();
  __shared__ __align__(16) float qs[kScoreMaxHeads * kScoreRows * kScorePitch];
  __shared__ __align__(16) float ks[kScoreKeys * kScorePitch];
  __shared__ int64_t key_rows[kScoreKeys];
  const int r0 = t0 + blockIdx.x * kScoreRows, r1 = min(t1, r0 + kScoreRows);
  const int64_t j0 = int64_t(blockIdx.y) * kScoreKeys;
  int64_t nb_max = 0;
  for (int t = r0; t < r1; ++t) nb_max = max(nb_max, (lay.position(t) + 1) / block);
  if (j0 >= nb_max) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float sqrt_d = sqrtf(float(dim));  // divided by, as the warp-per-key kernel and the CPU
  const int width = heads * dim;
  if (lay.tok_seq[r0] != lay.tok_seq[r1 - 1]) {  // rows of two sequences: a warp per (row, key)
    for (int t = r0 + warp; t < r1; t += kWarps) {
      const int64_t nb = (lay.position(t) + 1) / block;
      for (int64_t j = j0; j < min(nb, j0 + kScoreKeys); ++j) {
        const float* kr = bkeys + lay.block_row(t, j) * dim;
        float acc = 0.f;
        for (int h = 0; h < heads; ++h) {
          float dot = 0.f;
          for (int d = lane; d < dim; d += 32) dot += qn[int64_t(t) * width + h * dim + d] * kr[d];
          acc += fmaxf(warp_sum(dot), 0.f);
        }
        if (lane == 0) scores[int64_t(t - t0) * ld + j] = acc / sqrt_d;
      }
    }
    return;
  }
  if (threadIdx.x < kScoreKeys) {
    const int64_t j = j0 + threadIdx.x;
    key_rows[threadIdx.x] = j < nb_max ? lay.block_row(r0, j) : -1;
  }
  const int tq = threadIdx.x / 16, tk = threadIdx.x % 16;
  float acc[kScoreMaxHeads][2][4] = {};
  for (int d0 = 0; d0 < dim; d0 += kScoreDims) {
    __syncthreads();  // key_rows written; the previous chunk's products done
    for (int e = threadIdx.x; e < kScoreKeys * kScoreDims / 4; e += kThreads) {
      const int r = e / (kScoreDims / 4), d = 4 * (e % (kScoreDims / 4));
      const int64_t row = key_rows[r];
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row >= 0 && d0 + d < dim) v = *reinterpret_cast<const float4*>(bkeys + row * dim + d0 + d);
      *reinterpret_cast<float4*>(ks + r * kScorePitch + d) = v;
    }
    for (int e = threadIdx.x; e < heads * kScoreRows * kScoreDims / 4; e += kThreads) {
      const int hr = e / (kScoreDims / 4), d = 4 * (e % (kScoreDims / 4)), h = hr / kScoreRows, r = hr % kScoreRows;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r0 + r < r1 && d0 + d < dim)
        v = *reinterpret_cast<const float4*>(qn + int64_t(r0 + r) * width + h * dim + d0 + d);
      *reinterpret_cast<float4*>(qs + hr * kScorePitch + d) = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int d = 0; d < kScoreDims; d += 4) {
      float4 kv[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) kv[m] = *reinterpret_cast<const float4*>(ks + (tk + 16 * m) * kScorePitch + d);
#pragma unroll
      for (int h = 0; h < kScoreMaxHeads; ++h) {
        if (h >= heads) break;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float4 qv = *reinterpret_cast<const float4*>(qs + (h * kScoreRows + 2 * tq + i) * kScorePitch + d);
#pragma unroll
          for (int m = 0; m < 4; ++m) acc[h][i][m] += qv.x * kv[m].x + qv.y * kv[m].y + qv.z * kv[m].z + qv.w * kv[m].w;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = r0 + 2 * tq + i;
    if (t >= r1) continue;
    const int64_t nb = (lay.position(t) + 1) / block;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int64_t j = j0 + tk + 16 * m;
      if (j >= nb) continue;
      float sc = 0.f;
#pragma unroll
      for (int h = 0; h < kScoreMaxHeads; ++h)
        if (h < heads) sc += fmaxf(acc[h][i][m], 0.f);
      scores[int64_t(t - t0) * ld + j] = sc / sqrt_d;
    }
  }
}

// One block per query token: writes its row of selected positions (see launch_qsa_expand_selection_paged).
template <class Layout>
__global__ void qsa_expand_selection_kernel(Layout lay, const int32_t* __restrict__ top, int block, int top_blocks,
                                            int t0, int32_t* __restrict__ selected, int64_t width) {
  pdl_begin();
  const int t = t0 + blockIdx.x;
  const int64_t p = lay.position(t), nb = (p + 1) / block;
  const int64_t k = nb < top_blocks ? nb : top_blocks;
  int32_t* row = selected + int64_t(t) * width;
  int64_t used;
  if (k == nb) {
    for (int64_t i = threadIdx.x; i <= p; i += kThreads) row[i] = int32_t(i);
    used = p + 1;
  } else {
    const int32_t* tr = top + int64_t(blockIdx.x) * top_blocks;
    for (int64_t e = threadIdx.x; e < k * block; e += kThreads)
      row[e] = int32_t(tr[e / block] * int64_t(block) + e % block);
    const int64_t tail = p + 1 - nb * block;
    for (int64_t i = threadIdx.x; i < tail; i += kThreads) row[k * block + i] = int32_t(nb * block + i);
    used = k * block + tail;
  }
  for (int64_t i = used + threadIdx.x; i < width; i += kThreads) row[i] = -1;
}

// Items of a query's scores row qsa_topk_kernel's tie path holds in shared memory (4,096 x 8 bytes: a 16K context at
// the released compress ratio); longer rows use the global scratch.
constexpr int kQsaTopkSharedItems = 4096;

// Order-preserving unsigned key of a score (larger score, larger key; -0 and +0 one key, as they compare equal).
__device__ __forceinline__ uint32_t score_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block's threads in thread order (blockDim.x == kThreads), returned to each
// thread, with the block's sum in `total`; warp_total: kWarps ints of shared memory. Two barriers: every thread of the
// block calls it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_total, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? warp_total[w] : 0;
    total += warp_total[w];
  }
  __syncthreads();  // warp_total may be rewritten by the next call
  return before + incl - v;
}

// Keys of a scores row that qsa_topk_kernel's radix passes hold in registers per thread (rows of up to
// kThreads * kQsaTopkKeyRegs items, an 8K context at the released compress ratio); longer rows are read again.
constexpr int kQsaTopkKeyRegs = 8;
static_assert(kThreads == 256, "qsa_topk_kernel: one thread per radix bin");

// One block per query token with more complete blocks than top_blocks: the top_blocks indices of its scores row that
// torch.topk (CPU) would choose, written to top[blockIdx.x]. A 4-pass radix select finds the k-th largest key and
// how many of the items equal to it are taken (each pass a histogram of the next 8 bits, one thread per bin, and a
// block scan from the top bin down that the one bin holding the k-th key recognises); when that is all of them (no
// tie across the k-th score) the choice is the set of items at or above it, written in index order by an ordered
// compaction (a block scan of the threads' counts); otherwise (a tie across the boundary, or a NaN) one thread runs
// torch's own selection (ops/torch_topk_order.h) on the row, held in shared memory where the launch gave
// `smem_items` >= the row's items of it (a single thread's selection waits on every access: shared memory's latency,
// not L2's), else in `scratch`.
template <class Layout>
__global__ void qsa_topk_kernel(Layout lay, const float* __restrict__ scores, int64_t ld, int block, int top_blocks,
                                int t0, topk::Scored* __restrict__ scratch, int32_t* __restrict__ top, int smem_items) {
  pdl_begin();
  extern __shared__ topk::Scored tie_items[];
  const int t = t0 + blockIdx.x;
  const int64_t nb = (lay.position(t) + 1) / block;
  if (nb <= top_blocks) return;  // takes every block: its row of `top` is not read
  const float* s = scores + int64_t(blockIdx.x) * ld;
  int32_t* out = top + int64_t(blockIdx.x) * top_blocks;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t prefix, mask, eq_count;
  __shared__ int64_t remaining;
  __shared__ int has_nan;
  __shared__ int warp_total[kWarps];
  if (threadIdx.x == 0) prefix = 0, mask = 0, remaining = top_blocks, has_nan = 0;
  __syncthreads();  // has_nan is set below
  const bool in_regs = nb <= int64_t(kThreads) * kQsaTopkKeyRegs;
  uint32_t keys[kQsaTopkKeyRegs];
  if (in_regs) {
    bool nan = false;
#pragma unroll
    for (int i = 0; i < kQsaTopkKeyRegs; ++i) {
      const int64_t j = threadIdx.x + int64_t(i) * kThreads;
      const float f = j < nb ? s[j] : 0.f;
      nan |= f != f;
      keys[i] = score_key(f);
    }
    if (nan) has_nan = 1;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[threadIdx.x] = 0;
    __syncthreads();
    if (in_regs) {
#pragma unroll
      for (int i = 0; i < kQsaTopkKeyRegs; ++i)
        if (threadIdx.x + int64_t(i) * kThreads < nb && (keys[i] & mask) == prefix)
          atomicAdd(&hist[(keys[i] >> shift) & 255u], 1u);
    } else {
      for (int64_t j = threadIdx.x; j < nb; j += kThreads) {
        const float f = s[j];
        if (f != f) has_nan = 1;
        const uint32_t key = score_key(f);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
    }
    __syncthreads();
    // Thread i takes bin d = 255 - i: the scan gives the items in the bins above d, and the k-th largest key is in
    // the one bin d with above < remaining <= above + hist[d] (the highest bin whose cumulative count from the top
    // reaches `remaining`).
    const int64_t rem = remaining;  // read by every thread before the bin that holds the k-th key rewrites it
    const int d = 255 - int(threadIdx.x);
    const int h = int(hist[d]);
    int total;
    const int above = block_exclusive_scan(h, warp_total, total);
    if (above < rem && above + h >= rem) {
      remaining = rem - above;
      prefix |= uint32_t(d) << shift;
      mask |= 255u << shift;
      eq_count = uint32_t(h);
    }
    __syncthreads();
  }
  if (!has_nan && remaining == int64_t(eq_count)) {  // the set {key >= k-th key} has exactly top_blocks items
    const int64_t chunk = (nb + kThreads - 1) / kThreads, j0 = threadIdx.x * chunk;
    const int64_t j1 = j0 + chunk < nb ? j0 + chunk : nb;
    int32_t c = 0;
    for (int64_t j = j0; j < j1; ++j) c += score_key(s[j]) >= prefix;
    int total;
    int32_t at = block_exclusive_scan(c, warp_total, total);
    for (int64_t j = j0; j < j1; ++j)
      if (score_key(s[j]) >= prefix) out[at++] = int32_t(j);
    return;
  }
  // A tie across the k-th score: which equal items torch keeps is its algorithm's (one thread), the row copied in and
  // the choice copied out by the whole block.
  topk::Scored* items = nb <= smem_items ? tie_items : scratch + int64_t(blockIdx.x) * ld;
  for (int64_t j = threadIdx.x; j < nb; j += kThreads) items[j] = topk::Scored{s[j], int32_t(j)};
  __syncthreads();
  if (threadIdx.x == 0) topk::torch_topk_select(items, nb, top_blocks);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < top_blocks; i += kThreads) out[i] = items[i].index;
}

// The templates as sm_70 kernels for the NVRTC check (scripts/check-sm70.sh compiles device code only).
#define FN_DECODE_KERNELS(TT)                                                                                          \
  template __global__ void gemv_f16w_f32x_kernel<TT, 1>(const float*, int64_t, int, GemvSegments, int, bool);          \
  template __global__ void gemv_w8_f32x_kernel<TT, false>(const float*, int64_t, int, GemvSegments8, int, bool);       \
  template __global__ void gemv_w8_f32x_kernel<TT, true>(const float*, int64_t, int, GemvSegments8, int, bool);        \
  template __global__ void gemv_f16w_f32x_kernel<TT, kGemvRows>(const float*, int64_t, int, GemvSegments, int, bool);  \
  template __global__ void shared_down_decode_kernel<TT>(const float*, const float*, const __half*, const float*, int, \
                                                         int, float*, bool, bool);                                     \
  template __global__ void hc_down_kernel<TT>(const float*, const float*, const float*, const __half*, const __half*,  \
                                              const __half*, int, int, int, int, float*, float*, bool);                \
  template __global__ void hc_up_kernel<TT>(float*, const float*, const float*, const __half*, const __half*,          \
                                            const float*, const float*, int, int, int, int, float, float*, float*,     \
                                            bool);
FN_DECODE_KERNELS(1)
FN_DECODE_KERNELS(2)
FN_DECODE_KERNELS(3)
FN_DECODE_KERNELS(4)
FN_DECODE_KERNELS(5)
FN_DECODE_KERNELS(6)
FN_DECODE_KERNELS(7)
FN_DECODE_KERNELS(8)
#undef FN_DECODE_KERNELS
template __global__ void qsa_topk_kernel<PagedIndex>(PagedIndex, const float*, int64_t, int, int, int, topk::Scored*,
                                                     int32_t*, int);
template __global__ void qsa_block_keys_f32_kernel<PagedIndex>(PagedIndex, const float*, int, int, int, const __half*,
                                                               int, float, float, float*);
template __global__ void qsa_block_scores_f32_kernel<PagedIndex>(PagedIndex, const float*, int, int, const float*, int,
                                                                 int, float*, int64_t);
template __global__ void qsa_block_scores_tiled_f32_kernel<PagedIndex>(PagedIndex, const float*, int, int, const float*,
                                                                       int, int, int, float*, int64_t);
template __global__ void qsa_expand_selection_kernel<PagedIndex>(PagedIndex, const int32_t*, int, int, int, int32_t*,
                                                                 int64_t);

// One block per row: stream compaction of the entries in [0, rows), in order. Each thread takes kCompactPer
// consecutive entries of a round of kThreads * kCompactPer (all of a round's loads in flight at once: a decode row of
// 2,048 selected tokens is one round) and a block-wide exclusive scan of the threads' counts places them.
constexpr int kCompactPer = 8;
__global__ void compact_selection_kernel(const int32_t* __restrict__ selected, int tokens, int n_sel, int64_t rows,
                                         int32_t* __restrict__ compact, int32_t* __restrict__ counts, int32_t* status) {
  pdl_begin();
  __shared__ int warp_total[kWarps];
  const int t = int(blockIdx.x);
  const int32_t* in = selected + int64_t(t) * n_sel;
  int32_t* out = compact + int64_t(t) * n_sel;
  int base = 0;
  for (int r0 = 0; r0 < n_sel; r0 += kThreads * kCompactPer) {
    const int i0 = r0 + int(threadIdx.x) * kCompactPer;
    int32_t v[kCompactPer];
#pragma unroll
    for (int u = 0; u < kCompactPer; ++u) v[u] = i0 + u < n_sel ? in[i0 + u] : -1;
    int count = 0;
#pragma unroll
    for (int u = 0; u < kCompactPer; ++u) {
      if (v[u] >= rows && status) atomicOr(status, 1);
      count += v[u] >= 0 && v[u] < rows;
    }
    int total;
    int pos = base + block_exclusive_scan(count, warp_total, total);
#pragma unroll
    for (int u = 0; u < kCompactPer; ++u)
      if (v[u] >= 0 && v[u] < rows) out[pos++] = v[u];
    base += total;
  }
  if (threadIdx.x == 0) counts[t] = base;
}

// x2 = [hi; lo] of x (launch_split_f16x2), 8 elements a thread where `vec` (as f32_to_f16_kernel).
__global__ void split_f16x2_kernel(const float* __restrict__ x, __half* __restrict__ x2, int64_t rows, int cols,
                                   bool vec) {
  pdl_begin();
  const int64_t n = rows * cols;
  const int64_t stride = int64_t(gridDim.x) * kThreads, first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (vec) {
    for (int64_t i = first; i < n / kCastVec; i += stride) {
      float v[kCastVec];
      load_f32x8(x, i, v);
      __align__(16) __half hi[kCastVec], lo[kCastVec];
#pragma unroll
      for (int k = 0; k < kCastVec; ++k) split_f16x2(v[k], &hi[k], &lo[k]);
      reinterpret_cast<uint4*>(x2)[i] = *reinterpret_cast<const uint4*>(hi);
      reinterpret_cast<uint4*>(x2 + n)[i] = *reinterpret_cast<const uint4*>(lo);
    }
    return;
  }
  for (int64_t i = first; i < n; i += stride) split_f16x2(x[i], &x2[i], &x2[n + i]);
}

__global__ void sum_halves_kernel(const float* __restrict__ y2, float* __restrict__ y, int64_t rows, int cols,
                                  const __half* __restrict__ bias) {
  pdl_begin();
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    float v = y2[i] + y2[n + i];
    if (bias) v += to_f(bias[i % cols]);
    y[i] = v;
  }
}

__global__ void silu_mul_f32_kernel(const float* __restrict__ g, const float* __restrict__ up, float* __restrict__ y,
                                    int64_t n) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    y[i] = siluf_(g[i]) * up[i];
}

// Rows of sorted slot r in the expert-segmented [2*slots, width] layout: hi row and lo row.
__device__ __forceinline__ void moe_split_rows(const int32_t* ids, const int32_t* offsets, int32_t slot, int32_t r,
                                               int64_t* hi, int64_t* lo) {
  const int e = ids[slot];
  const int off = offsets[e], n = offsets[e + 1] - off;
  *hi = 2 * int64_t(off) + (r - off);
  *lo = *hi + n;
}

// One block per sorted slot.
__global__ void moe_gather_f16x2_kernel(const float* __restrict__ u, const int32_t* __restrict__ ids,
                                        const int32_t* __restrict__ sorted, const int32_t* __restrict__ offsets,
                                        int top_k, int hidden, __half* __restrict__ x2) {
  pdl_begin();
  const int r = blockIdx.x;
  const int32_t s = sorted[r];
  int64_t hi, lo;
  moe_split_rows(ids, offsets, s, r, &hi, &lo);
  const float* src = u + int64_t(s / top_k) * hidden;
  for (int c = threadIdx.x; c < hidden; c += kThreads) split_f16x2(src[c], &x2[hi * hidden + c], &x2[lo * hidden + c]);
}

__global__ void moe_act_f16x2_kernel(const float* __restrict__ g2, const float* __restrict__ up2,
                                     const int32_t* __restrict__ ids, const int32_t* __restrict__ sorted,
                                     const int32_t* __restrict__ offsets, int inter, __half* __restrict__ a2) {
  pdl_begin();
  const int r = blockIdx.x;
  int64_t hi, lo;
  moe_split_rows(ids, offsets, sorted[r], r, &hi, &lo);
  for (int c = threadIdx.x; c < inter; c += kThreads) {
    const float g = g2[hi * inter + c] + g2[lo * inter + c], v = up2[hi * inter + c] + up2[lo * inter + c];
    split_f16x2(siluf_(g) * v, &a2[hi * inter + c], &a2[lo * inter + c]);
  }
}

__global__ void moe_combine_f16x2_kernel(const float* __restrict__ y2, const int32_t* __restrict__ ids,
                                         const int32_t* __restrict__ slot_row, const int32_t* __restrict__ offsets,
                                         const float* __restrict__ weights, int tokens, int top_k, int hidden,
                                         const float* __restrict__ shared, float* __restrict__ out) {
  pdl_begin();
  const int64_t n = int64_t(tokens) * hidden;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t t = idx / hidden, c = idx % hidden;
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int32_t s = int32_t(t * top_k + j), r = slot_row[s];
      if (r < 0) continue;
      int64_t hi, lo;
      moe_split_rows(ids, offsets, s, r, &hi, &lo);
      acc += (y2[hi * hidden + c] + y2[lo * hidden + c]) * weights[s];
    }
    out[idx] = shared ? acc + shared[idx] : acc;
  }
}

}  // namespace

__global__ void copy_rows_indexed_kernel(const uint32_t* src, uint32_t* dst, const int32_t* rows, int64_t n,
                                         int64_t words, int64_t limit, bool scatter, int32_t* status) {
  pdl_begin();
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t r = rows[i];
    if (r < 0 || r >= limit) {
      if (threadIdx.x == 0) atomicOr(status, 1);
      continue;
    }
    const uint32_t* s = src + (scatter ? i : int64_t(r)) * words;
    uint32_t* d = dst + (scatter ? int64_t(r) : i) * words;
    for (int64_t j = threadIdx.x; j < words; j += blockDim.x) d[j] = s[j];
  }
}

// Causal conv over state slots, a thread per (sequence b, channel): the rows seq_starts[b] .. seq_starts[b+1] of
// `in` in order (seq_starts null: row b alone, a decode step), taps over [state rows of slot slots[b]; in] spaced by
// `dilation` (the same summation order as gdn_conv_runs_kernel / ple_conv_add_f32_kernel), the state shifted by one
// row in place per row (oldest dropped, the row appended), so n rows equal n decode steps bit for bit. accumulate:
// out += add + silu(conv) (PLE); else out = silu(conv) (GDN; out may alias in: a thread reads an element before it
// writes it, and only its own).
__global__ void conv_slots_kernel(const float* in, const float* __restrict__ add, float* out, bool accumulate,
                                  float* __restrict__ state_pool, const int32_t* __restrict__ slots,
                                  const int32_t* __restrict__ seq_starts, const __half* __restrict__ w, int batch,
                                  int channels, int K, int dilation) {
  pdl_begin();
  const int64_t n = int64_t(batch) * channels;
  const int ctx = (K - 1) * dilation;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t b = i / channels;
    const int c = int(i % channels);
    float* st = state_pool + int64_t(slots[b]) * ctx * channels;
    const int64_t r0 = seq_starts ? seq_starts[b] : b, r1 = seq_starts ? seq_starts[b + 1] : b + 1;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r * channels + c;
      const float v = in[e];
      float acc = 0.f;
      for (int k = 0; k < K; ++k) {
        const float x = k == K - 1 ? v : st[int64_t(ctx - (K - 1 - k) * dilation) * channels + c];
        acc += to_f(w[int64_t(c) * K + k]) * x;
      }
      if (ctx > 0) {
        for (int q = 0; q + 1 < ctx; ++q) st[int64_t(q) * channels + c] = st[int64_t(q + 1) * channels + c];
        st[int64_t(ctx - 1) * channels + c] = v;
      }
      if (accumulate) {
        out[e] += add[e] + siluf_(acc);
      } else {
        out[e] = siluf_(acc);
      }
    }
  }
}

#ifndef __CUDACC_RTC__  // host launchers
namespace {
/// Slices of the block keys per query for the scores kernel: enough blocks in all (about 512) for a few queries,
/// at least 32 keys per block, 1 for a prefill's many queries.
unsigned score_slices(int rows, int64_t ld) {
  const int64_t want = (512 + rows - 1) / rows, most = (ld + 31) / 32, n = want < most ? want : most;
  return unsigned(n > 1 ? n : 1);
}
}  // namespace (NVRTC, used by the SM70 check, compiles device code only)
namespace {
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);  // grid-stride loops cover the rest
}
}  // namespace

namespace {
/// Whether the cast kernels take 8 elements a thread: n a multiple of 8 and every pointer 16-byte aligned.
bool cast_vectorized(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % kCastVec != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
}  // namespace

cudaError_t launch_f32_to_f16(const float* x, __half* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = cast_vectorized(n, {x, y});
  launch(f32_to_f16_kernel, grid_for(vec ? n / kCastVec : n), kThreads, 0, stream, x, y, n, vec);
  return cudaGetLastError();
}

bool kernels_wait_for_dependencies() {
  return kernel_waits_for_dependencies(reinterpret_cast<const void*>(gemv_f16w_f32x_kernel<1, 1>));
}

cudaError_t launch_noop(cudaStream_t stream) {
  noop_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_f16_to_f32(const __half* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch(f16_to_f32_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
  return cudaGetLastError();
}

cudaError_t launch_weight_to_f16(const void* src, int src_type, __half* dst, int64_t n, uint32_t* stats,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch(weight_to_f16_kernel, grid_for(n), kThreads, 0, stream, src, src_type, dst, n, stats);
  return cudaGetLastError();
}

cudaError_t launch_embedding_f32(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens,
                                 int reps, float* out, int32_t* status, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  launch(embedding_f32_kernel, tokens, kThreads, 0, stream, table, vocab, hidden, ids, reps, out, status);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* y, const __half* bias, int64_t rows, int cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  launch(add_bias_kernel, grid_for(n), kThreads, 0, stream, y, bias, n, cols);
  return cudaGetLastError();
}

cudaError_t launch_linear_f32_narrow(const float* x, const __half* w, float* y, int tokens, int in, int out,
                                     cudaStream_t stream) {
  const int64_t items = int64_t(tokens) * out;
  if (items == 0) return cudaSuccess;
  launch(linear_f32_narrow_kernel, unsigned((items + kWarps - 1) / kWarps), kThreads, 0, stream, x, w, y, tokens, in,
         out);
  return cudaGetLastError();
}

cudaError_t launch_gemv_f16w_f32x(const float* x, int64_t ldx, int K, const GemvSegments& segments, int tokens,
                                  cudaStream_t stream) {
  if (tokens == 0 || segments.count == 0) return cudaSuccess;
  if (segments.count > kGemvMaxSegments) return cudaErrorInvalidValue;
  // Rows per warp: from 2 tokens on, kGemvRows where the product has rows for about 4,096 warps at 8 warps per group
  // (2,048 rows); the router's 512 rows and the shared expert's 1,280 keep one (2 rows a warp made the latter slower
  // on the H100: 1.37 -> 1.49 ms a 4-token step). One token: 1. FLASHNEXT_CUDA_GEMV_ROWS=1: always 1 (for
  // before/after measurements).
  static const bool one_row = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_GEMV_ROWS");
    return v && std::atoi(v) == 1;
  }();
  const int R = tokens > 1 && !one_row && int64_t(segments.rows_end[segments.count - 1]) * kWarps / kGemvRows >= 4096
                    ? kGemvRows
                    : 1;
  GemvSegments seg = segments;
  int groups = 0;
  for (int i = 0; i < seg.count; ++i) {
    const int n = seg.rows_end[i] - (i ? seg.rows_end[i - 1] : 0);
    groups += (n + R - 1) / R;
    seg.groups_end[i] = groups;
  }
  if (groups == 0) return cudaSuccess;
  // Warps per group: enough in all for about 4,096 warps (16 KB of 16-byte loads in flight per SM at 4 deep), at most
  // FLASHNEXT_CUDA_GEMV_SPLIT (1, 2, 4 or 8, default 8; 1: one warp per group, for before/after measurements).
  static const int max_parts = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_GEMV_SPLIT");
    const int p = v ? std::atoi(v) : kWarps;
    return p == 1 || p == 2 || p == 4 ? p : kWarps;
  }();
  int parts = 1;
  while (parts < max_parts && int64_t(groups) * parts < 4096) parts *= 2;
  const int groups_per_block = kWarps / parts;
  const unsigned blocks = unsigned((int64_t(groups) + groups_per_block - 1) / groups_per_block);
  const bool early = early_weights();
  switch (tokens * 2 + (R == 1 ? 0 : 1)) {
#define FN_GEMV_CASE(TT)                                                                                     \
  case TT * 2:                                                                                               \
    launch(gemv_f16w_f32x_kernel<TT, 1>, blocks, kThreads, 0, stream, x, ldx, K, seg, parts, early);         \
    break;                                                                                                   \
  case TT * 2 + 1:                                                                                           \
    launch(gemv_f16w_f32x_kernel<TT, kGemvRows>, blocks, kThreads, 0, stream, x, ldx, K, seg, parts, early); \
    break;
    FN_GEMV_CASE(1) FN_GEMV_CASE(2) FN_GEMV_CASE(3) FN_GEMV_CASE(4)
    FN_GEMV_CASE(5) FN_GEMV_CASE(6) FN_GEMV_CASE(7) FN_GEMV_CASE(8)
#undef FN_GEMV_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_gemv_w8_f32x(const float* x, int64_t ldx, int K, const GemvSegments8& seg, int tokens,
                                cudaStream_t stream) {
  if (tokens == 0 || seg.count == 0) return cudaSuccess;
  if (seg.count > kGemvMaxSegments || K % 16 != 0) return cudaErrorInvalidValue;
  for (int i = 0; i < seg.count; ++i)
    if (seg.group[i] <= 0 || (seg.group[i] < K && seg.group[i] % 16 != 0)) return cudaErrorInvalidValue;
  const int rows = seg.rows_end[seg.count - 1];
  if (rows == 0) return cudaSuccess;
  // Warps per row as launch_gemv_f16w_f32x: enough for about 4,096 warps, at most 8.
  int parts = 1;
  while (parts < kWarps && int64_t(rows) * parts < 4096) parts *= 2;
  const unsigned blocks = unsigned((int64_t(rows) + kWarps / parts - 1) / (kWarps / parts));
  const bool early = early_weights();
  switch (tokens * 2 + (seg.fp8 ? 1 : 0)) {
#define FN_GEMV8_CASE(TT)                                                                              \
  case TT * 2:                                                                                         \
    launch(gemv_w8_f32x_kernel<TT, false>, blocks, kThreads, 0, stream, x, ldx, K, seg, parts, early); \
    break;                                                                                             \
  case TT * 2 + 1:                                                                                     \
    launch(gemv_w8_f32x_kernel<TT, true>, blocks, kThreads, 0, stream, x, ldx, K, seg, parts, early);  \
    break;
    FN_GEMV8_CASE(1)
    FN_GEMV8_CASE(2) FN_GEMV8_CASE(3) FN_GEMV8_CASE(4) FN_GEMV8_CASE(5) FN_GEMV8_CASE(6) FN_GEMV8_CASE(7)
        FN_GEMV8_CASE(8)
#undef FN_GEMV8_CASE
            default : return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_w8_to_f16(const uint8_t* codes, bool fp8, const float* scale, int group, bool apply_scales,
                             int64_t rows, int cols, __half* dst, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  if (group <= 0) return cudaErrorInvalidValue;
  launch(w8_to_f16_kernel, grid_for(n), kThreads, 0, stream, codes, fp8, scale, group, apply_scales, rows, cols, dst);
  return cudaGetLastError();
}

cudaError_t launch_scale_columns(float* y, int64_t rows, int cols, int64_t ldy, const float* scale, const __half* bias,
                                 cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  launch(scale_columns_kernel, grid_for(n), kThreads, 0, stream, y, rows, cols, ldy, scale, bias);
  return cudaGetLastError();
}

cudaError_t launch_shared_down_decode(const float* g, const float* up, const __half* down, const float* gate_logit,
                                      int tokens, int inter, int hidden, float* out, bool accumulate,
                                      cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  if (inter % 8 != 0) return cudaErrorInvalidValue;
  const unsigned blocks = unsigned((int64_t(hidden) + kWarps - 1) / kWarps);
  switch (tokens) {
#define FN_SHARED_CASE(TT)                                                                                          \
  case TT:                                                                                                          \
    launch(shared_down_decode_kernel<TT>, blocks, kThreads, 0, stream, g, up, down, gate_logit, inter, hidden, out, \
           accumulate, early_weights());                                                                            \
    break;
    FN_SHARED_CASE(1) FN_SHARED_CASE(2) FN_SHARED_CASE(3) FN_SHARED_CASE(4)
    FN_SHARED_CASE(5) FN_SHARED_CASE(6) FN_SHARED_CASE(7) FN_SHARED_CASE(8)
#undef FN_SHARED_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

bool hc_read_decode_supported(int tokens, int streams, int hidden, int rank) {
  return tokens >= 1 && tokens <= kGemvMaxTokens && streams >= 1 && streams <= kHcMaxStreamsDecode &&
         (streams & (streams - 1)) == 0 && hidden % 8 == 0 && rank % 8 == 0 &&
         int64_t(tokens) * rank * sizeof(float) <= 48 * 1024;
}

int64_t hc_read_decode_scratch(int tokens, int streams, int rank, bool inject) {
  return int64_t(tokens) * streams * (rank + (inject ? streams : 0) + 1);
}

cudaError_t launch_hc_read_decode(float* X, const float* add_out, const float* add_inj, const __half* norm_w,
                                  const __half* down, const __half* up, const __half* inject, int tokens, int streams,
                                  int hidden, int rank, float eps, float* scratch, float* u, float* inj,
                                  cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (!hc_read_decode_supported(tokens, streams, hidden, rank)) return cudaErrorInvalidValue;
  const int rows = rank + (inject ? streams : 0);
  if (!inject) inj = nullptr;  // no inject rows: nothing to write (their partials do not exist)
  float* part = scratch;                                   // [tokens, rows, streams]
  float* ss = scratch + int64_t(tokens) * rows * streams;  // [tokens, streams]
  const dim3 down_grid(unsigned((rows + kHcDownRows - 1) / kHcDownRows), unsigned(streams));
  const unsigned down_threads = unsigned(std::min(kHcDownThreads, (hidden / 8 + 31) / 32 * 32));
  const unsigned up_blocks = unsigned((hidden + kWarps - 1) / kWarps);
  const size_t up_smem = size_t(tokens) * rank * sizeof(float);
  const bool early = early_weights();
  switch (tokens) {
#define FN_HC_CASE(TT)                                                                                                 \
  case TT:                                                                                                             \
    launch(hc_down_kernel<TT>, down_grid, down_threads, 0, stream, X, add_out, add_inj, norm_w, down, inject, streams, \
           hidden, rank, rows, part, ss, early);                                                                       \
    launch(hc_up_kernel<TT>, up_blocks, kThreads, up_smem, stream, X, add_out, add_inj, norm_w, up, part, ss, streams, \
           hidden, rank, rows, eps, u, inj, early);                                                                    \
    break;
    FN_HC_CASE(1) FN_HC_CASE(2) FN_HC_CASE(3) FN_HC_CASE(4)
    FN_HC_CASE(5) FN_HC_CASE(6) FN_HC_CASE(7) FN_HC_CASE(8)
#undef FN_HC_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_gated_accumulate(float* out, const float* s, const float* gate_logit, int tokens, int hidden,
                                    bool accumulate, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * hidden;
  if (n == 0) return cudaSuccess;
  launch(gated_accumulate_kernel, grid_for(n), kThreads, 0, stream, out, s, gate_logit, n, hidden, accumulate);
  return cudaGetLastError();
}

int64_t gdn_conv_halo_floats(int tokens, int channels, int kernel) {
  return (int64_t(tokens) + kGdnConvRun - 1) / kGdnConvRun * (kernel - 1) * channels;
}

cudaError_t launch_gdn_conv_f32(float* x, float* state, const __half* w, float* halo, int tokens, int channels,
                                int kernel, cudaStream_t stream) {
  if (tokens == 0 || channels == 0) return cudaSuccess;
  if (kernel < 1 || kernel > kGdnConvMaxTaps) return cudaErrorInvalidValue;
  if (tokens > kGdnConvMaxRows) return cudaErrorInvalidValue;  // grid y
  const int64_t runs = (int64_t(tokens) + kGdnConvRun - 1) / kGdnConvRun;
  const dim3 grid(unsigned((channels + kThreads - 1) / kThreads), unsigned(runs));
  if (kernel > 1) launch(gdn_conv_halo_kernel, grid, kThreads, 0, stream, x, state, halo, tokens, channels, kernel);
  launch(gdn_conv_runs_kernel, grid, kThreads, 0, stream, x, halo, w, tokens, channels, kernel);
  return cudaGetLastError();
}

cudaError_t launch_conv_slots(const float* in, const float* add, float* out, bool accumulate, float* state_pool,
                              const int32_t* slots, const int32_t* seq_starts, const __half* w, int batch, int channels,
                              int kernel, int dilation, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  launch(conv_slots_kernel, grid_for(int64_t(batch) * channels), kThreads, 0, stream, in, add, out, accumulate,
         state_pool, slots, seq_starts, w, batch, channels, kernel, dilation);
  return cudaGetLastError();
}

cudaError_t launch_ple_gate_f32(const float* kn, const float* v, const float* x, const __half* norm_query, int tokens,
                                int streams, int hidden, float eps, float* p, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  launch(ple_gate_f32_kernel, tokens, kThreads, 0, stream, kn, v, x, norm_query, streams, hidden, eps, p);
  return cudaGetLastError();
}

cudaError_t launch_ple_conv_add_f32(const float* p, const float* n, const __half* w, int tokens, int channels,
                                    int kernel, int dilation, float* state, float* x, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  launch(ple_conv_add_f32_kernel, grid_for(int64_t(tokens) * channels), kThreads, 0, stream, p, n, w, tokens, channels,
         kernel, dilation, state, x);
  const int ctx = (kernel - 1) * dilation;
  if (ctx > 0)
    launch(conv_state_kernel, (channels + kThreads - 1) / kThreads, kThreads, 0, stream, n, state, tokens, channels,
           ctx);
  return cudaGetLastError();
}

cudaError_t launch_qsa_pool_blocks_paged_f32(const QsaPagedIndex& pi, const float* key_pool, int tokens, int dim,
                                             const __half* k_norm, int rotary_dims, float theta, float eps,
                                             float* pooled_pool, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (dim > kMaxIndexDim || pi.page % pi.block != 0) return cudaErrorInvalidValue;
  const PagedIndex lay{pi.tok_seq, pi.positions, pi.tables, pi.ld, pi.page, pi.block};
  launch(qsa_block_keys_f32_kernel<PagedIndex>, (tokens + kWarps - 1) / kWarps, kThreads, 0, stream, lay, key_pool,
         tokens, dim, pi.block, k_norm, rotary_dims, theta, eps, pooled_pool);
  return cudaGetLastError();
}

cudaError_t launch_qsa_block_scores_paged_f32(const QsaPagedIndex& pi, const float* qn, int heads, int dim,
                                              const float* pooled_pool, int t0, int t1, float* scores, int64_t ld,
                                              bool tiled, cudaStream_t stream) {
  if (t1 <= t0) return cudaSuccess;
  if (heads * dim > kMaxIndexQuery || pi.page % pi.block != 0) return cudaErrorInvalidValue;
  const PagedIndex lay{pi.tok_seq, pi.positions, pi.tables, pi.ld, pi.page, pi.block};
  if (tiled && heads <= kScoreMaxHeads && dim % 4 == 0 && reinterpret_cast<uintptr_t>(qn) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(pooled_pool) % 16 == 0) {
    const dim3 grid(unsigned((t1 - t0 + kScoreRows - 1) / kScoreRows), unsigned((ld + kScoreKeys - 1) / kScoreKeys));
    launch(qsa_block_scores_tiled_f32_kernel<PagedIndex>, grid, kThreads, 0, stream, lay, qn, heads, dim, pooled_pool,
           pi.block, t0, t1, scores, ld);
    return cudaGetLastError();
  }
  const dim3 grid(unsigned(t1 - t0), score_slices(t1 - t0, ld));
  launch(qsa_block_scores_f32_kernel<PagedIndex>, grid, kThreads, 0, stream, lay, qn, heads, dim, pooled_pool, pi.block,
         t0, scores, ld);
  return cudaGetLastError();
}

cudaError_t launch_qsa_expand_selection_paged(const QsaPagedIndex& pi, const int32_t* top, int top_blocks, int t0,
                                              int t1, int32_t* selected, int64_t width, cudaStream_t stream) {
  if (t1 <= t0) return cudaSuccess;
  const PagedIndex lay{pi.tok_seq, pi.positions, pi.tables, pi.ld, pi.page, pi.block};
  launch(qsa_expand_selection_kernel<PagedIndex>, t1 - t0, kThreads, 0, stream, lay, top, pi.block, top_blocks, t0,
         selected, width);
  return cudaGetLastError();
}

cudaError_t launch_qsa_topk_paged(const QsaPagedIndex& pi, const float* scores, int64_t ld, int top_blocks, int t0,
                                  int t1, topk::Scored* scratch, int32_t* top, cudaStream_t stream) {
  if (t1 <= t0) return cudaSuccess;
  const PagedIndex lay{pi.tok_seq, pi.positions, pi.tables, pi.ld, pi.page, pi.block};
  // The tie path's row in shared memory up to kQsaTopkSharedItems items (32 KB: no opt-in beyond 48 KB needed).
  const int smem_items = ld <= kQsaTopkSharedItems ? int(ld) : 0;
  launch(qsa_topk_kernel<PagedIndex>, t1 - t0, kThreads, size_t(smem_items) * sizeof(topk::Scored), stream, lay, scores,
         ld, pi.block, top_blocks, t0, scratch, top, smem_items);
  return cudaGetLastError();
}

cudaError_t launch_compact_selection(const int32_t* selected, int tokens, int n_sel, int64_t rows, int32_t* compact,
                                     int32_t* counts, int32_t* status, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  launch(compact_selection_kernel, tokens, kThreads, 0, stream, selected, tokens, n_sel, rows, compact, counts, status);
  return cudaGetLastError();
}

cudaError_t launch_split_f16x2(const float* x, __half* x2, int64_t rows, int cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const bool vec = cast_vectorized(n, {x, x2, x2 + n});
  launch(split_f16x2_kernel, grid_for(vec ? n / kCastVec : n), kThreads, 0, stream, x, x2, rows, cols, vec);
  return cudaGetLastError();
}

cudaError_t launch_sum_halves(const float* y2, float* y, int64_t rows, int cols, const __half* bias,
                              cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  launch(sum_halves_kernel, grid_for(n), kThreads, 0, stream, y2, y, rows, cols, bias);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul_f32(const float* g, const float* up, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch(silu_mul_f32_kernel, grid_for(n), kThreads, 0, stream, g, up, y, n);
  return cudaGetLastError();
}

cudaError_t launch_moe_gather_f16x2(const float* u, const int32_t* ids, const int32_t* sorted, const int32_t* offsets,
                                    int slots, int top_k, int hidden, __half* x2, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  launch(moe_gather_f16x2_kernel, slots, kThreads, 0, stream, u, ids, sorted, offsets, top_k, hidden, x2);
  return cudaGetLastError();
}

cudaError_t launch_moe_act_f16x2(const float* g2, const float* up2, const int32_t* ids, const int32_t* sorted,
                                 const int32_t* offsets, int slots, int inter, __half* a2, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  launch(moe_act_f16x2_kernel, slots, kThreads, 0, stream, g2, up2, ids, sorted, offsets, inter, a2);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine_f16x2(const float* y2, const int32_t* ids, const int32_t* slot_row,
                                     const int32_t* offsets, const float* weights, int tokens, int top_k, int hidden,
                                     const float* shared, float* out, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * hidden;
  if (n == 0) return cudaSuccess;
  launch(moe_combine_f16x2_kernel, grid_for(n), kThreads, 0, stream, y2, ids, slot_row, offsets, weights, tokens, top_k,
         hidden, shared, out);
  return cudaGetLastError();
}

cudaError_t launch_copy_rows_indexed(const void* src, void* dst, const int32_t* rows, int64_t n, int64_t words,
                                     int64_t limit, bool scatter, int32_t* status, cudaStream_t stream) {
  if (n == 0 || words == 0) return cudaSuccess;
  const int blocks = int(n < 65535 ? n : 65535);
  launch(copy_rows_indexed_kernel, blocks, 128, 0, stream, static_cast<const uint32_t*>(src),
         static_cast<uint32_t*>(dst), rows, n, words, limit, scatter, status);
  return cudaGetLastError();
}

#endif

}  // namespace flashnext::cuda::detail
