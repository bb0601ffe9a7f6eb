// Hyper-connection (gated residual) kernels: MODEL.md "Hyper-connection (gated residual) read" and the layer's
// `X = Xin + w ⊗ out` inject. Baseline (every GPU): hc_norm and hc_mix around the two low-rank products in cuBLAS
// (hc_ops.cpp). Prefill on SM80+: the whole read in four launches around two tensor-core products (hc_down_mma,
// hc_up_mma below).
#ifndef __CUDACC_RTC__
#include <algorithm>

#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/hc_kernels.h"
#include "ops/cuda/mma_sm80.cuh"

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
  split_f16x2(siluf_((y2[i] + y2[n + i]) * inv_streams), &a2[i], &a2[n + i]);
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

// ---------------------------------------------------------------- prefill read on the tensor cores (SM80+)
//
// The read of T tokens in four kernels, mma.sync m16n8k16 with FP16x2 activations (hi + lo halves of values of
// order 1, about 2^-22 relative) against the FP16 weights, FP32 accumulation; with a pending injection
// (hc_inject_read) they read X' = X + add_inj[t, b] * add_out[t, j] and hc_up_mma stores X' in place:
//   hc_stats_prefill: rstd[t][b] = rsqrt(mean over stream b's H inputs of X'^2 + eps), a warp per (t, b).
//   hc_down_mma: block (token tile of 64, row tile of 192 of [input_mix_weight_down (R rows); block_inject (S rows)],
//     split z of the S*H inputs): A = n = X' rstd (1 + hc_norm) split into halves as it is staged, B = the rows'
//     weights (cp.async); part[z][t][r] = the split's share of the row's product with n. The splits make enough
//     blocks for the GPU at any token count.
//   hc_act_prefill: d = sum_z part[z][t][r] in split order; a = silu(d / S) of the down rows as its FP16 halves a2
//     [2, T, R], inj = 2 sigmoid(d / S) of the inject rows.
//   hc_up_mma<S>: block (token tile of 64, 256 / S hidden columns j), N = the up rows b*H + j of every stream, so that
//     each thread holds m_b for all S streams of its (t, j): A = a2's halves, B = the up rows (both cp.async),
//     u[t, j] = mean_b sigmoid(m_b) * n[t, b*H + j] with n recomputed from X'.
// Needs S in {2, 4}, H and R multiples of 64 (hc_read_prefill_supported), rows 16-byte aligned (the caller checks).
// X is read by the statistics, by every row tile of hc_down_mma (two at the released rank) and by hc_up_mma, and
// written once (with an injection); nothing of size [T, S*H] is made.
constexpr int kHcMmaTokens = 64;           // tokens a block
constexpr int kHcMmaThreads = 256;         // 8 warps
constexpr int kHcMmaK = 64;                // inputs a stage
constexpr int kHcMmaPitch = kHcMmaK + 8;   // halves of a staged row (+ 8: the 8 rows of an ldmatrix on distinct banks)
constexpr int kHcMmaChunks = kHcMmaK / 8;  // 16-byte chunks of a staged row
constexpr int kHcMmaChunkRows = kHcMmaThreads / kHcMmaChunks;  // staged rows one pass of the block's chunks covers
constexpr int kHcDownWarpTiles = 6;                            // n8 row tiles of an hc_down_mma warp
constexpr int kHcDownRowsBlock = 4 * 8 * kHcDownWarpTiles;     // 192: warps 2 (tokens) x 4 (rows)

struct HcDownMmaSmem {
  __half a[2][2][kHcMmaTokens][kHcMmaPitch];   // [stage][hi, lo][token][input]
  __half w[2][kHcDownRowsBlock][kHcMmaPitch];  // [stage][row][input]
};
struct HcUpMmaSmem {
  __half a[2][2][kHcMmaTokens][kHcMmaPitch];  // [stage][hi, lo][token][rank input]
  __half w[2][256][kHcMmaPitch];              // [stage][stream b * (256 / S) + column][rank input]
};

