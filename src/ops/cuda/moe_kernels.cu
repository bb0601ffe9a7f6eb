// MoE kernels (MODEL.md "MoE block"; reference Qwen4ExpTextTopKRouter / Qwen4ExpTextExperts): FP32 router softmax
// and top-k, token slots grouped by expert, and grouped FP16 expert GEMMs on tensor cores through WMMA
// (m16n16k16, FP32 accumulation: SM70's HMMA). Unquantized FP16 experts in the checkpoint layout
// gate_up_proj [E, 2I, H] (gate rows then up rows) and down_proj [E, H, I].
#include <mma.h>

#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe_kernels.h"

namespace flashnext::cuda::detail {
namespace {

using namespace nvcuda;

// One warp per token: p = softmax(logits) in FP32, the top_k by (higher p, then lower expert index), optionally
// renormalised to sum 1. kPer logits per lane (experts <= 32 kPer; launch_moe_router_topk picks the smallest).
template <int kPer>
__global__ void moe_router_topk_kernel(const float* __restrict__ logits, int64_t ld, int tokens, int experts, int top_k,
                                       bool norm, int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= tokens) return;
  const float* row = logits + int64_t(warp) * ld;
  float v[kPer];
  float mx = -__int_as_float(0x7f800000);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? row[e] : -__int_as_float(0x7f800000);
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? expf(v[i] - mx) : -1.f;  // probabilities are >= 0; -1 marks "not an expert"
    if (e < experts) sum += v[i];
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;
  float picked_sum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int j = 0; j < top_k; ++j) {
    float best = -2.f;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (v[i] > best) {  // strict: the lowest index wins among this lane's equals
        best = v[i];
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) {
        best = ob;
        bi = oi;
      }
    }
    const float p = best * inv;
    if (lane == j) {
      my_w = p;
      my_id = bi;
    }
    picked_sum += p;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == bi) v[i] = -3.f;
  }
  if (lane < top_k) {
    ids[int64_t(warp) * top_k + lane] = my_id;
    weights[int64_t(warp) * top_k + lane] = norm ? my_w / picked_sum : my_w;
  }
}

// One block: counting sort of the token slots (slot = token*top_k + j) by expert, and the GEMM tile list
// (expert, first sorted row) with kMoeTileM rows per tile. Out-of-range expert ids are flagged and dropped.
__global__ void moe_align_kernel(const int32_t* __restrict__ ids, int slots, int experts, int32_t* offsets,
                                 int32_t* sorted_slots, int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row,
                                 int32_t* num_tiles, int32_t* status) {
  pdl_begin();
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
    int run = 0, tiles = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      cursor[e] = run;
      tile_start[e] = tiles;
      run += count[e];
      tiles += (count[e] + kMoeTileM - 1) / kMoeTileM;
    }
    offsets[experts] = run;
    *num_tiles = tiles;
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
    const int n = (count[e] + kMoeTileM - 1) / kMoeTileM;
    for (int i = 0; i < n; ++i) {
      tile_expert[tile_start[e] + i] = e;
      tile_row[tile_start[e] + i] = offsets[e] + i * kMoeTileM;
    }
  }
}

constexpr int kBN = 64, kBK = 64, kLd = kBK + 8, kGemmThreads = 128;

// Register staging of one K step's tiles (A: kMoeTileM rows, B: NB x kBN rows, kBK columns each): global loads of
// the next step are issued before the current step's tensor-core work (SM70 has no cp.async).
constexpr int kVecPerRow = kBK / 8;
template <int NB>
struct TileRegs {
  static constexpr int kA = (kMoeTileM * kVecPerRow + kGemmThreads - 1) / kGemmThreads;
  static constexpr int kB = (NB * kBN * kVecPerRow + kGemmThreads - 1) / kGemmThreads;
  uint4 a[kA], b[kB];

