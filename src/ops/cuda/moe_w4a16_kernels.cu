// W4A16 grouped MoE kernels (MODEL.md "MoE block"; layout and arithmetic: moe_w4a16.h). The baseline kernels use the
// SM70 instruction set only: FP16 tensor cores through WMMA m16n16k16 with FP32 accumulation, FP16 half2 arithmetic,
// byte permutes; no bf16, cp.async, ldmatrix or FP8 instructions (scripts/check-sm70.sh compiles this file for
// sm_70). Beside them, the tensor-core GEMV (decode) and GEMM (prefill) kernels use mma.sync m16n8k16, the GEMM also
// cp.async (compute capability 8.0+), compiled to empty bodies below 8.0 and chosen by the host only where their code
// holds them (w4_gemv_tensor_cores, w4_gemm_tensor_cores).
//
// Code decoding (exact): each 32-bit word holds the 4-bit codes of inputs k0..k7 with nibble i holding
// k0 k2 k4 k6 k1 k3 k5 k7 (i = 0..7), so that pair j = (k_2j, k_2j+1) sits in nibbles j and j+4, i.e. in bits
// 4j..4j+3 of each 16-bit half.
//   int4:  ((word >> 4j) & 0x000F000F) | 0x64006400 is the half2 (1024 + q_2j, 1024 + q_2j+1); subtracting
//          1024 + z gives (q - z) exactly (integers below 2048 are exact in FP16).
//   NVFP4: the 3 magnitude bits index the FP16 high bytes of {0, .5, 1, 1.5, 2, 3, 4, 6} (all low bytes are 0)
//          through a byte permute, the sign bit moves to bit 15: the exact E2M1 value as FP16.
// FP8 matrices (W4Mat::fp8) hold 4 E4M3 bytes a word, input 4i + b in byte b (decode_word_fp8); only the FP32-FMA
// GEMV and the WMMA GEMM take them (the kernels' FMT parameter: kInt4, kNvfp4, kFp8).
#include <mma.h>

#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_w4a16_kernels.h"

namespace flashnext::cuda::detail {
namespace {

using namespace nvcuda;

__device__ __forceinline__ __half2 bits_h2(uint32_t v) {
  return __halves2half2(__ushort_as_half(uint16_t(v & 0xffffu)), __ushort_as_half(uint16_t(v >> 16)));
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

// NVFP4 for the GEMV, cheaper than decode_word: the 8 E2M1 values times 2^-14 as FP16, exactly. The magnitude bits
// (e1 e0 m) placed at FP16 bits 11..9 read as 2^(e-15) (1 + m/2) for e >= 1 and 2^-14 * m/2 for e = 0 (subnormal),
// i.e. 2^-14 times the E2M1 value 2^(e-1) (1 + m/2) or m/2; the sign moves to bit 15. The caller takes the group scale
// times 2^14 (kNvfp4GemvScale): every product and partial sum is the unscaled one times 2^-14 (no underflow: the
// smallest nonzero product is 2^-15 * 2^-24), so the results are bit for bit those of decode_word.
constexpr float kNvfp4GemvScale = 16384.f;
__device__ __forceinline__ void decode_word_nvfp4_scaled(uint32_t w, __half2 (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = bits_h2((((w >> (4 * j)) & 0x00070007u) << 9) | ((w << (12 - 4 * j)) & 0x80008000u));
}

// The weight formats of the FP32-FMA GEMV and WMMA GEMM kernels (template parameter FMT).
constexpr int kInt4 = 0, kNvfp4 = 1, kFp8 = 2;

// FP8 (W4Mat::fp8): the 4 E4M3 bytes of a code word as the half2 pairs (k0,k1) (k2,k3), each value e4m3 * 2^-8
// exactly. Byte b goes to bits 8..15 of its half (its sign at bit 15); its 7 magnitude bits (exponent e, mantissa m)
// one place right read as FP16 exponent e and mantissa m << 7: 2^(e-15) (1 + m/8) = 2^-8 * 2^(e-7) (1 + m/8), and
// for e = 0 the FP16 subnormal 2^-14 (m/8) = 2^-8 * 2^-6 (m/8), the E4M3 subnormal. (Repacking refuses the NaN codes.)
__device__ __forceinline__ void decode_word_fp8(uint32_t w, __half2 (&v)[2]) {
  const uint32_t a = __byte_perm(w, 0u, 0x1404u), b = __byte_perm(w, 0u, 0x3424u);  // bytes 0, 1 / 2, 3 at bits 8, 24
  v[0] = bits_h2((a & 0x80008000u) | ((a >> 1) & 0x3F803F80u));
  v[1] = bits_h2((b & 0x80008000u) | ((b >> 1) & 0x3F803F80u));
}

__device__ __forceinline__ float apply_global(float acc, float g, bool divide) {
  return divide ? acc / g : acc * g;
}

// ---------------------------------------------------------------- grouping (GEMM path)

// Inclusive prefix sums of a and b over the 32 lanes of the warp (all lanes call it).
__device__ __forceinline__ void warp_inclusive_scan2(int& a, int& b, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ua = __shfl_up_sync(0xffffffffu, a, o), ub = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      a += ua;
      b += ub;
    }
  }
}

// One block of kMoeMaxExperts threads, thread e for expert e: slot counts by shared-memory atomics, then one
// block-wide exclusive scan of (slots, tiles) per expert gives the offsets and the tile list in parallel; slots are
// scattered into their expert's rows by atomics (the order inside an expert does not change any result: each
// sorted row is computed on its own and the combine sums in slot order).
__global__ void __launch_bounds__(kMoeMaxExperts)
    w4_align_kernel(const int32_t* __restrict__ ids, int slots, int experts, int tile_m, int32_t* __restrict__ offsets,
                    int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_row,
                    int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_row, int32_t* __restrict__ num_tiles,
                    int32_t* __restrict__ status) {
  pdl_begin();
  __shared__ int count[kMoeMaxExperts];
  __shared__ int warp_rows[kMoeMaxExperts / 32], warp_tiles[kMoeMaxExperts / 32];
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
  count[e] = 0;
  __syncthreads();
  for (int s = e; s < slots; s += blockDim.x) {
    const int id = ids[s];
    if (id >= 0 && id < experts)
      atomicAdd(&count[id], 1);
    else if (status)
      atomicOr(status, 1);
  }
  __syncthreads();
  const int c = e < experts ? count[e] : 0, nt = (c + tile_m - 1) / tile_m;
  int rows = c, tiles = nt;
  warp_inclusive_scan2(rows, tiles, lane);
  if (lane == 31) {
    warp_rows[warp] = rows;
    warp_tiles[warp] = tiles;
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scan of the warp totals
    const int r0 = warp_rows[lane], t0 = warp_tiles[lane];
    int r = r0, t = t0;
    warp_inclusive_scan2(r, t, lane);
    warp_rows[lane] = r - r0;
    warp_tiles[lane] = t - t0;
  }
  __syncthreads();
  const int off = warp_rows[warp] + rows - c, ts = warp_tiles[warp] + tiles - nt;
  if (e < experts) {
    offsets[e] = off;
    count[e] = off;  // now the scatter cursor
    for (int i = 0; i < nt; ++i) {
      tile_expert[ts + i] = e;
      tile_row[ts + i] = off + i * tile_m;
    }
    if (e == experts - 1) {
      offsets[experts] = off + c;
      *num_tiles = ts + nt;
    }
  }
  __syncthreads();
  for (int s = e; s < slots; s += blockDim.x) {
    const int id = ids[s];
    if (id < 0 || id >= experts) {
      slot_row[s] = -1;
      continue;
    }
    const int r = atomicAdd(&count[id], 1);
    sorted_slots[r] = s;
    slot_row[s] = r;
  }
}

// ---------------------------------------------------------------- GEMV path (decode)

// Sum over the `lanes` lanes (a power of two <= 32) of this thread's lane group; every lane of the group calls it.
__device__ __forceinline__ float group_sum(float v, int lanes) {
  const unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << ((threadIdx.x & 31) & ~(lanes - 1));
  for (int o = lanes >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

// The scale word of 16-byte code chunk c (32 inputs) of `row`, for both GEMVs: NVFP4 the FP16 scales of groups 2c and
// 2c + 1 (groups of 16, an even count per row: 4-byte aligned pairs); int4 with groups of a multiple of 32 inputs (one
// group per chunk) FP16 scale | zero point << 16.
template <bool NVFP4>
__device__ __forceinline__ uint32_t w4_chunk_scales(const W4Mat& w, int64_t row, int c) {
  if (NVFP4) return __ldg(reinterpret_cast<const uint32_t*>(w.scales + row * w.groups) + c);
  const int64_t gi = row * w.groups + (c * 32) / w.group;
  return uint32_t(__half_as_ushort(__ldg(w.scales + gi))) | ((w.zeros ? uint32_t(__ldg(w.zeros + gi)) : 8u) << 16);
}

// The R rows `row` (indices into the stacked [E * rows] matrix) times the FP16 vector x, this lane's share: a lane
// group of `lanes` lanes splits each row into chunks of 16 code bytes (4 words, 32 inputs); lane `sub` takes chunks
// sub, sub + lanes, ... and loads kW4GemvChunks of them per row (codes, and their scales and zero points where a
// chunk has one or two groups) before any arithmetic, so that many bytes are in flight. Per code word: the 8
// products of exact weight values (NVFP4: times 2^-14, decode_word_nvfp4_scaled) and FP16 activations summed in FP32,
// times the FP32 group scale, into acc[r].
template <bool NVFP4, int R>
__device__ __forceinline__ void w4_dot_rows(const W4Mat& w, const int64_t (&row)[R], const __half* __restrict__ x,
                                            int sub, int lanes, float (&acc)[R]) {
  constexpr int C = kW4GemvChunks;
  const int words = w.cols / 8, chunks = (words + 3) / 4;
  const bool chunk_scale = !NVFP4 && w.group % 32 == 0;  // one int4 group per chunk (else looked up per word)
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c0 = sub; c0 < chunks; c0 += lanes * C) {
    uint4 code[R][C];
    uint32_t sc[R][C];  // NVFP4: the FP16 scales of groups 2c, 2c+1; int4: FP16 scale | zero point << 16
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const int c = c0 + i * lanes;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        code[r][i] = make_uint4(0, 0, 0, 0);
        sc[r][i] = 0;
        if (c < chunks) {
          code[r][i] = __ldg(reinterpret_cast<const uint4*>(w.codes + row[r] * w.wpr) + c);
          if (NVFP4 || chunk_scale) sc[r][i] = w4_chunk_scales<NVFP4>(w, row[r], c);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const int c = c0 + i * lanes;
      if (c >= chunks) break;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int wi = 4 * c + q;
        if (wi >= words) break;  // padding words of the last chunk (codes 0, no activations behind them)
        const uint4 xr = __ldg(reinterpret_cast<const uint4*>(x + wi * 8));
        const uint32_t xw[4] = {xr.x, xr.y, xr.z, xr.w};
        float xf[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(bits_h2(xw[j]));
          xf[2 * j] = f.x;
          xf[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s;
          uint32_t z = 8;
          if (NVFP4) {
            s = __half2float(__ushort_as_half(uint16_t(sc[r][i] >> (16 * (q >> 1))))) * kNvfp4GemvScale;
          } else if (chunk_scale) {
            s = __half2float(__ushort_as_half(uint16_t(sc[r][i])));
            z = sc[r][i] >> 16;
          } else {
            const int64_t gi = row[r] * w.groups + (wi * 8) / w.group;
            s = __half2float(w.scales[gi]);
            if (w.zeros) z = w.zeros[gi];
          }
          const uint32_t cw[4] = {code[r][i].x, code[r][i].y, code[r][i].z, code[r][i].w};
          __half2 v[4];
          if (NVFP4)
            decode_word_nvfp4_scaled(cw[q], v);
          else
            decode_word<false>(cw[q], z, v);
          float p = 0.f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(v[j]);
            p = fmaf(f.x, xf[2 * j], p);
            p = fmaf(f.y, xf[2 * j + 1], p);
          }
          acc[r] = fmaf(p, s, acc[r]);
        }
      }
    }
  }
}

// w4_dot_rows for FP8 matrices: a 16-byte chunk holds 4 words of 4 inputs (16 inputs); lane `sub` takes chunks sub,
// sub + lanes, ... (lanes from the row's code bytes: w4_code_cols), kW4GemvChunks of them per row loaded ahead with
// their F32 group scale where a chunk lies in one group. Per word: the 4 products of e4m3 * 2^-8 (exact,
// decode_word_fp8) and the FP16 activations summed in FP32, times the F32 group scale, into acc[r].
template <int R>
__device__ __forceinline__ void fp8_dot_rows(const W4Mat& w, const int64_t (&row)[R], const __half* __restrict__ x,
                                             int sub, int lanes, float (&acc)[R]) {
  constexpr int C = kW4GemvChunks;
  const int words = w.cols / 4, chunks = w.wpr / 4;
  const bool chunk_scale = w.group % 16 == 0;  // one group per chunk (else looked up per word)
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c0 = sub; c0 < chunks; c0 += lanes * C) {
    uint4 code[R][C];
    float sc[R][C];
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const int c = c0 + i * lanes;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        code[r][i] = make_uint4(0, 0, 0, 0);
        sc[r][i] = 0.f;
        if (c < chunks) {
          code[r][i] = __ldg(reinterpret_cast<const uint4*>(w.codes + row[r] * w.wpr) + c);
          if (chunk_scale) sc[r][i] = __ldg(w.fscales + row[r] * w.groups + (c * 16) / w.group);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const int c = c0 + i * lanes;
      if (c >= chunks) break;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int wi = 4 * c + q;
        if (wi >= words) break;  // padding words of the last chunk
        const uint2 xr = __ldg(reinterpret_cast<const uint2*>(x + wi * 4));
        const float2 x01 = __half22float2(bits_h2(xr.x)), x23 = __half22float2(bits_h2(xr.y));
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float s = chunk_scale ? sc[r][i] : __ldg(w.fscales + row[r] * w.groups + (wi * 4) / w.group);
          const uint32_t cw[4] = {code[r][i].x, code[r][i].y, code[r][i].z, code[r][i].w};
          __half2 v[2];
          decode_word_fp8(cw[q], v);
          const float2 f01 = __half22float2(v[0]), f23 = __half22float2(v[1]);
          float p = f01.x * x01.x;
          p = fmaf(f01.y, x01.y, p);
          p = fmaf(f23.x, x23.x, p);
          p = fmaf(f23.y, x23.y, p);
          acc[r] = fmaf(p, s, acc[r]);
        }
      }
    }
  }
}

