// QSA sparse attention (gated attention over the indexer-selected tokens): MODEL.md "QSA attention layer";
// reference Qwen4ExpTextAttention. Paged float32 caches, logical positions everywhere; scores and P·V on the tensor
// cores as FP16x2 products (float32-accurate), softmax in float32 (the indexer's kernels are in cuda_ops_kernels.cu).
// Every cache index goes through the block table and is bounds-checked: a bad one sets a bit in the status word and
// is skipped.
#include <mma.h>
#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;  // selected tokens per attention tile (the kernel's WMMA tiles and softmax lanes assume 32)
static_assert(kTile == 32, "qsa_attention_kernel: a softmax lane per tile column, two 16-column WMMA tiles");

__device__ __forceinline__ void flag(int32_t* status, int32_t bit) {
  if (status) atomicOr(status, bit);
}

// Physical token row (page * page_size + offset) of logical position `pos` of sequence `seq`, or -1 (flagged).
__device__ __forceinline__ int64_t phys_token(const QsaPaging& pg, int seq, int pos, int32_t* status) {
  if (pos < 0) {
    flag(status, kQsaBadPosition);
    return -1;
  }
  const int64_t lp = pos / pg.page_size;
  if (lp >= pg.table_ld) {
    flag(status, kQsaBadPage);
    return -1;
  }
  const int32_t page = pg.block_table[int64_t(seq) * pg.table_ld + lp];
  if (page < 0 || page >= pg.num_pages) {
    flag(status, kQsaBadPage);
    return -1;
  }
  return int64_t(page) * pg.page_size + pos % pg.page_size;
}

// FP16x2 halves of a float: x = hi + lo up to about 2^-22 relative (products of the halves on the tensor cores,
// hi·hi + hi·lo + lo·hi, keep float32 accuracy).
__device__ __forceinline__ void split_f16x2(float x, __half* hi, __half* lo) {
  const __half h = __float2half_rn(x);
  *hi = h;
  *lo = __float2half_rn(x - __half2float(h));
}

namespace wmma = nvcuda::wmma;

// c += (a_hi + a_lo)(b_hi + b_lo) less the lo·lo term: one 16x16x16 step of an FP16x2 product on the tensor cores
// (A row-major, B in layout BL; pointers 32-byte aligned, leading dimensions multiples of 8 halves).
template <class BL>
__device__ __forceinline__ void mma_f16x2(wmma::fragment<wmma::accumulator, 16, 16, 16, float>& c, const __half* a_hi,
                                          const __half* a_lo, int lda, const __half* b_hi, const __half* b_lo,
                                          int ldb) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> ah, al;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, BL> bh, bl;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(al, a_lo, lda);
  wmma::load_matrix_sync(bh, b_hi, ldb);
  wmma::load_matrix_sync(bl, b_lo, ldb);
  wmma::mma_sync(c, ah, bh, c);
  wmma::mma_sync(c, ah, bl, c);
  wmma::mma_sync(c, al, bh, c);
}

// Shared memory of qsa_attention_kernel for head dim padded to D16 (a multiple of 16); every region a multiple of
// 32 bytes (WMMA's pointer alignment).
struct AttnSmem {
  int D16, ldh, ldp;
  __half *Qh, *Ql, *Kh, *Kl, *Ph, *Pl;
  float *Sp, *S, *O, *m, *l, *corr;
  int64_t* rows;
  static constexpr int kRows = 16;  // query heads of a KV group, padded to the WMMA tile
  __device__ AttnSmem(unsigned char* base, int dim) {
    D16 = (dim + 15) & ~15;
    ldh = D16 + 8;
    ldp = kTile + 8;
    Qh = reinterpret_cast<__half*>(base);
    Ql = Qh + kRows * ldh;
    Kh = Ql + kRows * ldh;
    Kl = Kh + kTile * ldh;
    Ph = Kl + kTile * ldh;
    Pl = Ph + kRows * ldp;
    Sp = reinterpret_cast<float*>(Pl + kRows * ldp);
    S = Sp + sp_floats(D16);
    O = S + kRows * kTile;
    m = O + kRows * D16;
    l = m + kRows;
    corr = l + kRows;
    rows = reinterpret_cast<int64_t*>(corr + 2 * kRows);  // 8-byte aligned (corr + 32 floats)
  }
  __host__ __device__ static int sp_floats(int D16) { return D16 * kRows > 8 * 256 ? D16 * kRows : 8 * 256; }
  static size_t bytes(int dim) {
    const int D16 = (dim + 15) & ~15, ldh = D16 + 8, ldp = kTile + 8;
    return sizeof(__half) * (size_t(2) * kRows * ldh + size_t(2) * kTile * ldh + size_t(2) * kRows * ldp) +
           sizeof(float) * (size_t(sp_floats(D16)) + kRows * kTile + size_t(kRows) * D16 + 4 * kRows) +
           sizeof(int64_t) * kTile;
  }
};