// The A fragments of a warp's two 16-token tiles (rows row0 ..) at k-step ks of a staged stage a [hi, lo]: ah from the
// hi halves, al from the lo halves (ldmatrix rows lane % 16 at column 8 (lane / 16)).
__device__ __forceinline__ void hc_mma_a(const __half (&a)[2][kHcMmaTokens][kHcMmaPitch], int row0, int ks, int lane,
                                         uint32_t (&ah)[2][4], uint32_t (&al)[2][4]) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    ldmatrix_x4(ah[mi], &a[0][row0 + 16 * mi + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
    ldmatrix_x4(al[mi], &a[1][row0 + 16 * mi + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
  }
}

// acc[mi][n0 + n] += (A_hi + A_lo)[mi] B_n for the two n8 tiles of the 16 staged weight rows w16 (k-step ks; ldmatrix
// matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15)).
template <int N>
__device__ __forceinline__ void hc_mma_b16(const __half (*w16)[kHcMmaPitch], int ks, int lane,
                                           const uint32_t (&ah)[2][4], const uint32_t (&al)[2][4],
                                           float (&acc)[2][N][4], int n0) {
  const int bm = lane >> 3;
  uint32_t bw[4];
  ldmatrix_x4(bw, &w16[8 * (bm >> 1) + (lane & 7)][16 * ks + 8 * (bm & 1)]);
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      mma_m16n8k16(acc[mi][n0 + n], ah[mi][0], ah[mi][1], ah[mi][2], ah[mi][3], bw[2 * n], bw[2 * n + 1]);
      mma_m16n8k16(acc[mi][n0 + n], al[mi][0], al[mi][1], al[mi][2], al[mi][3], bw[2 * n], bw[2 * n + 1]);
    }
}

// rstd[t][b] of X' (a warp per (t, b); H a multiple of 4, rows 16-byte aligned).
__global__ void hc_stats_prefill_kernel(const float* __restrict__ X, const float* __restrict__ add_out,
                                        const float* __restrict__ add_inj, int T, int S, int H, float eps,
                                        float* __restrict__ rstd) {
  pdl_begin();
  const int64_t w = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(T) * S) return;
  const int64_t t = w / S;
  const int b = int(w % S);
  const float4* xr = reinterpret_cast<const float4*>(X + t * S * H + int64_t(b) * H);
  const float4* orow = add_out ? reinterpret_cast<const float4*>(add_out + t * H) : nullptr;
  const float a = add_out ? add_inj[t * S + b] : 0.f;
  float ss = 0.f;
  for (int i = lane; i < H / 4; i += 32) {
    float4 v = xr[i];
    if (orow) {
      const float4 o = orow[i];
      v.x = v.x + a * o.x, v.y = v.y + a * o.y, v.z = v.z + a * o.z, v.w = v.w + a * o.w;
    }
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warp_sum(ss);
  if (lane == 0) rstd[w] = rsqrtf(ss / float(H) + eps);
}

__global__ void __launch_bounds__(kHcMmaThreads, 2)
    hc_down_mma_kernel(const float* __restrict__ X, const float* __restrict__ add_out,
                       const float* __restrict__ add_inj, const float* __restrict__ rstd,
                       const __half* __restrict__ norm_w, const __half* __restrict__ down,
                       const __half* __restrict__ inject, int T, int S, int H, int R, int rows, int stages_per_split,
                       float* __restrict__ part) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ uint4 hc_dyn_smem[];
  HcDownMmaSmem& sm = *reinterpret_cast<HcDownMmaSmem*>(hc_dyn_smem);
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 1, wn = warp >> 1;  // tokens 32 wm .. +32, rows 48 wn .. +48 of the block's
  const int t0 = int(blockIdx.x) * kHcMmaTokens, r0 = int(blockIdx.y) * kHcDownRowsBlock, z = int(blockIdx.z);
  const int64_t W = int64_t(S) * H;
  // This split's stages of 64 inputs (each inside one stream: H is a multiple of 64).
  const int st0 = z * stages_per_split, st1 = min(st0 + stages_per_split, int(W / kHcMmaK));
  // A staging: tokens lt + XR i (i < XP), inputs 4 q4 .. +4 of the stage's kHcMmaK.
  constexpr int XQ = kHcMmaK / 4, XR = kHcMmaThreads / XQ, XP = kHcMmaTokens / XR;
  const int lt = tid / XQ, q4 = tid % XQ;
  float4 xv[XP];
  float gv[4];
  auto load_x = [&](int st) {
    const int64_t k = int64_t(st) * kHcMmaK + 4 * q4;
    const int b = int(k / H);
    const uint2 graw = *reinterpret_cast<const uint2*>(norm_w + k);
    const float2 g01 = __half22float2(*reinterpret_cast<const __half2*>(&graw.x)),
                 g23 = __half22float2(*reinterpret_cast<const __half2*>(&graw.y));
    gv[0] = 1.f + g01.x, gv[1] = 1.f + g01.y, gv[2] = 1.f + g23.x, gv[3] = 1.f + g23.y;
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const int t = t0 + lt + XR * i;
      xv[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < T) {
        float4 v = *reinterpret_cast<const float4*>(X + int64_t(t) * W + k);
        if (add_out) {
          const float a = add_inj[int64_t(t) * S + b];
          const float4 o = *reinterpret_cast<const float4*>(add_out + int64_t(t) * H + (k - int64_t(b) * H));
          v.x = v.x + a * o.x, v.y = v.y + a * o.y, v.z = v.z + a * o.z, v.w = v.w + a * o.w;
        }
        const float r = rstd[int64_t(t) * S + b];
        xv[i] = make_float4(v.x * r, v.y * r, v.z * r, v.w * r);
      }
    }
  };
  auto store_x = [&](int buf) {
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const float v[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
      __align__(8) __half hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) split_f16x2(v[e] * gv[e], &hi[e], &lo[e]);
      *reinterpret_cast<uint2*>(&sm.a[buf][0][lt + XR * i][4 * q4]) = *reinterpret_cast<const uint2*>(hi);
      *reinterpret_cast<uint2*>(&sm.a[buf][1][lt + XR * i][4 * q4]) = *reinterpret_cast<const uint2*>(lo);
    }
  };
  // B staging: 192 rows x 8 chunks of 16 bytes, 6 chunks a thread; rows past `rows` are zeros.
  auto load_w = [&](int buf, int st) {
    const int64_t k = int64_t(st) * kHcMmaK;
#pragma unroll
    for (int i = 0; i < kHcDownRowsBlock * kHcMmaChunks / kHcMmaThreads; ++i) {
      const int c = tid + kHcMmaThreads * i, row = c / kHcMmaChunks, chunk = c % kHcMmaChunks, r = r0 + row;
      const bool valid = r < rows;
      const __half* src = !valid ? down : (r < R ? down + int64_t(r) * W : inject + int64_t(r - R) * W) + k + 8 * chunk;
      cp_async16(&sm.w[buf][row][8 * chunk], src, valid);
    }
    cp_async_commit();
  };
  float acc[2][kHcDownWarpTiles][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < kHcDownWarpTiles; ++n) acc[mi][n][0] = acc[mi][n][1] = acc[mi][n][2] = acc[mi][n][3] = 0.f;

  if (st0 < st1) {
    load_w(0, st0);
    load_x(st0);
    store_x(0);
    cp_async_wait<0>();
  }
  __syncthreads();
  for (int st = st0; st < st1; ++st) {
    const int buf = (st - st0) & 1;
    const bool next = st + 1 < st1;
    if (next) {
      load_w(buf ^ 1, st + 1);
      load_x(st + 1);
    }
#pragma unroll
    for (int ks = 0; ks < kHcMmaK / 16; ++ks) {
      uint32_t ah[2][4], al[2][4];
      hc_mma_a(sm.a[buf], 32 * wm, ks, lane, ah, al);
#pragma unroll
      for (int np = 0; np < kHcDownWarpTiles / 2; ++np)
        hc_mma_b16(&sm.w[buf][48 * wn + 16 * np], ks, lane, ah, al, acc, 2 * np);
    }
    if (next) store_x(buf ^ 1);
    cp_async_wait<0>();
    __syncthreads();
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < kHcDownWarpTiles; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = t0 + 32 * wm + 16 * mi + g + 8 * h, r = r0 + 48 * wn + 8 * n + 2 * tq;
        if (t >= T || r >= rows) continue;
        // rows = R (+ S) is even and so is r: an 8-byte aligned pair, both inside the rows
        *reinterpret_cast<float2*>(part + (int64_t(z) * T + t) * rows + r) =
            make_float2(acc[mi][n][2 * h], acc[mi][n][2 * h + 1]);
      }