// The dot products of the GEMV kernels for format FMT.
template <int FMT, int R>
__device__ __forceinline__ void gemv_dot_rows(const W4Mat& w, const int64_t (&row)[R], const __half* __restrict__ x,
                                              int sub, int lanes, float (&acc)[R]) {
  if constexpr (FMT == kFp8)
    fp8_dot_rows<R>(w, row, x, sub, lanes, acc);
  else
    w4_dot_rows<FMT == kNvfp4, R>(w, row, x, sub, lanes, acc);
}

// First output column of this thread's lane group; the block covers O * (threads / lanes) columns.
template <int O>
__device__ __forceinline__ int gemv_col0(int lanes) {
  return (int(blockIdx.y) * (kW4GemvThreads / lanes) + int(threadIdx.x) / lanes) * O;
}

// Block (s, y): slot s, kW4GemvOutsGateUp gate and up rows per lane group. h[s, n] = fp16(silu(G(g)) * G(u)).
template <int FMT>
__global__ void __launch_bounds__(kW4GemvThreads)
    w4_gemv_gate_up_kernel(W4Mat w, const __half* __restrict__ u, int64_t ldu, const int32_t* __restrict__ ids,
                           int top_k, int experts, int inter, int lanes, __half* __restrict__ h,
                           int32_t* __restrict__ status) {
  pdl_begin();
  constexpr int O = kW4GemvOutsGateUp;
  const int s = blockIdx.x, e = ids[s];
  if (e < 0 || e >= experts) {
    if (blockIdx.y == 0 && threadIdx.x == 0 && status) atomicOr(status, 1);
    return;
  }
  const int n0 = gemv_col0<O>(lanes);
  if (n0 >= inter) return;  // the whole lane group
  int64_t row[2 * O];
#pragma unroll
  for (int o = 0; o < O; ++o) {
    const int n = min(n0 + o, inter - 1);
    row[o] = int64_t(e) * w.rows + n;
    row[O + o] = int64_t(e) * w.rows + inter + n;
  }
  float acc[2 * O];
  gemv_dot_rows<FMT>(w, row, u + int64_t(s / top_k) * ldu, int(threadIdx.x) % lanes, lanes, acc);
#pragma unroll
  for (int o = 0; o < O; ++o) {
    const float g = apply_global(group_sum(acc[o], lanes), w.global[row[o]], w.divide);
    const float v = apply_global(group_sum(acc[O + o], lanes), w.global[row[O + o]], w.divide);
    if (int(threadIdx.x) % lanes == 0 && n0 + o < inter) h[int64_t(s) * inter + n0 + o] = to_h(siluf_(g) * v);
  }
}

// The down kernels' epilogue, after the block has written its rows of ys (block (s, y) of a grid of slots x row
// blocks of `per_block` rows): the last of token t's top_k slot blocks to finish row block y (a counter per (token,
// y) in `done`, reset by that block) combines those rows as moe_combine_kernel: the valid slots' ys in slot order, in
// FP32, + the gated shared expert's term (FP32, if given). After a block barrier thread 0 counts with an
// acquire-release atomic at GPU scope (its release covers the writes the barrier ordered before it; its acquire, in the
// last block, the other blocks' writes), and the combining block reads the ys from L2 (__ldcg). Every thread of the
// block calls it.
template <class TO>
__device__ __forceinline__ void w4_gemv_combine(const int32_t* __restrict__ ids, int top_k, int experts, int hidden,
                                                int t, int per_block, const __half* ys, int32_t* __restrict__ done,
                                                const float* __restrict__ shared, TO* __restrict__ out, int64_t ldo) {
  __shared__ int last;
  __syncthreads();  // the block's ys writes happen before thread 0's release (cumulative over the barrier)
  if (threadIdx.x == 0) {
    int32_t* cnt = done + int64_t(t) * gridDim.y + blockIdx.y;
    int32_t before;
    asm volatile("atom.acq_rel.gpu.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(cnt) : "memory");
    last = before == top_k - 1;
    if (last) *cnt = 0;  // every other block of this (token, row block) has counted: nobody reads it before the next
  }                      // launch, which stream order separates
  __syncthreads();
  if (!last) return;
  const int c0 = int(blockIdx.y) * per_block;
  for (int c = c0 + int(threadIdx.x); c < min(hidden, c0 + per_block); c += int(blockDim.x)) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int sj = t * top_k + j, ej = ids[sj];
      if (ej >= 0 && ej < experts) acc += to_f(__ldcg(ys + int64_t(sj) * hidden + c));
    }
    if (shared) acc += shared[int64_t(t) * hidden + c];
    out[int64_t(t) * ldo + c] = from_f<TO>(acc);
  }
}

// Block (s, y): slot s, kW4GemvOutsDown down rows per lane group: ys[s, n] = fp16(weights[s] * G(y)), then
// w4_gemv_combine.
template <int FMT, class TO>
__global__ void __launch_bounds__(kW4GemvThreads)
    w4_gemv_down_kernel(W4Mat w, const __half* __restrict__ h, const int32_t* __restrict__ ids,
                        const float* __restrict__ weights, int top_k, int experts, int hidden, int inter, int lanes,
                        __half* ys, int32_t* __restrict__ done, const float* __restrict__ shared, TO* __restrict__ out,
                        int64_t ldo) {
  pdl_begin();
  constexpr int O = kW4GemvOutsDown;
  const int s = blockIdx.x, t = s / top_k, e = ids[s];
  if (e >= 0 && e < experts) {
    const int n0 = gemv_col0<O>(lanes);
    if (n0 < hidden) {
      int64_t row[O];
#pragma unroll
      for (int o = 0; o < O; ++o) row[o] = int64_t(e) * w.rows + min(n0 + o, hidden - 1);
      float acc[O];
      gemv_dot_rows<FMT>(w, row, h + int64_t(s) * inter, int(threadIdx.x) % lanes, lanes, acc);
      const float ws = weights[s];
#pragma unroll
      for (int o = 0; o < O; ++o) {
        const float y = apply_global(group_sum(acc[o], lanes), w.global[row[o]], w.divide);
        if (int(threadIdx.x) % lanes == 0 && n0 + o < hidden) ys[int64_t(s) * hidden + n0 + o] = to_h(y * ws);
      }
    }
  }
  w4_gemv_combine(ids, top_k, experts, hidden, t, O * (kW4GemvThreads / lanes), ys, done, shared, out, ldo);
}

