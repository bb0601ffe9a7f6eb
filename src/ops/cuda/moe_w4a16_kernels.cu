// W4A16 grouped MoE kernels (MODEL.md "MoE block"; layout and arithmetic: moe_w4a16.h). SM70 instruction set only:
// FP16 tensor cores through WMMA m16n16k16 with FP32 accumulation, FP16 half2 arithmetic, byte permutes; no bf16,
// cp.async, ldmatrix or FP8 instructions (scripts/check-sm70.sh compiles this file for sm_70).
//
// Code decoding (exact): each 32-bit word holds the 4-bit codes of inputs k0..k7 with nibble i holding
// k0 k2 k4 k6 k1 k3 k5 k7 (i = 0..7), so that pair j = (k_2j, k_2j+1) sits in nibbles j and j+4, i.e. in bits
// 4j..4j+3 of each 16-bit half.
//   int4:  ((word >> 4j) & 0x000F000F) | 0x64006400 is the half2 (1024 + q_2j, 1024 + q_2j+1); subtracting
//          1024 + z gives (q - z) exactly (integers below 2048 are exact in FP16).
//   NVFP4: the 3 magnitude bits index the FP16 high bytes of {0, .5, 1, 1.5, 2, 3, 4, 6} (all low bytes are 0)
//          through a byte permute, the sign bit moves to bit 15: the exact E2M1 value as FP16.
#include <mma.h>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_w4a16_kernels.h"

namespace flashnext::cuda::detail {
namespace {

using namespace nvcuda;

__device__ __forceinline__ __half2 bits_h2(uint32_t v) {
  return __halves2half2(__ushort_as_half(uint16_t(v & 0xffffu)), __ushort_as_half(uint16_t(v >> 16)));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
  return uint32_t(__half_as_ushort(__low2half(h))) | (uint32_t(__half_as_ushort(__high2half(h))) << 16);
}

// The 8 values of one code word as 4 half2 pairs (k0,k1) (k2,k3) (k4,k5) (k6,k7), exact: E2M1 values (NVFP4) or
// q - z (int4, z in 0..16).
template <bool NVFP4>
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t z, __half2 (&v)[4]) {
  if (NVFP4) {
    const uint32_t lo = __byte_perm(0x3E3C3800u, 0x46444240u, w & 0x7777u);          // high bytes of k0 k2 k4 k6
    const uint32_t hi = __byte_perm(0x3E3C3800u, 0x46444240u, (w >> 16) & 0x7777u);  // high bytes of k1 k3 k5 k7
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t m = __byte_perm(lo, hi, uint32_t(j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12))) & 0xFF00FF00u;
      v[j] = bits_h2(m | ((w << (12 - 4 * j)) & 0x80008000u));
    }
  } else {
    const __half2 bias = bits_h2((0x6400u | z) * 0x00010001u);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __hsub2(bits_h2(((w >> (4 * j)) & 0x000F000Fu) | 0x64006400u), bias);
  }
}

__device__ __forceinline__ float apply_global(float acc, float g, bool divide) {
  return divide ? acc / g : acc * g;
}

// ---------------------------------------------------------------- grouping

__global__ void w4_align_kernel(const int32_t* __restrict__ ids, int slots, int experts, int32_t* __restrict__ offsets,
                                int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_row,
                                int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_row,
                                int32_t* __restrict__ num_tiles, int32_t* __restrict__ active,
                                int32_t* __restrict__ num_active, int32_t* __restrict__ status) {
  __shared__ int count[kMoeMaxExperts];
  __shared__ int cursor[kMoeMaxExperts];
  __shared__ int tile_start[kMoeMaxExperts];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < experts)
      atomicAdd(&count[e], 1);
    else if (status)
      atomicOr(status, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, tiles = 0, act = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      cursor[e] = run;
      tile_start[e] = tiles;
      run += count[e];
      tiles += (count[e] + kW4TileM - 1) / kW4TileM;
      if (count[e] > 0) active[act++] = e;
    }
    offsets[experts] = run;
    *num_tiles = tiles;
    *num_active = act;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    if (e < 0 || e >= experts) {
      slot_row[s] = -1;
      continue;
    }
    const int r = atomicAdd(&cursor[e], 1);
    sorted_slots[r] = s;
    slot_row[s] = r;
  }
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int n = (count[e] + kW4TileM - 1) / kW4TileM;
    for (int i = 0; i < n; ++i) {
      tile_expert[tile_start[e] + i] = e;
      tile_row[tile_start[e] + i] = offsets[e] + i * kW4TileM;
    }
  }
}