#endif
}

// d = sum over the splits z of part[z][t][r] (in order); the down rows r < R: a2[t][r] = hi, a2[T + t][r] = lo of
// silu(d / S); the inject rows: inj[t][r - R] = 2 sigmoid(d / S). One thread per (t, r).
__global__ void hc_act_prefill_kernel(const float* __restrict__ part, int splits, int T, int S, int R, int rows,
                                      __half* __restrict__ a2, float* __restrict__ inj) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(T) * rows) return;
  const int64_t t = idx / rows;
  const int r = int(idx % rows);
  float d = 0.f;
  for (int z = 0; z < splits; ++z) d += part[int64_t(z) * T * rows + idx];
  d /= float(S);
  if (r < R) {
    __half hi, lo;
    split_f16x2(siluf_(d), &hi, &lo);
    a2[t * R + r] = hi;
    a2[(int64_t(T) + t) * R + r] = lo;
  } else {
    inj[t * S + (r - R)] = 2.f * sigmoidf_(d);
  }
}

template <int S>
__global__ void __launch_bounds__(kHcMmaThreads, 2)
    hc_up_mma_kernel(float* __restrict__ X, const float* __restrict__ add_out, const float* __restrict__ add_inj,
                     const __half* __restrict__ norm_w, const __half* __restrict__ up, const __half* __restrict__ a2,
                     const float* __restrict__ rstd, int T, int H, int R, float* __restrict__ u) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int NJ = 8 / S, JW = 8 * NJ, JB = 4 * JW;  // n8 column tiles a stream of a warp; columns a warp, a block
  extern __shared__ uint4 hc_dyn_smem[];
  HcUpMmaSmem& sm = *reinterpret_cast<HcUpMmaSmem*>(hc_dyn_smem);
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 1, wj = warp >> 1;  // tokens 32 wm .. +32, columns JW wj .. +JW of the block's
  const int t0 = int(blockIdx.x) * kHcMmaTokens, j0 = int(blockIdx.y) * JB;
  const int64_t W = int64_t(S) * H;
  const int stages = R / kHcMmaK;
  // A: a2's hi and lo rows of the 64 tokens, 8 chunks of 16 bytes a row and stage (4 a thread); B: the S * JB = 256
  // up rows, 8 chunks a row (8 a thread). Tokens past T and columns past H are zeros.
  // A thread's chunks: column 8 part of rows row0 + kHcMmaChunkRows i; offsets in 32 bits (a2 and up hold fewer than
  // 2^31 values: hc_read_prefill_supported), so that the loop keeps few registers for them.
  const int part = tid % kHcMmaChunks, row0 = tid / kHcMmaChunks;
  auto load = [&](int buf, int st) {
    const __half* ak = a2 + st * kHcMmaK + 8 * part;
    const __half* wk = up + st * kHcMmaK + 8 * part;
#pragma unroll
    for (int i = 0; i < 2 * kHcMmaTokens * kHcMmaChunks / kHcMmaThreads; ++i) {
      constexpr int passes = kHcMmaTokens / kHcMmaChunkRows;  // of each half
      const int half = i / passes, row = row0 + kHcMmaChunkRows * (i % passes), t = t0 + row;
      const bool valid = t < T;
      cp_async16(&sm.a[buf][half][row][8 * part], valid ? ak + (half * T + t) * R : a2, valid);
    }
#pragma unroll
    for (int i = 0; i < 256 * kHcMmaChunks / kHcMmaThreads; ++i) {
      const int row = row0 + kHcMmaChunkRows * i, b = row / JB, j = j0 + row % JB;
      const bool valid = j < H;
      cp_async16(&sm.w[buf][row][8 * part], valid ? wk + (b * H + j) * R : up, valid);
    }
    cp_async_commit();
  };
  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[mi][n][0] = acc[mi][n][1] = acc[mi][n][2] = acc[mi][n][3] = 0.f;
  load(0, 0);
  for (int st = 0; st < stages; ++st) {
    const int buf = st & 1;
    if (st + 1 < stages) {
      load(buf ^ 1, st + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kHcMmaK / 16; ++ks) {
      uint32_t ah[2][4], al[2][4];
      hc_mma_a(sm.a[buf], 32 * wm, ks, lane, ah, al);
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // n8 tiles 2p, 2p + 1: stream b = 2p / NJ, column tiles jt, jt + 1
        const int b = 2 * p / NJ, jt = 2 * p % NJ;
        hc_mma_b16(&sm.w[buf][b * JB + JW * wj + 8 * jt], ks, lane, ah, al, acc, 2 * p);
      }
    }
    __syncthreads();  // the stage is read: the load after the next wait may overwrite it
  }
  // Thread (g, tq) holds m_b of its tokens (rows g, g + 8 of each 16-token tile) and columns (2 tq, 2 tq + 1 of each
  // column tile) for every stream b: n8 tile b * NJ + jt.
  const float inv_s = 1.f / float(S);
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int jt = 0; jt < NJ; ++jt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = t0 + 32 * wm + 16 * mi + g + 8 * h, j = j0 + JW * wj + 8 * jt + 2 * tq;
        if (t >= T || j >= H) continue;
        float u0 = 0.f, u1 = 0.f;