// Every instance is compiled in every build (NVRTC included, for the SM70 check).
#define FN_W4_GEMV(FMT)                                                                                              \
  template __global__ void w4_gemv_gate_up_kernel<FMT>(W4Mat, const __half*, int64_t, const int32_t*, int, int, int, \
                                                       int, __half*, int32_t*);                                      \
  template __global__ void w4_gemv_down_kernel<FMT, __half>(W4Mat, const __half*, const int32_t*, const float*, int, \
                                                            int, int, int, int, __half*, int32_t*, const float*,     \
                                                            __half*, int64_t);                                       \
  template __global__ void w4_gemv_down_kernel<FMT, float>(W4Mat, const __half*, const int32_t*, const float*, int,  \
                                                           int, int, int, int, __half*, int32_t*, const float*,      \
                                                           float*, int64_t);
FN_W4_GEMV(kInt4)
FN_W4_GEMV(kNvfp4)
FN_W4_GEMV(kFp8)
#undef FN_W4_GEMV

// ---------------------------------------------------------------- GEMV path on tensor cores (decode, SM80+)
//
// The same products as the GEMV above on mma.sync m16n8k16 (FP16 inputs, FP32 accumulation; PTX ISA 7.0, compute
// capability 8.0+; below 8.0 these kernels compile to nothing and the host never picks them). A warp computes a tile
// of 16 weight rows against one activation vector. The A operand is the decoded weights scaled by their group scale
// in FP16: NVFP4 fp16(e2m1 * 2^-14) * scale16 is exact (e2m1 * e4m3 has at most 6 significant bits and its lowest set
// bit is at 2^-10, so times 2^-14 it lies on the FP16 grid; |value| <= 6 * 448 * 2^-14), the 2^14 comes back in the
// FP32 epilogue; int4 fp16(fp16(q - z) * scale16), one rounding as in the GEMM path. The B operand is the activation
// vector in all 8 columns (every column of D holds the same dot products). k order: lane (g, t) of the warp (g = lane
// / 4, t = lane % 4) takes the 16-byte code chunk c = 4j + t of its rows g and g + 8 (32 inputs each, 4 code words)
// for super-chunk j, and feeds word q's pairs (0, 1) and (2, 3) as its A k-slots {2t, 2t+1} and {2t+8, 2t+9} of two
// MMA steps, with the activations of the same inputs as its B k-slots: every MMA step sums 16 inputs of each row,
// four from each of the quad's chunks, so the 4 chunks x 4 words x 2 steps cover the super-chunk's 128 inputs once.
// The activation vector is staged in shared memory (zero past the row, so padding chunks add nothing); the codes and
// scales of the next kW4MmaDepth super-chunks are in flight while one is computed.

constexpr int kW4MmaDepth = 2;  // super-chunks (4 x 32 inputs of a row) per lane loaded ahead of the one computed
// Super-chunks (4 code chunks, 128 inputs) of a row of `cols` inputs.
__host__ __device__ constexpr int w4_mma_supers(int cols) {
  return (cols / 8 + 15) / 16;
}
// Blocks per SM the register allocation must allow (at most 73 registers a thread): 7 * 132 SMs of an H100 / H200
// hold the 800 gate/up blocks of one token's 10 slots at once (one wave); without the bound the ring of stages takes
// 94 registers, 5 blocks per SM.
constexpr int kW4MmaMinBlocks = 7;

// FP16x2 multiply on raw 32-bit registers (the operands and result of the MMA are raw registers: no unpacking).
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// The A values of code word q of a chunk as 4 raw FP16 pairs (k0,k1) (k2,k3) (k4,k5) (k6,k7), times the scale pair
// s2 (the group scale in both halves). NVFP4: e2m1 * 2^-14 placed bitwise (decode_word_nvfp4_scaled), then * s2,
// exact; int4: (q - z) exactly, then * s2, one rounding. z: the zero point (int4).
template <bool NVFP4>
__device__ __forceinline__ void w4_scaled_word(uint32_t word, uint32_t s2, uint32_t z, uint32_t (&v)[4]) {
  if (NVFP4) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[j] = hmul2_bits((((word >> (4 * j)) & 0x00070007u) << 9) | ((word << (12 - 4 * j)) & 0x80008000u), s2);
  } else {
    const uint32_t bias = (0x6400u | z) * 0x00010001u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t d;
      asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(((word >> (4 * j)) & 0x000F000Fu) | 0x64006400u), "r"(bias));
      v[j] = hmul2_bits(d, s2);
    }
  }
}

// One lane's share of a super-chunk: the code chunks of its two rows and their scale words (NVFP4: the FP16 scales
// of groups 2c and 2c + 1; int4, groups of a multiple of 32 inputs: FP16 scale | zero point << 16). Zero past the row.
struct W4MmaStage {
  uint4 lo, hi;
  uint32_t slo, shi;
};

template <bool NVFP4>
__device__ __forceinline__ W4MmaStage w4_mma_load(const W4Mat& w, int64_t row_lo, int64_t row_hi, int c, int chunks) {
  W4MmaStage s{make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0), 0u, 0u};
  if (c < chunks) {
    s.lo = __ldg(reinterpret_cast<const uint4*>(w.codes + row_lo * w.wpr) + c);
    s.hi = __ldg(reinterpret_cast<const uint4*>(w.codes + row_hi * w.wpr) + c);
    s.slo = w4_chunk_scales<NVFP4>(w, row_lo, c);
    s.shi = w4_chunk_scales<NVFP4>(w, row_hi, c);
  }
  return s;
}

// Index of the staged activations' 16-byte word i in shared memory: one word of padding after every 8, so that the
// quad's lanes t and t + 2 (words 128 bytes apart) read different banks.
__device__ __forceinline__ int w4_mma_xs_index(int i) {
  return i + (i >> 3);
}

// The A values of code word q (0..3) of a lane's stage st: vl for its row g, vh for row g + 8 (w4_scaled_word with
// the word's group scale, and zero point for int4).
template <bool NVFP4>
__device__ __forceinline__ void w4_mma_decode(const W4MmaStage& st, int q, uint32_t (&vl)[4], uint32_t (&vh)[4]) {
  const uint32_t wl = q == 0 ? st.lo.x : q == 1 ? st.lo.y : q == 2 ? st.lo.z : st.lo.w;
  const uint32_t wh = q == 0 ? st.hi.x : q == 1 ? st.hi.y : q == 2 ? st.hi.z : st.hi.w;
  uint32_t sl, sh, zl = 0, zh = 0;
  if (NVFP4) {  // group 2c for words 0-1, 2c + 1 for words 2-3
    sl = __byte_perm(st.slo, 0, q < 2 ? 0x1010u : 0x3232u);
    sh = __byte_perm(st.shi, 0, q < 2 ? 0x1010u : 0x3232u);
  } else {
    sl = __byte_perm(st.slo, 0, 0x1010u);
    sh = __byte_perm(st.shi, 0, 0x1010u);
    zl = st.slo >> 16;
    zh = st.shi >> 16;
  }
  w4_scaled_word<NVFP4>(wl, sl, zl, vl);
  w4_scaled_word<NVFP4>(wh, sh, zh, vh);
}

// The 8 MMA steps of one lane's chunk c (stage st) against the staged activations xs.
template <bool NVFP4>
__device__ __forceinline__ void w4_mma_chunk(const W4MmaStage& st, const uint4* __restrict__ xs, int c, float (&d)[4],
                                             float (&e)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 xv = xs[w4_mma_xs_index(4 * c + q)];
    uint32_t vl[4], vh[4];
    w4_mma_decode<NVFP4>(st, q, vl, vh);
    mma_m16n8k16(d, vl[0], vh[0], vl[1], vh[1], xv.x, xv.y);
    mma_m16n8k16(e, vl[2], vh[2], vl[3], vh[3], xv.z, xv.w);
  }
}

// The activation vector staged in shared memory in two steps, so that its loads are in flight while the kernel reads
// the slot's expert id and issues its first code loads: load() takes the first words of x [cols] (16-byte aligned;
// a word = 8 inputs) into kW4MmaXRegs registers of 16 bytes a thread, store() writes them to xs as FP16, zero-padded
// to `supers` super-chunks of 128 inputs, copies any rest directly and ends with a block barrier. TX: FP16, or FP32
// (the ops interface's activations, rounded to FP16 as they are staged, as an FP16 copy made first would round
// them; a word is then two 16-byte loads, so half as many words wait in registers). Every thread of the block calls
// both.
constexpr int kW4MmaXRegs = 4;
template <class TX>
struct W4MmaX {
  static constexpr int kVecs = int(sizeof(TX)) / 2;   // 16-byte loads a word: 1 (FP16) or 2 (FP32)
  static constexpr int kWords = kW4MmaXRegs / kVecs;  // words a thread holds in registers
  uint4 v[kW4MmaXRegs];
  // Word i of x as 8 FP16 values (raw: its kVecs 16-byte loads).
  __device__ static __forceinline__ uint4 f16_word(const uint4* raw) {
    if constexpr (kVecs == 1) {
      return raw[0];
    } else {
      const float4 a = *reinterpret_cast<const float4*>(&raw[0]), b = *reinterpret_cast<const float4*>(&raw[1]);
      return make_uint4(h2_bits(__floats2half2_rn(a.x, a.y)), h2_bits(__floats2half2_rn(a.z, a.w)),
                        h2_bits(__floats2half2_rn(b.x, b.y)), h2_bits(__floats2half2_rn(b.z, b.w)));
    }
  }
  __device__ __forceinline__ void load(const TX* __restrict__ x, int cols, int supers) {
    const int words = cols / 8;
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const int i = int(threadIdx.x) + k * int(blockDim.x);
#pragma unroll
      for (int q = 0; q < kVecs; ++q)
        v[k * kVecs + q] =
            i < words ? __ldg(reinterpret_cast<const uint4*>(x) + int64_t(i) * kVecs + q) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void store(const TX* __restrict__ x, int cols, int supers, uint4* xs) const {
    const int words = cols / 8, n = supers * 16;
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const int i = int(threadIdx.x) + k * int(blockDim.x);
      if (i < n) xs[w4_mma_xs_index(i)] = f16_word(&v[k * kVecs]);
    }
    for (int i = int(threadIdx.x) + kWords * int(blockDim.x); i < n; i += int(blockDim.x)) {
      uint4 raw[kVecs];
#pragma unroll
      for (int q = 0; q < kVecs; ++q)
        raw[q] = i < words ? __ldg(reinterpret_cast<const uint4*>(x) + int64_t(i) * kVecs + q) : make_uint4(0, 0, 0, 0);
      xs[w4_mma_xs_index(i)] = f16_word(raw);
    }
    __syncthreads();
  }
};