// ---------------------------------------------------------------- GEMV path (decode)

constexpr int kGemvWarps = 8;

// One warp per output column n (GATE_UP: gate row n and up row I + n together) of one active expert, over all its
// sorted slots in chunks of kW4GemvTokens. Lanes stride over the code words (8 inputs each, one group each); per
// word the 8 products with the FP16 activations are summed in FP32 and multiplied by the FP32 group scale, then the
// warp sums, and the row's global multiplier (or divisor) is applied to the FP32 row result.
template <bool GATE_UP, bool NVFP4>
__device__ __forceinline__ void w4_gemv_body(const W4Mat& w, const __half* __restrict__ a_src, int64_t lda, int top_k,
                                             int n_out, const int32_t* __restrict__ offsets,
                                             const int32_t* __restrict__ sorted_slots,
                                             const float* __restrict__ weights, const int32_t* __restrict__ active,
                                             const int32_t* __restrict__ num_active, __half* __restrict__ out) {
  constexpr int NB = GATE_UP ? 2 : 1, T = kW4GemvTokens;
  if (int(blockIdx.y) >= *num_active) return;
  const int e = active[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (n >= n_out) return;
  const int r0 = offsets[e], r1 = offsets[e + 1];
  const int words = w.cols / 8;
  const uint32_t* code[NB];
  const __half* scale[NB];
  const uint8_t* zero[NB];
  float gl[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int64_t row = int64_t(e) * w.rows + n + b * n_out;
    code[b] = w.codes + row * w.wpr;
    scale[b] = w.scales + row * w.groups;
    zero[b] = w.zeros ? w.zeros + row * w.groups : nullptr;
    gl[b] = w.global[row];
  }
  for (int c0 = r0; c0 < r1; c0 += T) {
    const int cnt = min(T, r1 - c0);
    const __half* xp[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      xp[t] = nullptr;
      if (t < cnt) xp[t] = GATE_UP ? a_src + int64_t(sorted_slots[c0 + t] / top_k) * lda : a_src + int64_t(c0 + t) * lda;
    }
    float acc[NB][T];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[b][t] = 0.f;
#pragma unroll 4  // several words' loads in flight per lane
    for (int wi = lane; wi < words; wi += 32) {
      const int gi = (wi * 8) / w.group;
      float wv[NB][8], s[NB];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        __half2 v[4];
        decode_word<NVFP4>(__ldg(code[b] + wi), zero[b] ? uint32_t(zero[b][gi]) : 8u, v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(v[j]);
          wv[b][2 * j] = f.x;
          wv[b][2 * j + 1] = f.y;
        }
        s[b] = __half2float(scale[b][gi]);
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if (t < cnt) {
          const uint4 xr = *reinterpret_cast<const uint4*>(xp[t] + wi * 8);
          const uint32_t xw[4] = {xr.x, xr.y, xr.z, xr.w};
          float x[8];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(bits_h2(xw[j]));
            x[2 * j] = f.x;
            x[2 * j + 1] = f.y;
          }
#pragma unroll
          for (int b = 0; b < NB; ++b) {
            float p = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) p = fmaf(wv[b][i], x[i], p);
            acc[b][t] = fmaf(p, s[b], acc[b][t]);
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < cnt) {  // warp-uniform
        float r[NB];
#pragma unroll
        for (int b = 0; b < NB; ++b) r[b] = apply_global(warp_sum(acc[b][t]), gl[b], w.divide);
        if (lane == 0) {
          const int row = c0 + t;
          if (GATE_UP)
            out[int64_t(row) * n_out + n] = to_h(siluf_(r[0]) * r[NB - 1]);
          else
            out[int64_t(row) * n_out + n] = to_h(r[0] * weights[sorted_slots[row]]);
        }
      }
    }
  }
}