#pragma unroll
        for (int b = 0; b < S; ++b) {
          float2* xp = reinterpret_cast<float2*>(X + int64_t(t) * W + int64_t(b) * H + j);
          float2 x = *xp;
          if (add_out) {
            const float a = add_inj[int64_t(t) * S + b];
            const float2 o = *reinterpret_cast<const float2*>(add_out + int64_t(t) * H + j);
            x.x = x.x + a * o.x, x.y = x.y + a * o.y;
            *xp = x;
          }
          const float r = rstd[int64_t(t) * S + b];
          const float2 gn = __half22float2(*reinterpret_cast<const __half2*>(norm_w + int64_t(b) * H + j));
          u0 += sigmoidf_(acc[mi][b * NJ + jt][2 * h]) * (x.x * r * (1.f + gn.x));
          u1 += sigmoidf_(acc[mi][b * NJ + jt][2 * h + 1]) * (x.y * r * (1.f + gn.y));
        }
        *reinterpret_cast<float2*>(u + int64_t(t) * H + j) = make_float2(u0 * inv_s, u1 * inv_s);
      }
#endif
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
#define FN_HC_UP_MMA(SS)                                                                                          \
  template __global__ void hc_up_mma_kernel<SS>(float*, const float*, const float*, const __half*, const __half*, \
                                                const __half*, const float*, int, int, int, float*);