  __device__ __forceinline__ void load(const __half* const* arow, const __half* const (*brow)[kBN], int k0, int K) {
#pragma unroll
    for (int i = 0; i < kA; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, r = v / kVecPerRow, c = (v % kVecPerRow) * 8;
      a[i] = make_uint4(0, 0, 0, 0);
      if (r < kMoeTileM && arow[r] && k0 + c < K) a[i] = *reinterpret_cast<const uint4*>(arow[r] + k0 + c);
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, r = v / kVecPerRow, c = (v % kVecPerRow) * 8;
      const int bb = r / kBN, rr = r % kBN;
      b[i] = make_uint4(0, 0, 0, 0);
      if (bb < NB && brow[bb][rr] && k0 + c < K) b[i] = *reinterpret_cast<const uint4*>(brow[bb][rr] + k0 + c);
    }
  }
  __device__ __forceinline__ void store(__half* As, __half (*Bs)[kBN * kLd]) const {
#pragma unroll
    for (int i = 0; i < kA; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, r = v / kVecPerRow, c = (v % kVecPerRow) * 8;
      if (r < kMoeTileM) *reinterpret_cast<uint4*>(As + r * kLd + c) = a[i];
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, r = v / kVecPerRow, c = (v % kVecPerRow) * 8;
      const int bb = r / kBN, rr = r % kBN;
      if (bb < NB) *reinterpret_cast<uint4*>(Bs[bb] + rr * kLd + c) = b[i];
    }
  }
};

// Grouped expert GEMM on one (tile of kMoeTileM sorted slots of one expert) x (kBN output columns).
// GATE_UP: h[row, n] = silu(x · gate_n) * (x · up_n) for n in [n0, n0+kBN), x = u[token of the slot], K = H.
// DOWN:    ys[row, n] = weight(slot) * (h[row] · down_n), K = I.
// Weight row n of expert e is w0 + (e * expert_rows + n) * K (gate / down) and w1 + (e * expert_rows + n) * K (up):
// the fused gate_up_proj [E, 2I, H] is w0 = gate_up, w1 = gate_up + I*H, expert_rows = 2I; separate stacked
// gate_proj / up_proj [E, I, H] are w0 = gate, w1 = up, expert_rows = I; down_proj [E, H, I] has expert_rows = H.
template <bool GATE_UP>
__device__ __forceinline__ void moe_gemm_body(
    const __half* __restrict__ a_src, int64_t lda, int top_k, const __half* __restrict__ w0,
    const __half* __restrict__ w1, int64_t expert_rows, int hidden, int inter, const int32_t* __restrict__ offsets,
    const int32_t* __restrict__ sorted_slots, const float* __restrict__ weights,
    const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,
    const int32_t* __restrict__ num_tiles, __half* __restrict__ out) {
  constexpr int NB = GATE_UP ? 2 : 1;
  __shared__ __align__(32) __half As[kMoeTileM * kLd];
  __shared__ __align__(32) __half Bs[NB][kBN * kLd];
  __shared__ __align__(32) float Cs[NB][kMoeTileM * kBN];
  __shared__ const __half* arow[kMoeTileM];
  __shared__ const __half* brow[NB][kBN];
  const int tile = blockIdx.y;
  if (tile >= *num_tiles) return;
  const int e = tile_expert[tile], row0 = tile_row[tile], row_end = offsets[e + 1];
  const int K = GATE_UP ? hidden : inter, N = GATE_UP ? inter : hidden;
  const int n0 = blockIdx.x * kBN;
  if (threadIdx.x < kMoeTileM) {
    const int r = row0 + threadIdx.x;
    const __half* p = nullptr;
    if (r < row_end) p = GATE_UP ? a_src + int64_t(sorted_slots[r] / top_k) * lda : a_src + int64_t(r) * lda;
    arow[threadIdx.x] = p;
  }
  for (int i = threadIdx.x; i < NB * kBN; i += kGemmThreads) {
    const int b = i / kBN, n = n0 + i % kBN;
    const __half* p = nullptr;
    if (n < N) p = (b == 0 ? w0 : w1) + (int64_t(e) * expert_rows + n) * K;
    brow[b][i % kBN] = p;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) wmma::fill_fragment(acc[b], 0.f);
  TileRegs<NB> regs;
  regs.load(arow, brow, 0, K);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    regs.store(As, Bs);
    __syncthreads();
    if (k0 + kBK < K) regs.load(arow, brow, k0 + kBK, K);  // in flight during the MMAs below
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af;
      wmma::load_matrix_sync(af, As + kk, kLd);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bf;
        wmma::load_matrix_sync(bf, Bs[b] + warp * 16 * kLd + kk, kLd);
        wmma::mma_sync(acc[b], af, bf, acc[b]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) wmma::store_matrix_sync(Cs[b] + warp * 16, acc[b], kBN, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kMoeTileM * kBN; i += kGemmThreads) {
    const int r = i / kBN, c = i % kBN, row = row0 + r, n = n0 + c;
    if (row >= row_end || n >= N) continue;
    if (GATE_UP) {
      out[int64_t(row) * inter + n] = to_h(siluf_(Cs[0][i]) * Cs[NB - 1][i]);
    } else {
      out[int64_t(row) * hidden + n] = to_h(Cs[0][i] * weights[sorted_slots[row]]);
    }
  }
}