// The block's rows times the staged activations: TILES tiles of 16 rows, kW4MmaWarps / TILES warps per tile
// splitting its super-chunks (warp k of a tile takes k, k + split, ...). This lane's rows are row_lo (tile row g) and
// row_hi (g + 8). stage() stages the activations into shared memory and ends with a block barrier; it runs once the
// first kW4MmaDepth super-chunks' codes are in flight. xs: the staged activations of this lane's MMA column g (the
// B operand; COLS 1: one vector in every column, so lane g's xs is the block's; COLS kW4GroupSlots: column g is slot
// g's vector). The FP32 sums, added over the tile's warps in warp order, land in sums[(tile * 16 + r) * COLS + col]
// (shared memory; NVFP4: times 2^-14). Every thread of the block calls it (barriers inside).
template <bool NVFP4, int TILES, int COLS, class Stage>
__device__ __forceinline__ void w4_mma_block(const W4Mat& w, int64_t row_lo, int64_t row_hi, Stage&& stage,
                                             const uint4* xs, float* sums) {
  static_assert(COLS == 1 || COLS == kW4GroupSlots, "one vector, or one slot an MMA column");
  constexpr int kSplit = kW4MmaWarps / TILES, D = kW4MmaDepth;
  __shared__ float part[kW4MmaWarps][16][COLS];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, t = lane & 3, g = lane >> 2;
  const int chunks = (w.cols / 8 + 3) / 4, supers = w4_mma_supers(w.cols);
  const int j0 = warp % kSplit;
  W4MmaStage st[D + 1];  // codes in flight before the activations are staged
#pragma unroll
  for (int i = 0; i < D; ++i) st[i] = w4_mma_load<NVFP4>(w, row_lo, row_hi, 4 * (j0 + i * kSplit) + t, chunks);
  stage();
  float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};  // two independent MMA chains
  // A ring of D + 1 stages unrolled D + 1 times, so that no stage is copied (a copy would wait for its loads): step r
  // refills the slot step r - 1 computed with the super-chunk D ahead, then computes slot r.
  for (int j = j0; j < supers; j += (D + 1) * kSplit) {
#pragma unroll
    for (int r = 0; r <= D; ++r) {
      st[(r + D) % (D + 1)] = w4_mma_load<NVFP4>(w, row_lo, row_hi, 4 * (j + (r + D) * kSplit) + t, chunks);
      if (j + r * kSplit < supers) w4_mma_chunk<NVFP4>(st[r], xs, 4 * (j + r * kSplit) + t, d, e);
    }
  }
  if constexpr (COLS == 1) {  // every column holds the same sums: column 0's
    if (t == 0) {
      part[warp][g][0] = d[0] + e[0];
      part[warp][8 + g][0] = d[2] + e[2];
    }
  } else {  // D fragment: rows g and g + 8, columns 2t and 2t + 1
    part[warp][g][2 * t] = d[0] + e[0];
    part[warp][g][2 * t + 1] = d[1] + e[1];
    part[warp][8 + g][2 * t] = d[2] + e[2];
    part[warp][8 + g][2 * t + 1] = d[3] + e[3];
  }
  __syncthreads();
  for (int q = int(threadIdx.x); q < TILES * 16 * COLS; q += int(blockDim.x)) {
    const int tile = q / (16 * COLS), rc = q % (16 * COLS);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kSplit; ++k) s += part[tile * kSplit + k][rc / COLS][rc % COLS];
    sums[q] = s;
  }
  __syncthreads();
}

// Dynamic shared memory of the tensor-core GEMV kernels for rows of `cols` inputs: the staged activations (whole
// super-chunks of 16 words, each 8 words followed by a padding word).
constexpr size_t w4_mma_smem(int cols) {
  return size_t(w4_mma_supers(cols)) * 18 * sizeof(uint4);
}

// Block (s, y): slot s, gate rows y*8 .. y*8+7 and the matching up rows as one 16-row tile (tile rows 0-7 gate,
// 8-15 up), all kW4MmaWarps warps on it. h[s, n] = fp16(silu(G(g)) * G(u)). TU: the activations' type (W4MmaX).
template <bool NVFP4, class TU>
__global__ void __launch_bounds__(kW4MmaWarps * 32, kW4MmaMinBlocks)
    w4_gemv_mma_gate_up_kernel(W4Mat w, const TU* __restrict__ u, int64_t ldu, const int32_t* __restrict__ ids,
                               int top_k, int experts, int inter, __half* __restrict__ h,
                               int32_t* __restrict__ status) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ uint4 xs[];
  __shared__ float sums[16];
  const int s = blockIdx.x;
  const TU* x = u + int64_t(s / top_k) * ldu;
  const int supers = w4_mma_supers(w.cols);
  W4MmaX<TU> xr;
  xr.load(x, w.cols, supers);  // independent of the expert id: in flight while it is read
  const int e = ids[s];
  if (e < 0 || e >= experts) {
    if (blockIdx.y == 0 && threadIdx.x == 0 && status) atomicOr(status, 1);
    return;
  }
  const int g = (int(threadIdx.x) & 31) >> 2, n0 = int(blockIdx.y) * 8;
  const int64_t base = int64_t(e) * w.rows;
  const int n = min(n0 + g, inter - 1);
  const bool out_lane = threadIdx.x < 8 && n0 + int(threadIdx.x) < inter;
  const int nn = n0 + int(threadIdx.x);
  float gg = 0.f, gu = 0.f;  // the row multipliers, loaded ahead
  if (out_lane) {
    gg = w.global[base + nn];
    gu = w.global[base + inter + nn];
  }
  w4_mma_block<NVFP4, 1, 1>(
      w, base + n, base + inter + n, [&] { xr.store(x, w.cols, supers, xs); }, xs, sums);
  if (out_lane) {
    const float k = NVFP4 ? kNvfp4GemvScale : 1.f;
    const float gv = apply_global(sums[threadIdx.x] * k, gg, w.divide);
    const float uv = apply_global(sums[8 + threadIdx.x] * k, gu, w.divide);
    h[int64_t(s) * inter + nn] = to_h(siluf_(gv) * uv);
  }
#endif
}

// Block (s, y): slot s, rows y * 16 * kW4MmaDownTiles .. (kW4MmaDownTiles tiles, kW4MmaWarps / kW4MmaDownTiles warps
// each): ys[s, n] = fp16(weights[s] * G(y)), then w4_gemv_combine.
template <bool NVFP4, class TO>
__global__ void __launch_bounds__(kW4MmaWarps * 32, kW4MmaMinBlocks)
    w4_gemv_mma_down_kernel(W4Mat w, const __half* __restrict__ h, const int32_t* __restrict__ ids,
                            const float* __restrict__ weights, int top_k, int experts, int hidden, int inter,
                            __half* ys, int32_t* __restrict__ done, const float* __restrict__ shared,
                            TO* __restrict__ out, int64_t ldo) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kRows = 16 * kW4MmaDownTiles;
  extern __shared__ uint4 xs[];
  __shared__ float sums[kRows];
  const int s = blockIdx.x, t = s / top_k;
  const __half* x = h + int64_t(s) * inter;
  W4MmaX<__half> xr;
  xr.load(x, w.cols, w4_mma_supers(w.cols));  // independent of the expert id: in flight while it is read
  const int e = ids[s];
  const int r0 = int(blockIdx.y) * kRows;
  if (e >= 0 && e < experts) {  // uniform over the block
    const int warp = int(threadIdx.x) >> 5, g = (int(threadIdx.x) & 31) >> 2;
    const int tile0 = r0 + (warp / (kW4MmaWarps / kW4MmaDownTiles)) * 16;
    const int64_t base = int64_t(e) * w.rows;
    const int n = r0 + int(threadIdx.x);
    const bool out_lane = threadIdx.x < kRows && n < hidden;
    float gn = 0.f, ws = 0.f;  // the row multiplier and the slot's routing weight, loaded ahead
    if (out_lane) {
      gn = w.global[base + n];
      ws = weights[s];
    }
    w4_mma_block<NVFP4, kW4MmaDownTiles, 1>(
        w, base + min(tile0 + g, hidden - 1), base + min(tile0 + 8 + g, hidden - 1),
        [&] { xr.store(x, w.cols, w4_mma_supers(w.cols), xs); }, xs, sums);
    if (out_lane) {
      const float k = NVFP4 ? kNvfp4GemvScale : 1.f;
      ys[int64_t(s) * hidden + n] = to_h(apply_global(sums[threadIdx.x] * k, gn, w.divide) * ws);
    }
  }
  w4_gemv_combine(ids, top_k, experts, hidden, t, kRows, ys, done, shared, out, ldo);
#endif
}

#define FN_W4_GEMV_MMA_GATE_UP(NV, TU)                                                                             \
  template __global__ void w4_gemv_mma_gate_up_kernel<NV, TU>(W4Mat, const TU*, int64_t, const int32_t*, int, int, \
                                                              int, __half*, int32_t*);