// One tile of kTile cache rows (rows[i] < 0: zeros) of KV head g as FP16x2 halves into hi/lo [kTile][ldh], the
// columns from dim to D16 zero.
__device__ __forceinline__ void load_tile_f16x2(const float* __restrict__ cache, int64_t kvw, int g, int dim,
                                                const AttnSmem& sm, __half* hi, __half* lo, bool vec4) {
  if (vec4) {
    // kBatch float4 loads in flight per thread before any is converted (a tile is at most 8 per thread).
    constexpr int kBatch = 4;
    const int q4 = sm.D16 / 4, n4 = kTile * q4;
    for (int e0 = threadIdx.x; e0 < n4; e0 += kBatch * kThreads) {
      float4 x[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int e = e0 + u * kThreads, i = e / q4, d = 4 * (e % q4);
        x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (e < n4) {
          const int64_t row = sm.rows[i];
          if (row >= 0 && d < dim) x[u] = *reinterpret_cast<const float4*>(cache + row * kvw + int64_t(g) * dim + d);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int e = e0 + u * kThreads, i = e / q4, d = 4 * (e % q4);
        if (e >= n4) continue;
        const float xs[4] = {x[u].x, x[u].y, x[u].z, x[u].w};
        __half h[4], l[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) split_f16x2(xs[c], &h[c], &l[c]);
        // 8-byte stores (d is a multiple of 4, rows a multiple of 8 halves): one per half of the pair.
        *reinterpret_cast<uint2*>(hi + i * sm.ldh + d) =
            make_uint2(h2_bits(__halves2half2(h[0], h[1])), h2_bits(__halves2half2(h[2], h[3])));
        *reinterpret_cast<uint2*>(lo + i * sm.ldh + d) =
            make_uint2(h2_bits(__halves2half2(l[0], l[1])), h2_bits(__halves2half2(l[2], l[3])));
      }
    }
  } else {
    for (int e = threadIdx.x; e < kTile * sm.D16; e += kThreads) {
      const int i = e / sm.D16, d = e % sm.D16;
      const int64_t row = sm.rows[i];
      const float x = (row >= 0 && d < dim) ? cache[row * kvw + int64_t(g) * dim + d] : 0.f;
      split_f16x2(x, hi + i * sm.ldh + d, lo + i * sm.ldh + d);
    }
  }
}

// Sparse attention over the selected tokens on the tensor cores (WMMA m16n16k16, SM70 and later). Block = (query
// token, KV head g, split of the selected list); the group's G = heads/kv_heads query heads (padded to 16 rows) share
// each K/V tile of kTile selected rows. Scores S = Q K^T and the tile's P V are products of FP16x2 halves
// (hi·hi + hi·lo + lo·hi, float32 accumulation), about float32-accurate; online softmax in float32 over the tiles.
// splits == 1: writes o * sigmoid(gate); otherwise (m, l, acc[dim]) partials for qsa_combine_kernel.
__global__ void __launch_bounds__(kThreads, 2)
    qsa_attention_kernel(const float* __restrict__ q, int64_t ldq, const int32_t* __restrict__ tok_seq,
                         const int32_t* __restrict__ tok_pos, const int32_t* __restrict__ selected, int64_t ld_sel,
                         const int32_t* __restrict__ counts, QsaPaging pg, const float* __restrict__ k_cache,
                         const float* __restrict__ v_cache, int heads, int kv_heads, int dim, int splits,
                         int split_len, const float* __restrict__ gate, int64_t ld_gate, int64_t gate_hs,
                         float* __restrict__ partial, float* __restrict__ out, int64_t ldo, int32_t* status,
                         bool vec4) {
  pdl_begin();
  extern __shared__ __align__(32) unsigned char smem_raw[];
  const AttnSmem sm(smem_raw, dim);
  constexpr int R = AttnSmem::kRows;
  const int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int G = heads / kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int seq = tok_seq[t], p = tok_pos[t];
  const int cnt = counts[t];
  const int begin = split * split_len, end = min(cnt, begin + split_len);
  if (split == splits - 1 && g == 0 && threadIdx.x == 0 && cnt > splits * split_len) flag(status, kQsaCountOverflow);
  const float scale = rsqrtf(float(dim));
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t kvw = int64_t(kv_heads) * dim;
  const int ksteps = sm.D16 / 16;
  for (int e = threadIdx.x; e < R * sm.D16; e += kThreads) {
    const int h = e / sm.D16, d = e % sm.D16;
    const float x = (h < G && d < dim) ? q[int64_t(t) * ldq + int64_t(g * G + h) * dim + d] * scale : 0.f;
    split_f16x2(x, sm.Qh + h * sm.ldh + d, sm.Ql + h * sm.ldh + d);
    sm.O[e] = 0.f;
  }
  for (int e = threadIdx.x; e < R * sm.ldp; e += kThreads) sm.Ph[e] = sm.Pl[e] = __float2half_rn(0.f);
  if (threadIdx.x < R) {
    sm.m[threadIdx.x] = neg_inf;
    sm.l[threadIdx.x] = 0.f;
    sm.corr[threadIdx.x] = 1.f;
  }
  for (int tb = begin; tb < end; tb += kTile) {
    const int n = min(kTile, end - tb);
    if (threadIdx.x < kTile) {
      int64_t row = -1;
      if (int(threadIdx.x) < n) {
        const int pos = selected[int64_t(t) * ld_sel + tb + threadIdx.x];
        if (pos > p)
          flag(status, kQsaBadPosition);  // a selected key after the query: never follow it
        else
          row = phys_token(pg, seq, pos, status);
      }
      sm.rows[threadIdx.x] = row;
    }
    __syncthreads();
    load_tile_f16x2(k_cache, kvw, g, dim, sm, sm.Kh, sm.Kl, vec4);
    __syncthreads();
    {  // score partials: warp = (16-column block nt, quarter kg of the head dim)
      const int nt = warp & 1, kg = warp >> 1;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.f);
      for (int ks = kg; ks < ksteps; ks += 4)  // K^T: K's rows read as B columns
        mma_f16x2<wmma::col_major>(c, sm.Qh + ks * 16, sm.Ql + ks * 16, sm.ldh, sm.Kh + nt * 16 * sm.ldh + ks * 16,
                                   sm.Kl + nt * 16 * sm.ldh + ks * 16, sm.ldh);
      wmma::store_matrix_sync(sm.Sp + warp * 256, c, 16, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < R * kTile; e += kThreads) {
      const int h = e / kTile, c = e % kTile, nt = c / 16, cc = c % 16;
      float v = 0.f;
#pragma unroll
      for (int kg = 0; kg < 4; ++kg) v += sm.Sp[((kg << 1) | nt) * 256 + h * 16 + cc];
      sm.S[e] = (c < n && sm.rows[c] >= 0) ? v : neg_inf;
    }
    __syncthreads();
    load_tile_f16x2(v_cache, kvw, g, dim, sm, sm.Kh, sm.Kl, vec4);  // V over K (K is no longer read)
    for (int h = warp; h < G; h += kWarps) {  // online softmax, a warp per query head, a lane per tile column
      const float sv = sm.S[h * kTile + lane];
      const float m_old = sm.m[h];
      const float m_new = fmaxf(m_old, warp_max(sv));
      const float e = m_new == neg_inf ? 0.f : expf(sv - m_new);
      const float sum = warp_sum(e);
      split_f16x2(e, sm.Ph + h * sm.ldp + lane, sm.Pl + h * sm.ldp + lane);
      if (lane == 0) {
        const float corr = m_old == neg_inf ? (m_new == neg_inf ? 1.f : 0.f) : expf(m_old - m_new);
        sm.corr[h] = corr;
        sm.l[h] = sm.l[h] * corr + sum;
        sm.m[h] = m_new;
      }
    }
    __syncthreads();
    for (int nt = warp; nt < ksteps; nt += kWarps) {  // O = O corr + P V, a warp per 16 output columns
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.f);
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks)
        mma_f16x2<wmma::row_major>(c, sm.Ph + ks * 16, sm.Pl + ks * 16, sm.ldp, sm.Kh + ks * 16 * sm.ldh + nt * 16,
                                   sm.Kl + ks * 16 * sm.ldh + nt * 16, sm.ldh);
      wmma::store_matrix_sync(sm.Sp + nt * 16, c, sm.D16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < R * 16; e += 32) {
        const int h = e / 16, d = nt * 16 + e % 16;
        sm.O[h * sm.D16 + d] = sm.O[h * sm.D16 + d] * sm.corr[h] + sm.Sp[h * sm.D16 + d];
      }
    }
    __syncthreads();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * dim; e += kThreads) {
    const int h = e / dim, dd = e % dim;
    const int hq = g * G + h;
    const float acc = sm.O[h * sm.D16 + dd];
    if (splits == 1) {
      float o = sm.l[h] > 0.f ? acc / sm.l[h] : 0.f;
      if (gate) o *= sigmoidf_(gate[int64_t(t) * ld_gate + int64_t(hq) * gate_hs + dd]);
      out[int64_t(t) * ldo + int64_t(hq) * dim + dd] = o;
    } else {
      float* pp = partial + ((int64_t(t) * heads + hq) * splits + split) * (dim + 2);
      if (dd == 0) {
        pp[0] = sm.m[h];
        pp[1] = sm.l[h];
      }
      pp[2 + dd] = acc;
    }
  }
}