__global__ void __launch_bounds__(kGemmThreads)
    moe_gate_up_kernel(const __half* __restrict__ u, int64_t ldu, int top_k, const __half* __restrict__ w_gate,
                       const __half* __restrict__ w_up, int64_t expert_rows, int hidden, int inter,
                       const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                       const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,
                       const int32_t* __restrict__ num_tiles, __half* __restrict__ h) {
  pdl_begin();
  moe_gemm_body<true>(u, ldu, top_k, w_gate, w_up, expert_rows, hidden, inter, offsets, sorted_slots, nullptr,
                      tile_expert, tile_row, num_tiles, h);
}

__global__ void __launch_bounds__(kGemmThreads)
    moe_down_kernel(const __half* __restrict__ h, const __half* __restrict__ w, int hidden, int inter,
                    const int32_t* __restrict__ offsets, const int32_t* __restrict__ sorted_slots,
                    const float* __restrict__ weights, const int32_t* __restrict__ tile_expert,
                    const int32_t* __restrict__ tile_row, const int32_t* __restrict__ num_tiles,
                    __half* __restrict__ ys) {
  pdl_begin();
  moe_gemm_body<false>(h, inter, 1, w, w, hidden, hidden, inter, offsets, sorted_slots, weights, tile_expert, tile_row,
                       num_tiles, ys);
}

// out[t, c] = sum_j ys[row of slot t*k+j, c] (slots in order j) + shared[t, c] (the gated shared expert's term, if
// given).
// TO: the output type (FP16, or FP32 for the ops interface).
template <class TO>
__global__ void moe_combine_kernel(const __half* __restrict__ ys, const int32_t* __restrict__ slot_row, int tokens,
                                   int top_k, int hidden, const float* __restrict__ shared, TO* __restrict__ out,
                                   int64_t ldo) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(tokens) * hidden) return;
  const int64_t t = idx / hidden, c = idx % hidden;
  float acc = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const int r = slot_row[t * top_k + j];
    if (r >= 0) acc += to_f(ys[int64_t(r) * hidden + c]);
  }
  if (shared) acc += shared[t * hidden + c];
  out[t * ldo + c] = from_f<TO>(acc);
}

__global__ void silu_mul_kernel(const __half* __restrict__ gate, const __half* __restrict__ up, int64_t ld_in,
                                __half* __restrict__ out, int64_t ld_out, int tokens, int width) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(tokens) * width) return;
  const int64_t t = idx / width, c = idx % width;
  out[t * ld_out + c] = to_h(siluf_(to_f(gate[t * ld_in + c])) * to_f(up[t * ld_in + c]));
}

// Both output types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_ROUTER_TOPK(P) \
  template __global__ void moe_router_topk_kernel<P>(const float*, int64_t, int, int, int, bool, int32_t*, float*);
FN_ROUTER_TOPK(1)
FN_ROUTER_TOPK(2) FN_ROUTER_TOPK(4) FN_ROUTER_TOPK(8) FN_ROUTER_TOPK(16) FN_ROUTER_TOPK(32)
#undef FN_ROUTER_TOPK
    static_assert(kMoeMaxExperts == 32 * 32, "moe_router_topk_kernel: at most 32 logits per lane");