FN_W4_GEMV_MMA_GATE_UP(true, __half)
FN_W4_GEMV_MMA_GATE_UP(true, float)
FN_W4_GEMV_MMA_GATE_UP(false, __half)
FN_W4_GEMV_MMA_GATE_UP(false, float)
#undef FN_W4_GEMV_MMA_GATE_UP
#define FN_W4_GEMV_MMA_DOWN(NV, TO)                                                                                 \
  template __global__ void w4_gemv_mma_down_kernel<NV, TO>(W4Mat, const __half*, const int32_t*, const float*, int, \
                                                           int, int, int, __half*, int32_t*, const float*, TO*,     \
                                                           int64_t);
FN_W4_GEMV_MMA_DOWN(true, __half)
FN_W4_GEMV_MMA_DOWN(true, float)
FN_W4_GEMV_MMA_DOWN(false, __half)
FN_W4_GEMV_MMA_DOWN(false, float)
#undef FN_W4_GEMV_MMA_DOWN

// ---------------------------------------------------------------- grouped tensor-core GEMV (decode, several tokens)
// The tensor-core GEMV above puts one activation vector in all 8 columns of the MMA, so every slot reads its expert's
// weights itself. Here the slots are grouped by expert first (launch_w4_align, tiles of kW4GroupSlots sorted rows)
// and column g of the MMA is the tile's slot g: a block reads its rows' codes once for up to 8 slots. The A operand,
// the k order, the split over warps and every sum are those of the one-slot kernels, and an MMA column's sums do not
// depend on the other columns, so each slot's values are bit for bit the one-slot kernels'. Lanes of a column past
// the tile's slots read slot n - 1's activations (their sums are not stored).

// Shared-memory stride of one staged slot in 16-byte words: whole padded super-chunks (w4_mma_smem), rounded up to
// 2 mod 8, so that the two slots a quarter-warp's 16-byte loads read (lanes g = 2m, 2m + 1) fall in different banks.
__host__ __device__ constexpr int w4_group_stride(int cols) {
  return w4_mma_supers(cols) * 18 + (10 - w4_mma_supers(cols) * 18 % 8) % 8;
}
// Dynamic shared memory of the grouped kernels: kW4GroupSlots staged rows.
constexpr size_t w4_group_smem(int cols) {
  return size_t(kW4GroupSlots) * size_t(w4_group_stride(cols)) * sizeof(uint4);
}
// Static shared memory of the grouped kernels, at most: w4_mma_block's partial sums, the down kernel's sums, the row
// pointers.
constexpr size_t kW4GroupStaticSmem =
    sizeof(float) * (kW4MmaWarps * 16 * kW4GroupSlots + 16 * kW4MmaDownTiles * kW4GroupSlots) +
    sizeof(void*) * kW4GroupSlots;

// Stages the activation rows of a tile's n slots (1 <= n <= kW4GroupSlots; rows[j], in shared memory, is slot j's,
// written before the call: the barrier at the start orders them) into xs, slot j at xs + j * w4_group_stride(cols),
// each as W4MmaX stages one vector (FP16 words, FP32 rounded to FP16, zero past the row up to whole super-chunks),
// then a block barrier. Each thread issues kBatch words' loads before it stores them.
template <class TX>
__device__ __forceinline__ void w4_group_stage(const TX* const* rows, int n, int cols, uint4* xs) {
  constexpr int V = W4MmaX<TX>::kVecs, kBatch = 8 / V;  // 16-byte loads a word; words in flight a thread
  const int words = cols / 8, per = w4_mma_supers(cols) * 16, stride = w4_group_stride(cols), total = n * per;
  __syncthreads();
  for (int i0 = int(threadIdx.x); i0 < total; i0 += kBatch * int(blockDim.x)) {
    uint4 raw[kBatch][V];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * int(blockDim.x), j = i / per, k = i % per;
      const bool in = i < total && k < words;
#pragma unroll
      for (int q = 0; q < V; ++q)
        raw[b][q] = in ? __ldg(reinterpret_cast<const uint4*>(rows[j]) + int64_t(k) * V + q) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * int(blockDim.x);
      if (i < total) xs[(i / per) * stride + w4_mma_xs_index(i % per)] = W4MmaX<TX>::f16_word(raw[b]);
    }
  }
  __syncthreads();
}

// Block (i, y): tile i (expert e, sorted rows r0 .. r0 + n - 1), gate rows y*8 .. y*8+7 and the matching up rows as
// one 16-row tile (tile rows 0-7 gate, 8-15 up), all kW4MmaWarps warps on it, the n slots as the MMA's columns.
// h[r0 + j, n] = fp16(silu(G(g)) * G(u)) of slot j. TU: the activations' type.
template <bool NVFP4, class TU>
__global__ void __launch_bounds__(kW4MmaWarps * 32)
    w4_gemv_mma_grouped_gate_up_kernel(W4Mat w, const TU* __restrict__ u, int64_t ldu, W4Tiles tiles, int top_k,
                                       int inter, __half* __restrict__ h) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ uint4 xs[];
  __shared__ float sums[16 * kW4GroupSlots];
  const int i = int(blockIdx.x);
  if (i >= *tiles.num_tiles) return;  // uniform over the block
  const int e = tiles.tile_expert[i], r0 = tiles.tile_row[i];
  const int n = min(kW4GroupSlots, tiles.offsets[e + 1] - r0);
  __shared__ const TU* rows[kW4GroupSlots];  // the tile's slots' activation rows (read by w4_group_stage)
  if (int(threadIdx.x) < n) rows[threadIdx.x] = u + int64_t(tiles.sorted_slots[r0 + int(threadIdx.x)] / top_k) * ldu;
  const int g = (int(threadIdx.x) & 31) >> 2, n0 = int(blockIdx.y) * 8;
  const int64_t base = int64_t(e) * w.rows;
  const int nr = min(n0 + g, inter - 1);
  // Output thread q < 64: slot j = q / 8 of the tile, row n0 + q % 8; its row multipliers loaded ahead.
  const int oj = int(threadIdx.x) / 8, orow = int(threadIdx.x) % 8, on = n0 + orow;
  const bool out_lane = threadIdx.x < 8 * kW4GroupSlots && oj < n && on < inter;
  float gg = 0.f, gu = 0.f;
  if (out_lane) {
    gg = w.global[base + on];
    gu = w.global[base + inter + on];
  }
  w4_mma_block<NVFP4, 1, kW4GroupSlots>(
      w, base + nr, base + inter + nr, [&] { w4_group_stage<TU>(rows, n, w.cols, xs); },
      xs + min(g, n - 1) * w4_group_stride(w.cols), sums);
  if (out_lane) {
    const float k = NVFP4 ? kNvfp4GemvScale : 1.f;
    const float gv = apply_global(sums[orow * kW4GroupSlots + oj] * k, gg, w.divide);
    const float uv = apply_global(sums[(8 + orow) * kW4GroupSlots + oj] * k, gu, w.divide);
    h[int64_t(r0 + oj) * inter + on] = to_h(siluf_(gv) * uv);
  }
#endif
}

// Block (i, y): tile i (expert e, sorted rows r0 .. r0 + n - 1), rows y * 16 * kW4MmaDownTiles .. (kW4MmaDownTiles
// tiles, kW4MmaWarps / kW4MmaDownTiles warps each), the n slots' h rows as the MMA's columns:
// ys[r0 + j, n] = fp16(weights[slot j] * G(y)).
template <bool NVFP4>
__global__ void __launch_bounds__(kW4MmaWarps * 32)
    w4_gemv_mma_grouped_down_kernel(W4Mat w, const __half* __restrict__ h, W4Tiles tiles,
                                    const float* __restrict__ weights, int hidden, int inter, __half* __restrict__ ys) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kRows = 16 * kW4MmaDownTiles, kOuts = kRows * kW4GroupSlots / (kW4MmaWarps * 32);
  static_assert(kOuts * kW4MmaWarps * 32 == kRows * kW4GroupSlots, "whole outputs a thread");
  extern __shared__ uint4 xs[];
  __shared__ float sums[kRows * kW4GroupSlots];
  const int i = int(blockIdx.x);
  if (i >= *tiles.num_tiles) return;  // uniform over the block
  const int e = tiles.tile_expert[i], r0 = tiles.tile_row[i];
  const int n = min(kW4GroupSlots, tiles.offsets[e + 1] - r0);
  __shared__ const __half* rows[kW4GroupSlots];  // the tile's h rows (read by w4_group_stage)
  if (int(threadIdx.x) < n) rows[threadIdx.x] = h + int64_t(r0 + int(threadIdx.x)) * inter;
  const int warp = int(threadIdx.x) >> 5, g = (int(threadIdx.x) & 31) >> 2;
  const int rb = int(blockIdx.y) * kRows, tile0 = rb + (warp / (kW4MmaWarps / kW4MmaDownTiles)) * 16;
  const int64_t base = int64_t(e) * w.rows;
  // Output q = threadIdx.x + o * blockDim.x: row rb + q / kW4GroupSlots, slot q % kW4GroupSlots; its row multiplier
  // and routing weight loaded ahead.
  float gn[kOuts], ws[kOuts];
#pragma unroll
  for (int o = 0; o < kOuts; ++o) {
    const int q = int(threadIdx.x) + o * kW4MmaWarps * 32, row = rb + q / kW4GroupSlots, j = q % kW4GroupSlots;
    const bool out = j < n && row < hidden;
    gn[o] = out ? w.global[base + row] : 0.f;
    ws[o] = out ? weights[tiles.sorted_slots[r0 + j]] : 0.f;
  }
  w4_mma_block<NVFP4, kW4MmaDownTiles, kW4GroupSlots>(
      w, base + min(tile0 + g, hidden - 1), base + min(tile0 + 8 + g, hidden - 1),
      [&] { w4_group_stage<__half>(rows, n, w.cols, xs); }, xs + min(g, n - 1) * w4_group_stride(w.cols), sums);
  const float k = NVFP4 ? kNvfp4GemvScale : 1.f;
#pragma unroll
  for (int o = 0; o < kOuts; ++o) {
    const int q = int(threadIdx.x) + o * kW4MmaWarps * 32, row = rb + q / kW4GroupSlots, j = q % kW4GroupSlots;
    if (j < n && row < hidden)
      ys[int64_t(r0 + j) * hidden + row] = to_h(apply_global(sums[q] * k, gn[o], w.divide) * ws[o]);
  }