// One kernel per (matrix, format), each holding one instance of the body.
__global__ void __launch_bounds__(kGemvWarps * 32)
    w4_gemv_gate_up_nvfp4_kernel(W4Mat w, const __half* __restrict__ u, int64_t ldu, int top_k, int inter,
                              const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                              const int32_t* __restrict__ active, const int32_t* __restrict__ num_active,
                              __half* __restrict__ h) {
  w4_gemv_body<true, true>(w, u, ldu, top_k, inter, offsets, sorted_slots, nullptr, active, num_active, h);
}

__global__ void __launch_bounds__(kGemvWarps * 32)
    w4_gemv_down_nvfp4_kernel(W4Mat w, const __half* __restrict__ h, int hidden, int inter,
                           const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                           const float* __restrict__ weights, const int32_t* __restrict__ active,
                           const int32_t* __restrict__ num_active, __half* __restrict__ ys) {
  w4_gemv_body<false, true>(w, h, inter, 1, hidden, offsets, sorted_slots, weights, active, num_active, ys);
}

__global__ void __launch_bounds__(kGemvWarps * 32)
    w4_gemv_gate_up_int4_kernel(W4Mat w, const __half* __restrict__ u, int64_t ldu, int top_k, int inter,
                              const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                              const int32_t* __restrict__ active, const int32_t* __restrict__ num_active,
                              __half* __restrict__ h) {
  w4_gemv_body<true, false>(w, u, ldu, top_k, inter, offsets, sorted_slots, nullptr, active, num_active, h);
}

__global__ void __launch_bounds__(kGemvWarps * 32)
    w4_gemv_down_int4_kernel(W4Mat w, const __half* __restrict__ h, int hidden, int inter,
                           const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                           const float* __restrict__ weights, const int32_t* __restrict__ active,
                           const int32_t* __restrict__ num_active, __half* __restrict__ ys) {
  w4_gemv_body<false, false>(w, h, inter, 1, hidden, offsets, sorted_slots, weights, active, num_active, ys);
}

// ---------------------------------------------------------------- tensor-core path (prefill)

constexpr int kBN = 64, kBK = 64, kLd = kBK + 8, kLdc = kBN + 4, kThreads = 128;