template __global__ void moe_combine_kernel<__half>(const __half*, const int32_t*, int, int, int, const float*, __half*,
                                                    int64_t);
template __global__ void moe_combine_kernel<float>(const __half*, const int32_t*, int, int, int, const float*, float*,
                                                   int64_t);

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_moe_router_topk(const float* logits, int64_t ld, int tokens, int experts, int top_k, bool norm,
                                   int32_t* ids, float* weights, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (experts < 1 || experts > kMoeMaxExperts) return cudaErrorInvalidValue;
  // Logits per lane: the smallest power of two that holds the experts (16 for the released 512), so that the top-k
  // rounds compare no padding; the picks and sums are the same for any of them.
  const int per = (experts + 31) / 32;
  auto kernel = per <= 1    ? moe_router_topk_kernel<1>
                : per <= 2  ? moe_router_topk_kernel<2>
                : per <= 4  ? moe_router_topk_kernel<4>
                : per <= 8  ? moe_router_topk_kernel<8>
                : per <= 16 ? moe_router_topk_kernel<16>
                            : moe_router_topk_kernel<32>;
  launch(kernel, (tokens + 7) / 8, 256, 0, stream, logits, ld, tokens, experts, top_k, norm, ids, weights);
  return cudaGetLastError();
}

cudaError_t launch_moe_align(const int32_t* ids, int slots, int experts, int32_t* offsets, int32_t* sorted_slots,
                             int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row, int32_t* num_tiles,
                             int32_t* status, cudaStream_t stream) {
  launch(moe_align_kernel, 1, 1024, 0, stream, ids, slots, experts, offsets, sorted_slots, slot_row, tile_expert,
         tile_row, num_tiles, status);
  return cudaGetLastError();
}

cudaError_t launch_moe_gate_up_split(const __half* u, int64_t ldu, int top_k, const __half* gate, const __half* up,
                                     int64_t expert_rows, int hidden, int inter, const int32_t* offsets,
                                     const int32_t* sorted_slots, const int32_t* tile_expert, const int32_t* tile_row,
                                     const int32_t* num_tiles, int max_tiles, __half* h, cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  dim3 grid((inter + kBN - 1) / kBN, max_tiles);
  launch(moe_gate_up_kernel, grid, kGemmThreads, 0, stream, u, ldu, top_k, gate, up, expert_rows, hidden, inter,
         offsets, sorted_slots, tile_expert, tile_row, num_tiles, h);
  return cudaGetLastError();
}

cudaError_t launch_moe_down(const __half* h, const __half* down, int hidden, int inter, const int32_t* offsets,
                            const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                            const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                            cudaStream_t stream) {
  if (max_tiles == 0) return cudaSuccess;
  dim3 grid((hidden + kBN - 1) / kBN, max_tiles);
  launch(moe_down_kernel, grid, kGemmThreads, 0, stream, h, down, hidden, inter, offsets, sorted_slots, weights,
         tile_expert, tile_row, num_tiles, ys);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(const __half* ys, const int32_t* slot_row, int tokens, int top_k, int hidden,
                               const float* shared, __half* out, int64_t ldo, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * hidden;
  if (n == 0) return cudaSuccess;
  launch(moe_combine_kernel<__half>, unsigned((n + 255) / 256), 256, 0, stream, ys, slot_row, tokens, top_k, hidden,
         shared, out, ldo);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(const __half* ys, const int32_t* slot_row, int tokens, int top_k, int hidden,
                               const float* shared, float* out, int64_t ldo, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * hidden;
  if (n == 0) return cudaSuccess;
  launch(moe_combine_kernel<float>, unsigned((n + 255) / 256), 256, 0, stream, ys, slot_row, tokens, top_k, hidden,
         shared, out, ldo);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(const __half* gate, const __half* up, int64_t ld_in, __half* out, int64_t ld_out,
                            int tokens, int width, cudaStream_t stream) {
  const int64_t n = int64_t(tokens) * width;
  if (n == 0) return cudaSuccess;
  launch(silu_mul_kernel, unsigned((n + 255) / 256), 256, 0, stream, gate, up, ld_in, out, ld_out, tokens, width);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