FN_HC_UP_MMA(2)
FN_HC_UP_MMA(4)
#undef FN_HC_UP_MMA
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

bool hc_read_prefill_supported(int tokens, int streams, int hidden, int rank) {
  const bool compiled = kernel_ptx_version(reinterpret_cast<const void*>(hc_down_mma_kernel)) >= 80 &&
                        kernel_ptx_version(reinterpret_cast<const void*>(hc_up_mma_kernel<4>)) >= 80;
  return compiled && (streams == 2 || streams == 4) && hidden > 0 && hidden % kHcMmaK == 0 && rank > 0 &&
         rank % kHcMmaK == 0 && int64_t(streams) * hidden * rank < (int64_t(1) << 31) &&
         2 * int64_t(tokens) * rank < (int64_t(1) << 31);
}

namespace {
// Splits of hc_down_mma's S*H inputs: enough blocks for about two per SM (its occupancy), at least 4 stages of 64
// inputs a split.
int hc_down_splits(int tokens, int streams, int hidden, int rank, bool inject) {
  static thread_local int cached_device = -1, sms = 0;
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && device != cached_device &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
    cached_device = device;
  const int rows = rank + (inject ? streams : 0), stages = streams * hidden / kHcMmaK;
  const int64_t blocks =
      int64_t((tokens + kHcMmaTokens - 1) / kHcMmaTokens) * ((rows + kHcDownRowsBlock - 1) / kHcDownRowsBlock);
  const int64_t want = (2 * int64_t(std::max(sms, 1)) + blocks - 1) / blocks;
  return int(std::max<int64_t>(1, std::min<int64_t>(want, std::max(1, stages / 4))));
}
}  // namespace