// Merges the split partials of each (token, head) and applies the output gate.
template <class T>
__global__ void qsa_combine_kernel(const float* __restrict__ partial, int heads, int dim, int splits,
                                   const T* __restrict__ gate, int64_t ld_gate, int64_t gate_hs, T* __restrict__ out,
                                   int64_t ldo) {
  pdl_begin();
  const int t = blockIdx.x / heads, hq = blockIdx.x % heads;
  const float* pp = partial + (int64_t(t) * heads + hq) * splits * (dim + 2);
  const float neg_inf = -__int_as_float(0x7f800000);
  float M = neg_inf;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, pp[s * (dim + 2)]);
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float L = 0.f, o = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float m = pp[s * (dim + 2)];
      if (m == neg_inf) continue;
      const float w = expf(m - M);
      L += w * pp[s * (dim + 2) + 1];
      o += w * pp[s * (dim + 2) + 2 + d];
    }
    o = L > 0.f ? o / L : 0.f;
    if (gate) o *= sigmoidf_(to_f(gate[int64_t(t) * ld_gate + int64_t(hq) * gate_hs + d]));
    out[int64_t(t) * ldo + int64_t(hq) * dim + d] = from_f<T>(o);
  }
}

// The float32 activations of the ops interface (compiled by NVRTC too, for the SM70 check).
template __global__ void qsa_combine_kernel<float>(const float*, int, int, int, const float*, int64_t, int64_t, float*,
                                                   int64_t);

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const size_t smem = AttnSmem::bytes(dim);
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(qsa_attention_kernel), smem);
  if (err != cudaSuccess) return err;
  const bool vec4 = dim % 4 == 0 && reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  dim3 grid(tokens, kv_heads, splits);
  launch(qsa_attention_kernel, grid, kThreads, smem, stream, q, ldq, tok_seq, tok_pos, selected, ld_sel, counts, pg,
         k_cache, v_cache, heads, kv_heads, dim, splits, split_len, gate, ld_gate, gate_head_stride, partial, out, ldo,
         status, vec4);
  if (splits > 1)
    launch(qsa_combine_kernel<float>, tokens * heads, kThreads, 0, stream, partial, heads, dim, splits, gate, ld_gate,
           gate_head_stride, out, ldo);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