// One block: a tile of kW4TileM sorted slots of one expert x kBN output columns (GATE_UP: kBN gate rows and the
// matching kBN up rows). Per K step of kBK inputs the codes are decoded to FP16 weights in shared memory,
// w16 = fp16(value * scale16) (exact for NVFP4; int4: one rounding of (q - z) * scale16), then WMMA m16n16k16 with
// FP32 accumulation; 4 warps of 32 x 32 outputs. The next step's codes and activations are loaded into registers
// before the current step's MMAs (SM70 has no cp.async). Epilogue: the row's global scale in FP32, then
// h = fp16(silu(g) * u) or ys = fp16(weight(slot) * y).
template <bool GATE_UP, bool NVFP4>
__device__ __forceinline__ void w4_gemm_body(const W4Mat& w, const __half* __restrict__ a_src, int64_t lda, int top_k,
                                             int n_out, const int32_t* __restrict__ offsets,
                                             const int32_t* __restrict__ sorted_slots,
                                             const float* __restrict__ weights,
                                             const int32_t* __restrict__ tile_expert,
                                             const int32_t* __restrict__ tile_row,
                                             const int32_t* __restrict__ num_tiles, __half* __restrict__ out) {
  constexpr int NB = GATE_UP ? 2 : 1;
  constexpr int kABytes = kW4TileM * kLd * 2, kBBytes = NB * kBN * kLd * 2, kCBytes = NB * kW4TileM * kLdc * 4;
  constexpr int kSmem = (kABytes + kBBytes) > kCBytes ? (kABytes + kBBytes) : kCBytes;
  __shared__ __align__(128) unsigned char smem[kSmem];
  __shared__ const __half* arow[kW4TileM];
  __half* As = reinterpret_cast<__half*>(smem);
  __half* Bs = reinterpret_cast<__half*>(smem + kABytes);
  float* Cs = reinterpret_cast<float*>(smem);

  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_row[tile], row_end = offsets[e + 1];
  const int K = w.cols, n0 = blockIdx.x * kBN;
  const int tid = threadIdx.x;
  if (tid < kW4TileM) {
    const int r = row0 + tid;
    const __half* p = nullptr;
    if (r < row_end) p = GATE_UP ? a_src + int64_t(sorted_slots[r] / top_k) * lda : a_src + int64_t(r) * lda;
    arow[tid] = p;
  }
  // This thread's B row (one per matrix) and its half of each K step's 8 code words.
  const int bn = tid >> 1, bw = (tid & 1) * 4;
  int64_t brow[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) brow[b] = n0 + bn < n_out ? int64_t(e) * w.rows + n0 + bn + b * n_out : -1;
  __syncthreads();

  constexpr int kAV = kW4TileM * (kBK / 8) / kThreads;  // uint4 of A per thread per step
  uint4 ra[kAV], rb[NB];
  __half rs[NB][4];
  uint32_t rz[NB][4];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kAV; ++i) {
      const int v = tid + i * kThreads, r = v / (kBK / 8), c = (v % (kBK / 8)) * 8;
      ra[i] = make_uint4(0, 0, 0, 0);
      if (arow[r] && k0 + c < K) ra[i] = *reinterpret_cast<const uint4*>(arow[r] + k0 + c);
    }
    const int wbase = k0 / 8 + bw;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      rb[b] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        rs[b][q] = __ushort_as_half(0);
        rz[b][q] = 0;
      }
      if (brow[b] >= 0 && wbase < w.wpr) {  // wpr is a multiple of 4: the 4 words are in the row
        rb[b] = __ldg(reinterpret_cast<const uint4*>(w.codes + brow[b] * w.wpr + wbase));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int gi = ((wbase + q) * 8) / w.group;
          rs[b][q] = w.scales[brow[b] * w.groups + gi];
          rz[b][q] = w.zeros ? uint32_t(w.zeros[brow[b] * w.groups + gi]) : 8u;
        }
      }
    }
  };
  auto store = [&]() {
#pragma unroll
    for (int i = 0; i < kAV; ++i) {
      const int v = tid + i * kThreads, r = v / (kBK / 8), c = (v % (kBK / 8)) * 8;
      *reinterpret_cast<uint4*>(As + r * kLd + c) = ra[i];
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const uint32_t words[4] = {rb[b].x, rb[b].y, rb[b].z, rb[b].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        __half2 v[4];
        decode_word<NVFP4>(words[q], rz[b][q], v);
        const __half2 s2 = __half2half2(rs[b][q]);
        uint4 o;
        o.x = h2_bits(__hmul2(v[0], s2));
        o.y = h2_bits(__hmul2(v[1], s2));
        o.z = h2_bits(__hmul2(v[2], s2));
        o.w = h2_bits(__hmul2(v[3], s2));
        *reinterpret_cast<uint4*>(Bs + (b * kBN + bn) * kLd + (bw + q) * 8) = o;
      }
    }
  };

  const int warp = tid >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][2][2];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[b][i][j], 0.f);
  load(0);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    store();
    __syncthreads();
    if (k0 + kBK < K) load(k0 + kBK);  // in flight during the MMAs below
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(af[i], As + (wm + 16 * i) * kLd + kk, kLd);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bf;
          wmma::load_matrix_sync(bf, Bs + (b * kBN + wn + 16 * j) * kLd + kk, kLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[b][i][j], af[i], bf, acc[b][i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(Cs + (b * kW4TileM + wm + 16 * i) * kLdc + wn + 16 * j, acc[b][i][j], kLdc,
                                wmma::mem_row_major);
  __syncthreads();
  for (int i = tid; i < kW4TileM * kBN; i += kThreads) {
    const int r = i / kBN, c = i % kBN, row = row0 + r, n = n0 + c;
    if (row >= row_end || n >= n_out) continue;
    const int64_t grow = int64_t(e) * w.rows + n;
    const float y0 = apply_global(Cs[r * kLdc + c], w.global[grow], w.divide);
    if (GATE_UP) {
      const float y1 = apply_global(Cs[(kW4TileM + r) * kLdc + c], w.global[grow + n_out], w.divide);
      out[int64_t(row) * n_out + n] = to_h(siluf_(y0) * y1);
    } else {
      out[int64_t(row) * n_out + n] = to_h(y0 * weights[sorted_slots[row]]);
    }
  }
}

// One kernel per (matrix, format): each holds one instance of the body and its shared memory.
__global__ void __launch_bounds__(kThreads)
    w4_gemm_gate_up_nvfp4_kernel(W4Mat w, const __half* __restrict__ u, int64_t ldu, int top_k, int inter,
                              const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                              const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,
                              const int32_t* __restrict__ num_tiles, __half* __restrict__ h) {
  w4_gemm_body<true, true>(w, u, ldu, top_k, inter, offsets, sorted_slots, nullptr, tile_expert, tile_row, num_tiles,
                          h);
}

__global__ void __launch_bounds__(kThreads)
    w4_gemm_down_nvfp4_kernel(W4Mat w, const __half* __restrict__ h, int hidden, int inter,
                           const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                           const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
                           const int32_t* __restrict__ tile_row, const int32_t* __restrict__ num_tiles,
                           __half* __restrict__ ys) {
  w4_gemm_body<false, true>(w, h, inter, 1, hidden, offsets, sorted_slots, weights, tile_expert, tile_row, num_tiles,
                           ys);
}

__global__ void __launch_bounds__(kThreads)
    w4_gemm_gate_up_int4_kernel(W4Mat w, const __half* __restrict__ u, int64_t ldu, int top_k, int inter,
                              const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                              const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,
                              const int32_t* __restrict__ num_tiles, __half* __restrict__ h) {
  w4_gemm_body<true, false>(w, u, ldu, top_k, inter, offsets, sorted_slots, nullptr, tile_expert, tile_row, num_tiles,
                          h);
}

__global__ void __launch_bounds__(kThreads)
    w4_gemm_down_int4_kernel(W4Mat w, const __half* __restrict__ h, int hidden, int inter,
                           const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                           const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
                           const int32_t* __restrict__ tile_row, const int32_t* __restrict__ num_tiles,
                           __half* __restrict__ ys) {
  w4_gemm_body<false, false>(w, h, inter, 1, hidden, offsets, sorted_slots, weights, tile_expert, tile_row, num_tiles,
                           ys);
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_w4_align(const int32_t* ids, int slots, int experts, int32_t* offsets, int32_t* sorted_slots,
                            int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row, int32_t* num_tiles,
                            int32_t* active, int32_t* num_active, int32_t* status, cudaStream_t stream) {
  w4_align_kernel<<<1, 1024, 0, stream>>>(ids, slots, experts, offsets, sorted_slots, slot_row, tile_expert, tile_row,
                                          num_tiles, active, num_active, status);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* active,
                                   const int32_t* num_active, int max_active, __half* h, cudaStream_t stream) {
  if (max_active == 0) return cudaSuccess;
  dim3 grid((inter + kGemvWarps - 1) / kGemvWarps, max_active);
  (w.nvfp4 ? w4_gemv_gate_up_nvfp4_kernel : w4_gemv_gate_up_int4_kernel)<<<grid, kGemvWarps * 32, 0, stream>>>(
      w, u, ldu, top_k, inter, offsets, sorted_slots, active, num_active, h);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemv_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* active,
                                const int32_t* num_active, int max_active, __half* ys, cudaStream_t stream) {
  if (max_active == 0) return cudaSuccess;
  dim3 grid((hidden + kGemvWarps - 1) / kGemvWarps, max_active);
  (w.nvfp4 ? w4_gemv_down_nvfp4_kernel : w4_gemv_down_int4_kernel)<<<grid, kGemvWarps * 32, 0, stream>>>(
      w, h, hidden, inter, offsets, sorted_slots, weights, active, num_active, ys);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemm_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* tile_expert,
                                   const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* h,
                                   cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  dim3 grid((inter + kBN - 1) / kBN, max_tiles);
  (w.nvfp4 ? w4_gemm_gate_up_nvfp4_kernel : w4_gemm_gate_up_int4_kernel)<<<grid, kThreads, 0, stream>>>(
      w, u, ldu, top_k, inter, offsets, sorted_slots, tile_expert, tile_row, num_tiles, h);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemm_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                                const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                                cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  dim3 grid((hidden + kBN - 1) / kBN, max_tiles);
  (w.nvfp4 ? w4_gemm_down_nvfp4_kernel : w4_gemm_down_int4_kernel)<<<grid, kThreads, 0, stream>>>(
      w, h, hidden, inter, offsets, sorted_slots, weights, tile_expert, tile_row, num_tiles, ys);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