int64_t hc_read_prefill_scratch(int tokens, int streams, int hidden, int rank, bool inject) {
  const int64_t rows = rank + (inject ? streams : 0);
  const int splits = hc_down_splits(tokens, streams, hidden, rank, inject);
  return int64_t(splits) * tokens * rows + int64_t(tokens) * rank + int64_t(tokens) * streams;  // part, a2, rstd
}

cudaError_t launch_hc_read_prefill(float* X, const float* add_out, const float* add_inj, const __half* norm_w,
                                   const __half* down, const __half* up, const __half* inject, int tokens, int streams,
                                   int hidden, int rank, float eps, float* scratch, float* u, float* inj,
                                   cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (!hc_read_prefill_supported(tokens, streams, hidden, rank)) return cudaErrorInvalidValue;
  const int rows = rank + (inject ? streams : 0), stages = streams * hidden / kHcMmaK;
  const int splits = hc_down_splits(tokens, streams, hidden, rank, inject);
  const int stages_per_split = (stages + splits - 1) / splits;
  float* part = scratch;                                                           // [splits, T, rows]
  __half* a2 = reinterpret_cast<__half*>(part + int64_t(splits) * tokens * rows);  // [2, T, R]
  float* rstd = part + int64_t(splits) * tokens * rows + int64_t(tokens) * rank;   // [T, S]
  launch(hc_stats_prefill_kernel, grid_for(int64_t(tokens) * streams * 32), kThreads, 0, stream, X, add_out, add_inj,
         tokens, streams, hidden, eps, rstd);
  const unsigned token_tiles = unsigned((tokens + kHcMmaTokens - 1) / kHcMmaTokens);
  const dim3 down_grid(token_tiles, unsigned((rows + kHcDownRowsBlock - 1) / kHcDownRowsBlock), unsigned(splits));
  cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(hc_down_mma_kernel), sizeof(HcDownMmaSmem));
  if (err != cudaSuccess) return err;
  launch(hc_down_mma_kernel, down_grid, kHcMmaThreads, sizeof(HcDownMmaSmem), stream, X, add_out, add_inj,
         static_cast<const float*>(rstd), norm_w, down, inject, tokens, streams, hidden, rank, rows, stages_per_split,
         part);
  launch(hc_act_prefill_kernel, grid_for(int64_t(tokens) * rows), kThreads, 0, stream, static_cast<const float*>(part),
         splits, tokens, streams, rank, rows, a2, inj);
  auto up_launch = [&](auto kernel, int columns, size_t smem) {
    err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    if (err != cudaSuccess) return;
    launch(kernel, dim3(token_tiles, unsigned((hidden + columns - 1) / columns)), kHcMmaThreads, smem, stream, X,
           add_out, add_inj, norm_w, up, a2, rstd, tokens, hidden, rank, u);
  };
  switch (streams) {
    case 2:
      up_launch(hc_up_mma_kernel<2>, 128, sizeof(HcUpMmaSmem));
      break;
    default:
      up_launch(hc_up_mma_kernel<4>, 64, sizeof(HcUpMmaSmem));
      break;
  }
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
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