#endif
}

#define FN_W4_GEMV_MMA_GROUPED(NV)                                                                                     \
  template __global__ void w4_gemv_mma_grouped_gate_up_kernel<NV, __half>(W4Mat, const __half*, int64_t, W4Tiles, int, \
                                                                          int, __half*);                               \
  template __global__ void w4_gemv_mma_grouped_gate_up_kernel<NV, float>(W4Mat, const float*, int64_t, W4Tiles, int,   \
                                                                         int, __half*);                                \
  template __global__ void w4_gemv_mma_grouped_down_kernel<NV>(W4Mat, const __half*, W4Tiles, const float*, int, int,  \
                                                               __half*);
FN_W4_GEMV_MMA_GROUPED(true)
FN_W4_GEMV_MMA_GROUPED(false)
#undef FN_W4_GEMV_MMA_GROUPED

// ---------------------------------------------------------------- tensor-core path (prefill)

constexpr int kBN = 64, kBK = 64, kLd = kBK + 8, kLdc = kBN + 4, kThreads = 128;

// One block: a tile of kW4TileM sorted slots of one expert x kBN output columns (GATE_UP: kBN gate rows and the
// matching kBN up rows). Per K step of kBK inputs the codes are decoded to FP16 weights in shared memory,
// w16 = fp16(value * scale16) (exact for NVFP4; int4: one rounding of (q - z) * scale16; FP8: fp16(float(e4m3 *
// 2^-8) * fscale), moe_w4a16.h), then WMMA m16n16k16 with FP32 accumulation; 4 warps of 32 x 32 outputs. The next
// step's codes and activations are loaded into registers before the current step's MMAs (SM70 has no cp.async).
// Epilogue: the row's global scale in FP32, then h = fp16(silu(g) * u) or ys = fp16(weight(slot) * y).
template <bool GATE_UP, int FMT>
__device__ __forceinline__ void w4_gemm_body(const W4Mat& w, const __half* __restrict__ a_src, int64_t lda, int top_k,
                                             int n_out, const int32_t* __restrict__ offsets,
                                             const int32_t* __restrict__ sorted_slots,
                                             const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
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
  // This thread's B row (one per matrix) and its half of each K step's code words (4-bit: 4 of 8; FP8: 8 of 16).
  constexpr bool FP8 = FMT == kFp8;
  constexpr int kBW = FP8 ? 8 : 4;  // words per thread and step
  const int bn = tid >> 1, bw = (tid & 1) * kBW;
  int64_t brow[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) brow[b] = n0 + bn < n_out ? int64_t(e) * w.rows + n0 + bn + b * n_out : -1;
  __syncthreads();

  constexpr int kAV = kW4TileM * (kBK / 8) / kThreads;  // uint4 of A per thread per step
  uint4 ra[kAV], rb[NB][kBW / 4];
  __half rs[NB][4];
  uint32_t rz[NB][4];
  float rf[NB][FP8 ? kBW : 1];  // FP8: the F32 group scale of each word
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kAV; ++i) {
      const int v = tid + i * kThreads, r = v / (kBK / 8), c = (v % (kBK / 8)) * 8;
      ra[i] = make_uint4(0, 0, 0, 0);
      if (arow[r] && k0 + c < K) ra[i] = *reinterpret_cast<const uint4*>(arow[r] + k0 + c);
    }
    if constexpr (FP8) {
      const int wbase = k0 / 4 + bw;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int j = 0; j < kBW / 4; ++j) {
          rb[b][j] = make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int q = 0; q < 4; ++q) rf[b][4 * j + q] = 0.f;
          if (brow[b] >= 0 && wbase + 4 * j < w.wpr) {  // wpr is a multiple of 4: each uint4 is in the row or not
            rb[b][j] = __ldg(reinterpret_cast<const uint4*>(w.codes + brow[b] * w.wpr + wbase + 4 * j));
            // The thread's 32 inputs lie in one group where groups are multiples of 32: one scale, else per word.
            if (w.group % 32 == 0) {
              const float sf = j == 0 ? w.fscales[brow[b] * w.groups + (wbase * 4) / w.group] : rf[b][0];
#pragma unroll
              for (int q = 0; q < 4; ++q) rf[b][4 * j + q] = sf;
            } else {
#pragma unroll
              for (int q = 0; q < 4; ++q)
                rf[b][4 * j + q] = w.fscales[brow[b] * w.groups + ((wbase + 4 * j + q) * 4) / w.group];
            }
          }
        }
      }
    } else {
      const int wbase = k0 / 8 + bw;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        rb[b][0] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          rs[b][q] = __ushort_as_half(0);
          rz[b][q] = 0;
        }
        if (brow[b] >= 0 && wbase < w.wpr) {  // wpr is a multiple of 4: the 4 words are in the row
          rb[b][0] = __ldg(reinterpret_cast<const uint4*>(w.codes + brow[b] * w.wpr + wbase));
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            // The group of word wbase + q: a shift where the group is 32 * 2^k inputs (a division per word cost the
            // int4 g32 GEMM 4% at 4,096 tokens on the H100); the same shift in the chunk scales of the mma.sync
            // kernels measured 3-9% slower there (one H100 run), so they keep the division.
            const int gi = w.chunk_shift >= 0 ? (wbase + q) >> (w.chunk_shift + 2) : ((wbase + q) * 8) / w.group;
            rs[b][q] = w.scales[brow[b] * w.groups + gi];
            rz[b][q] = w.zeros ? uint32_t(w.zeros[brow[b] * w.groups + gi]) : 8u;
          }
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
    if constexpr (FP8) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int q = 0; q < kBW; ++q) {
          const uint4 r4 = rb[b][q / 4];
          const uint32_t words[4] = {r4.x, r4.y, r4.z, r4.w};
          __half2 v[2];
          decode_word_fp8(words[q % 4], v);
          const float sf = rf[b][q];
          const float2 f01 = __half22float2(v[0]), f23 = __half22float2(v[1]);
          uint2 o;
          o.x = h2_bits(__floats2half2_rn(f01.x * sf, f01.y * sf));
          o.y = h2_bits(__floats2half2_rn(f23.x * sf, f23.y * sf));
          *reinterpret_cast<uint2*>(Bs + (b * kBN + bn) * kLd + (bw + q) * 4) = o;
        }
      }
    } else {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint32_t words[4] = {rb[b][0].x, rb[b][0].y, rb[b][0].z, rb[b][0].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          __half2 v[4];
          decode_word<FMT == kNvfp4>(words[q], rz[b][q], v);
          const __half2 s2 = __half2half2(rs[b][q]);
          uint4 o;
          o.x = h2_bits(__hmul2(v[0], s2));
          o.y = h2_bits(__hmul2(v[1], s2));
          o.z = h2_bits(__hmul2(v[2], s2));
          o.w = h2_bits(__hmul2(v[3], s2));
          *reinterpret_cast<uint4*>(Bs + (b * kBN + bn) * kLd + (bw + q) * 8) = o;
        }
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

// One kernel per (matrix, format): each instance holds one body and its shared memory.
template <bool GATE_UP, int FMT>
__global__ void __launch_bounds__(kThreads)
    w4_gemm_kernel(W4Mat w, const __half* __restrict__ a_src, int64_t lda, int top_k, int n_out,
                   const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                   const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
                   const int32_t* __restrict__ tile_row, const int32_t* __restrict__ num_tiles,
                   __half* __restrict__ out) {
  pdl_begin();
  w4_gemm_body<GATE_UP, FMT>(w, a_src, lda, top_k, n_out, offsets, sorted_slots, weights, tile_expert, tile_row,
                             num_tiles, out);
}

// The four (matrix, format) instances of w4_gemm_mma_kernel (below: NVFP4 and int4).
#define FN_W4_GEMM(KERNEL)                                                                                             \
  template __global__ void KERNEL<true, true>(W4Mat, const __half*, int64_t, int, int, const int32_t*, const int32_t*, \
                                              const float*, const int32_t*, const int32_t*, const int32_t*, __half*);  \
  template __global__ void KERNEL<true, false>(W4Mat, const __half*, int64_t, int, int, const int32_t*,                \
                                               const int32_t*, const float*, const int32_t*, const int32_t*,           \
                                               const int32_t*, __half*);                                               \
  template __global__ void KERNEL<false, true>(W4Mat, const __half*, int64_t, int, int, const int32_t*,                \
                                               const int32_t*, const float*, const int32_t*, const int32_t*,           \
                                               const int32_t*, __half*);                                               \
  template __global__ void KERNEL<false, false>(W4Mat, const __half*, int64_t, int, int, const int32_t*,               \
                                                const int32_t*, const float*, const int32_t*, const int32_t*,          \
                                                const int32_t*, __half*);
// The (matrix, format) instances of w4_gemm_kernel.
#define FN_W4_GEMM_WMMA(GU, FMT)                                                                                 \
  template __global__ void w4_gemm_kernel<GU, FMT>(W4Mat, const __half*, int64_t, int, int, const int32_t*,      \
                                                   const int32_t*, const float*, const int32_t*, const int32_t*, \
                                                   const int32_t*, __half*);
FN_W4_GEMM_WMMA(true, kInt4)
FN_W4_GEMM_WMMA(true, kNvfp4)
FN_W4_GEMM_WMMA(true, kFp8)
FN_W4_GEMM_WMMA(false, kInt4)
FN_W4_GEMM_WMMA(false, kNvfp4)
FN_W4_GEMM_WMMA(false, kFp8)
#undef FN_W4_GEMM_WMMA

// ---------------------------------------------------------------- tensor-core GEMM with mma.sync (prefill, SM80+)

// The prefill GEMM of compute capability 8.0+ (w4_gemm_tensor_cores): the tiles of launch_w4_align (kW4TileM sorted
// slots of one expert) times kW4MmaGemmRows weight rows a block, mma.sync m16n8k16 with FP32 accumulation. The roles
// are those of the tensor-core GEMV: the A operand is the decoded weights times their group scale in FP16 (the same
// exact / one-rounding values, w4_scaled_word), so a warp decodes each code word once into registers (no shared
// memory for weights) and uses it for all of the tile's slots; the B operand is 8 slots' activations. k order as in
// the GEMV: lane (g, t) takes code chunk 4s + t (32 inputs) of its rows g and g + 8 in stage s (128 inputs) and
// feeds word q's pairs as the A k-slots of two MMA steps, with the same inputs of slot g of each 8-slot group as B.
// Per stage the activations of the tile's slots (128 inputs, 16 words of 16 bytes a slot, a padding word after every
// 8 so that the quad's lanes read distinct banks) arrive by cp.async in a ring of two stages, while the code chunks
// of the next stage are loaded into registers. Slot groups past the tile's slots are neither staged nor computed (a
// tile of 20 slots costs 3 of 8 groups). Warp w holds kW4MmaGemmTiles 16-row tiles (gate/up: tile rows 0-7 gate rows
// n, 8-15 the up rows n, so silu(g) u is lane-local) times the 64 slots: 64 FP32 accumulators a lane.
// Measured alternatives (H100, bench_moe_w4a16, 2026-12-06): 8 warps a block, or 128-slot tiles with one 16-row tile
// a warp, were slower at every size (the latter 2x at 1,024 tokens); 3 blocks an SM (168 registers, spilling) within
// 3% either way.
constexpr int kW4MmaGemmWarps = 4;
constexpr int kW4MmaGemmTiles = 2;                                      // 16-row tiles a warp
constexpr int kW4MmaGemmRows = kW4MmaGemmWarps * kW4MmaGemmTiles * 16;  // weight rows a block
// Output columns of a block: gate/up 64 (each a gate and an up row), down 128.
template <bool GATE_UP>
constexpr int kW4MmaGemmOutputs = GATE_UP ? kW4MmaGemmRows / 2 : kW4MmaGemmRows;
constexpr int kW4MmaGemmGroups = kW4TileM / 8;  // 8-slot groups of a tile
constexpr int kW4MmaGemmRowWords = 18;          // 16-byte words a slot's row of one stage takes (16 + 2 padding)

// Without a register bound the kernel takes 254-255 registers (two blocks an SM) and does not spill.
template <bool GATE_UP, bool NVFP4>
__global__ void __launch_bounds__(kW4MmaGemmWarps * 32)
    w4_gemm_mma_kernel(W4Mat w, const __half* __restrict__ a_src, int64_t lda, int top_k, int n_out,
                       const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                       const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
                       const int32_t* __restrict__ tile_row, const int32_t* __restrict__ num_tiles,
                       __half* __restrict__ out) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int RT = kW4MmaGemmTiles, NG = kW4MmaGemmGroups, RW = kW4MmaGemmRowWords, TM = kW4TileM;
  constexpr int kThreadsG = kW4MmaGemmWarps * 32;
  __shared__ uint4 xs[2][TM * RW];
  __shared__ const __half* arow[TM];
  __shared__ float slot_weight[TM];  // down: the routing weight of each row's slot
  const int tile = int(blockIdx.y);
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_row[tile], count = min(TM, offsets[e + 1] - row0);
  const int groups = (count + 7) / 8;  // 8-slot groups with slots (uniform over the block)
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if (tid < TM) {
    const int r = row0 + tid;
    arow[tid] =
        tid < count ? (GATE_UP ? a_src + int64_t(sorted_slots[r] / top_k) * lda : a_src + int64_t(r) * lda) : nullptr;
    if (!GATE_UP) slot_weight[tid] = tid < count ? weights[sorted_slots[r]] : 0.f;
  }
  // This lane's weight rows: tile i rows g and g + 8 (gate/up: gate row n and up row n of output column n).
  const int base = e * w.rows;  // E * rows < 2^31 (checked by W4Packed and W4DeviceMatrix::random_nvfp4)
  int row_lo[RT], row_hi[RT];
  int col[RT];  // gate/up: the output column n of tile i; down: the output row of tile row g
#pragma unroll
  for (int i = 0; i < RT; ++i) {
    if (GATE_UP) {
      col[i] = int(blockIdx.x) * kW4MmaGemmOutputs<true> + (warp * RT + i) * 8 + g;
      const int n = min(col[i], n_out - 1);
      row_lo[i] = base + n;
      row_hi[i] = base + n_out + n;
    } else {
      col[i] = int(blockIdx.x) * kW4MmaGemmRows + (warp * RT + i) * 16 + g;
      row_lo[i] = base + min(col[i], n_out - 1);
      row_hi[i] = base + min(col[i] + 8, n_out - 1);
    }
  }
  const int chunks = (w.cols / 8 + 3) / 4, stages = w4_mma_supers(w.cols), words = w.cols / 8;
  __syncthreads();  // arow, slot_weight
  // Stage s's activations into ring slot b: thread tid copies words tid, tid + 128, ... of the (slot, word) grid (16
  // consecutive threads a slot row: 256 contiguous bytes), the rows of the tile's groups only; zero past the row and
  // for the rows of the last group past the tile's slots.
  auto stage_activations = [&](int s, int b) {
#pragma unroll
    for (int i = 0; i < TM * 16 / kThreadsG; ++i) {
      const int v = tid + i * kThreadsG, r = v >> 4, wd = v & 15, k8 = s * 16 + wd;
      if (r < groups * 8) {
        const __half* src = arow[r];
        const bool valid = src != nullptr && k8 < words;
        cp_async16(&xs[b][r * RW + wd + (wd >> 3)], valid ? src + int64_t(k8) * 8 : a_src, valid);
      }
    }
    cp_async_commit();
  };
  auto load_codes = [&](int s, W4MmaStage(&st)[RT]) {
#pragma unroll
    for (int i = 0; i < RT; ++i) st[i] = w4_mma_load<NVFP4>(w, row_lo[i], row_hi[i], 4 * s + t, chunks);
  };
  float acc[RT][NG][4];
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
  // Stage s from ring slot b with the codes cur; first the next stage's copies and code loads are issued (into nxt).
  auto step = [&](int s, int b, const W4MmaStage(&cur)[RT], W4MmaStage(&nxt)[RT]) {
    if (s + 1 < stages) {
      stage_activations(s + 1, b ^ 1);
      load_codes(s + 1, nxt);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of stage s have landed
    const uint4* x = xs[b];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t vl[RT][4], vh[RT][4];
#pragma unroll
      for (int i = 0; i < RT; ++i) w4_mma_decode<NVFP4>(cur[i], q, vl[i], vh[i]);
      const int wd = 4 * t + q;
#pragma unroll
      for (int j = 0; j < NG; ++j) {
        if (j < groups) {
          const uint4 xv = x[(j * 8 + g) * RW + wd + (wd >> 3)];
#pragma unroll
          for (int i = 0; i < RT; ++i) {
            mma_m16n8k16(acc[i][j], vl[i][0], vh[i][0], vl[i][1], vh[i][1], xv.x, xv.y);
            mma_m16n8k16(acc[i][j], vl[i][2], vh[i][2], vl[i][3], vh[i][3], xv.z, xv.w);
          }
        }
      }
    }
    __syncthreads();  // ring slot b is free for stage s + 2
  };
  W4MmaStage c0[RT], c1[RT];
  stage_activations(0, 0);
  load_codes(0, c0);
  for (int s = 0; s < stages; s += 2) {  // unrolled by the ring's two slots, so that no stage is copied
    step(s, 0, c0, c1);
    if (s + 1 < stages) step(s + 1, 1, c1, c0);
  }
  // Epilogue: acc[i][j][0..1] row g, slots 8j + 2t and 8j + 2t + 1; [2..3] row g + 8.
  const float k = NVFP4 ? kNvfp4GemvScale : 1.f;
#pragma unroll
  for (int i = 0; i < RT; ++i) {
    if (GATE_UP) {
      if (col[i] >= n_out) continue;
      const float gg = w.global[row_lo[i]], gu = w.global[row_hi[i]];
#pragma unroll
      for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = j * 8 + 2 * t + c;
          if (r < count) {
            const float gv = apply_global(acc[i][j][c] * k, gg, w.divide);
            const float uv = apply_global(acc[i][j][2 + c] * k, gu, w.divide);
            out[int64_t(row0 + r) * n_out + col[i]] = to_h(siluf_(gv) * uv);
          }
        }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = col[i] + 8 * h;
        if (n >= n_out) continue;
        const float gn = w.global[base + n];
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = j * 8 + 2 * t + c;
            if (r < count)
              out[int64_t(row0 + r) * n_out + n] =
                  to_h(apply_global(acc[i][j][2 * h + c] * k, gn, w.divide) * slot_weight[r]);
          }
      }
    }
  }
#endif
}

FN_W4_GEMM(w4_gemm_mma_kernel)
#undef FN_W4_GEMM

// dst[r, c * cols + j] = src[r * ld + j] for c < copies, 8 halves (16 bytes) a thread and step.
__global__ void repeat_cols_f16_kernel(const __half* __restrict__ src, int64_t ld, int rows, int cols, int copies,
                                       __half* __restrict__ dst) {
  pdl_begin();
  const int v = cols / 8;
  const int64_t n = int64_t(rows) * v;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / v;
    const int j = int(i % v);
    const uint4 x = reinterpret_cast<const uint4*>(src + r * ld)[j];
    for (int c = 0; c < copies; ++c) reinterpret_cast<uint4*>(dst + (r * copies + c) * cols)[j] = x;
  }
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_w4_align(const int32_t* ids, int slots, int experts, int tile_m, int32_t* offsets,
                            int32_t* sorted_slots, int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row,
                            int32_t* num_tiles, int32_t* status, cudaStream_t stream) {
  if (tile_m < 1) return cudaErrorInvalidValue;
  launch(w4_align_kernel, 1, kMoeMaxExperts, 0, stream, ids, slots, experts, tile_m, offsets, sorted_slots, slot_row,
         tile_expert, tile_row, num_tiles, status);
  return cudaGetLastError();
}

cudaError_t launch_repeat_cols_f16(const __half* src, int64_t ld, int rows, int cols, int copies, __half* dst,
                                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (cols % 8 != 0 || ld % 8 != 0 || copies < 1 ||
      (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t n = int64_t(rows) * (cols / 8);
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  launch(repeat_cols_f16_kernel, int(blocks < 1024 ? blocks : 1024), kThreads, 0, stream, src, ld, rows, cols, copies,
         dst);
  return cudaGetLastError();
}

bool w4_gemv_tensor_cores(const W4Mat& w) {
  // Dynamic shared memory within the 48 KB a launch gets without opting in, with 1 KB left for the kernels' static
  // arrays (at most 400 bytes).
  if (w.fp8 || (!w.nvfp4 && w.group % 32 != 0) || w4_mma_smem(w.cols) > 47 * 1024) return false;
  return w4_gemv_tensor_cores_compiled();
}

bool w4_gemv_tensor_cores_compiled() {
  return kernel_ptx_version(reinterpret_cast<const void*>(w4_gemv_mma_gate_up_kernel<true, __half>)) >= 80;
}

cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const __half* u, int64_t ldu, const int32_t* ids, int slots,
                                   int top_k, int experts, int inter, __half* h, int32_t* status, bool tensor_cores,
                                   cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  if (tensor_cores && !w.fp8) {  // (callers ask only where w4_gemv_tensor_cores(w))
    const dim3 grid(slots, (inter + 7) / 8);
    launch((w.nvfp4 ? w4_gemv_mma_gate_up_kernel<true, __half> : w4_gemv_mma_gate_up_kernel<false, __half>), grid,
           kW4MmaWarps * 32, w4_mma_smem(w.cols), stream, w, u, ldu, ids, top_k, experts, inter, h, status);
    return cudaGetLastError();
  }
  const dim3 grid(slots, w4_gemv_row_blocks(inter, w4_code_cols(w), kW4GemvOutsGateUp));
  launch((w.fp8     ? w4_gemv_gate_up_kernel<kFp8>
          : w.nvfp4 ? w4_gemv_gate_up_kernel<kNvfp4>
                    : w4_gemv_gate_up_kernel<kInt4>),
         grid, kW4GemvThreads, 0, stream, w, u, ldu, ids, top_k, experts, inter, w4_gemv_lanes(w4_code_cols(w)), h,
         status);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const float* u, int64_t ldu, const int32_t* ids, int slots,
                                   int top_k, int experts, int inter, __half* h, int32_t* status, cudaStream_t stream) {
  if (slots == 0) return cudaSuccess;
  if (!w4_gemv_tensor_cores(w) || ldu % 4 != 0 || reinterpret_cast<uintptr_t>(u) % 16 != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(slots, (inter + 7) / 8);
  launch((w.nvfp4 ? w4_gemv_mma_gate_up_kernel<true, float> : w4_gemv_mma_gate_up_kernel<false, float>), grid,
         kW4MmaWarps * 32, w4_mma_smem(w.cols), stream, w, u, ldu, ids, top_k, experts, inter, h, status);
  return cudaGetLastError();
}

template <class TO>
cudaError_t launch_w4_gemv_down(const W4Mat& w, const __half* h, const int32_t* ids, const float* weights, int tokens,
                                int top_k, int experts, int hidden, int inter, __half* ys, int32_t* done,
                                const float* shared, TO* out, int64_t ldo, bool tensor_cores, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (tensor_cores && !w.fp8) {
    const dim3 grid(tokens * top_k, (hidden + 16 * kW4MmaDownTiles - 1) / (16 * kW4MmaDownTiles));
    launch((w.nvfp4 ? w4_gemv_mma_down_kernel<true, TO> : w4_gemv_mma_down_kernel<false, TO>), grid, kW4MmaWarps * 32,
           w4_mma_smem(w.cols), stream, w, h, ids, weights, top_k, experts, hidden, inter, ys, done, shared, out, ldo);
    return cudaGetLastError();
  }
  const dim3 grid(tokens * top_k, w4_gemv_row_blocks(hidden, w4_code_cols(w), kW4GemvOutsDown));
  launch((w.fp8     ? w4_gemv_down_kernel<kFp8, TO>
          : w.nvfp4 ? w4_gemv_down_kernel<kNvfp4, TO>
                    : w4_gemv_down_kernel<kInt4, TO>),
         grid, kW4GemvThreads, 0, stream, w, h, ids, weights, top_k, experts, hidden, inter,
         w4_gemv_lanes(w4_code_cols(w)), ys, done, shared, out, ldo);
  return cudaGetLastError();
}
template cudaError_t launch_w4_gemv_down<__half>(const W4Mat&, const __half*, const int32_t*, const float*, int, int,
                                                 int, int, int, __half*, int32_t*, const float*, __half*, int64_t, bool,
                                                 cudaStream_t);
template cudaError_t launch_w4_gemv_down<float>(const W4Mat&, const __half*, const int32_t*, const float*, int, int,
                                                int, int, int, __half*, int32_t*, const float*, float*, int64_t, bool,
                                                cudaStream_t);

bool w4_gemv_grouped(const W4Mat& w) {
  if (!w4_gemv_tensor_cores(w)) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  thread_local std::map<int, int> optin;  // per device: the opt-in shared memory a block may have
  const auto [it, added] = optin.try_emplace(device, 0);
  if (added && cudaDeviceGetAttribute(&it->second, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    it->second = 0;
  return w4_gemv_grouped_smem(w) <= size_t(it->second);
}

size_t w4_gemv_grouped_smem(const W4Mat& w) {
  return w4_group_smem(w.cols) + kW4GroupStaticSmem;
}

namespace {
// The grouped kernels' launch: their dynamic shared memory granted first where it passes the 48 KB default.
template <class... KArgs, class... Args>
cudaError_t launch_grouped(void (*kernel)(KArgs...), dim3 grid, size_t smem, cudaStream_t stream, Args&&... args) {
  if (smem + kW4GroupStaticSmem > 48 * 1024) {
    const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    if (err != cudaSuccess) return err;
  }
  launch(kernel, grid, kW4MmaWarps * 32, smem, stream, std::forward<Args>(args)...);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_w4_gemv_grouped_gate_up(const W4Mat& w, const __half* u, int64_t ldu, const W4Tiles& tiles,
                                           int max_tiles, int top_k, int inter, __half* h, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  const dim3 grid(max_tiles, (inter + 7) / 8);
  return launch_grouped(
      w.nvfp4 ? w4_gemv_mma_grouped_gate_up_kernel<true, __half> : w4_gemv_mma_grouped_gate_up_kernel<false, __half>,
      grid, w4_group_smem(w.cols), stream, w, u, ldu, tiles, top_k, inter, h);
}

cudaError_t launch_w4_gemv_grouped_gate_up(const W4Mat& w, const float* u, int64_t ldu, const W4Tiles& tiles,
                                           int max_tiles, int top_k, int inter, __half* h, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  if (ldu % 4 != 0 || reinterpret_cast<uintptr_t>(u) % 16 != 0) return cudaErrorInvalidValue;
  const dim3 grid(max_tiles, (inter + 7) / 8);
  return launch_grouped(
      w.nvfp4 ? w4_gemv_mma_grouped_gate_up_kernel<true, float> : w4_gemv_mma_grouped_gate_up_kernel<false, float>,
      grid, w4_group_smem(w.cols), stream, w, u, ldu, tiles, top_k, inter, h);
}

cudaError_t launch_w4_gemv_grouped_down(const W4Mat& w, const __half* h, const W4Tiles& tiles, int max_tiles,
                                        const float* weights, int hidden, int inter, __half* ys, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  const dim3 grid(max_tiles, (hidden + 16 * kW4MmaDownTiles - 1) / (16 * kW4MmaDownTiles));
  return launch_grouped(w.nvfp4 ? w4_gemv_mma_grouped_down_kernel<true> : w4_gemv_mma_grouped_down_kernel<false>, grid,
                        w4_group_smem(w.cols), stream, w, h, tiles, weights, hidden, inter, ys);
}

template <bool GU, class... Args>
static void launch_w4_gemm_mma(const W4Mat& w, int n_out, int max_tiles, cudaStream_t stream, Args... args) {
  const int per = kW4MmaGemmOutputs<GU>;
  launch((w.nvfp4 ? w4_gemm_mma_kernel<GU, true> : w4_gemm_mma_kernel<GU, false>),
         dim3(unsigned((n_out + per - 1) / per), unsigned(max_tiles)), unsigned(kW4MmaGemmWarps * 32), 0, stream,
         args...);
}

bool w4_gemm_tensor_cores(const W4Mat& w) {
  return !w.fp8 && (w.nvfp4 || w.group % 32 == 0) && w4_gemv_tensor_cores_compiled();
}

cudaError_t launch_w4_gemm_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* tile_expert,
                                   const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* h,
                                   bool tensor_cores, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  if (tensor_cores && !w.fp8) {  // (callers ask only where w4_gemm_tensor_cores(w))
    launch_w4_gemm_mma<true>(w, inter, max_tiles, stream, w, u, ldu, top_k, inter, offsets, sorted_slots,
                             static_cast<const float*>(nullptr), tile_expert, tile_row, num_tiles, h);
    return cudaGetLastError();
  }
  const dim3 grid((inter + kBN - 1) / kBN, max_tiles);
  launch((w.fp8     ? w4_gemm_kernel<true, kFp8>
          : w.nvfp4 ? w4_gemm_kernel<true, kNvfp4>
                    : w4_gemm_kernel<true, kInt4>),
         grid, kThreads, 0, stream, w, u, ldu, top_k, inter, offsets, sorted_slots, nullptr, tile_expert, tile_row,
         num_tiles, h);
  return cudaGetLastError();
}

cudaError_t launch_w4_gemm_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                                const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                                bool tensor_cores, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  if (tensor_cores && !w.fp8) {  // (callers ask only where w4_gemm_tensor_cores(w))
    launch_w4_gemm_mma<false>(w, hidden, max_tiles, stream, w, h, int64_t(inter), 1, hidden, offsets, sorted_slots,
                              weights, tile_expert, tile_row, num_tiles, ys);
    return cudaGetLastError();
  }
  const dim3 grid((hidden + kBN - 1) / kBN, max_tiles);
  launch((w.fp8     ? w4_gemm_kernel<false, kFp8>
          : w.nvfp4 ? w4_gemm_kernel<false, kNvfp4>
                    : w4_gemm_kernel<false, kInt4>),
         grid, kThreads, 0, stream, w, h, inter, 1, hidden, offsets, sorted_slots, weights, tile_expert, tile_row,
         num_tiles, ys);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
