// QSA sparse attention (gated attention over the indexer-selected tokens): MODEL.md "QSA attention layer";
// reference Qwen4ExpTextAttention. Paged float32 caches, logical positions everywhere; scores and P·V on the tensor
// cores as FP16x2 products (float32-accurate), softmax in float32 (the indexer's kernels are in cuda_ops_kernels.cu).
// Every cache index goes through the block table and is bounds-checked: a bad one sets a bit in the status word and
// is skipped. Two kernels: qsa_attention_kernel, a block per (query, KV head, split of the selection) on WMMA (SM70+;
// decode), and qsa_union_attention_kernel, a block per (group of consecutive queries, KV head) over the union of
// their selections on mma.sync (SM80+; prefill chunks).
#include <mma.h>
#ifndef __CUDACC_RTC__
#include <algorithm>

#include "ops/cuda/kernel_attributes.h"
#endif

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kQsaAttentionTile;  // selected tokens per attention tile (the WMMA tiles and softmax lanes
                                          // assume 32)
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

// A float4 as FP16x2 halves: 8-byte stores of its 4 hi halves at hi and 4 lo halves at lo (8-byte aligned).
__device__ __forceinline__ void store_f16x2_4(float4 x, __half* hi, __half* lo) {
  const float xs[4] = {x.x, x.y, x.z, x.w};
  __half h[4], l[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) split_f16x2(xs[c], &h[c], &l[c]);
  *reinterpret_cast<uint2*>(hi) = make_uint2(h2_bits(__halves2half2(h[0], h[1])), h2_bits(__halves2half2(h[2], h[3])));
  *reinterpret_cast<uint2*>(lo) = make_uint2(h2_bits(__halves2half2(l[0], l[1])), h2_bits(__halves2half2(l[2], l[3])));
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
        // 8-byte stores (d is a multiple of 4, rows a multiple of 8 halves).
        if (e < n4) store_f16x2_4(x[u], hi + i * sm.ldh + d, lo + i * sm.ldh + d);
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

// Merges the split partials of each (token, head) and applies the output gate: M = max_s m_s, w_s = e^{m_s - M}
// (splits with m_s = -inf, which saw no position, skipped), o[d] = sum_s w_s acc_s[d] / sum_s w_s l_s. Block (token
// t, head hq; kCombineCols columns d): thread (group g, column c) issues the loads of its splits g, g + G, ...
// (kCombineAhead at a time, the first ones before the weights are known) and sums them in split order; the G groups'
// sums are then added in group order. The split weights and L are made by every block (one load of each m_s and l_s;
// L a block-wide sum). Every dependent round is one load deep, where a block per (t, hq) that walked the splits was
// about ten. splits <= kQsaMaxSplits.
constexpr int kCombineCols = 32, kCombineGroups = kThreads / kCombineCols, kCombineAhead = 12;
template <class T>
__global__ void __launch_bounds__(kThreads)
    qsa_combine_kernel(const float* __restrict__ partial, int heads, int dim, int splits, const T* __restrict__ gate,
                       int64_t ld_gate, int64_t gate_hs, T* __restrict__ out, int64_t ldo) {
  pdl_begin();
  __shared__ float w[kQsaMaxSplits];
  __shared__ float scratch[32];
  __shared__ float sums[kCombineGroups][kCombineCols];
  const int t = blockIdx.x / heads, hq = blockIdx.x % heads;
  const int g = threadIdx.x / kCombineCols, c = threadIdx.x % kCombineCols;
  const int d = blockIdx.y * kCombineCols + c;
  const int64_t ld = dim + 2;
  const float* pp = partial + (int64_t(t) * heads + hq) * splits * ld;
  const float neg_inf = -__int_as_float(0x7f800000);
  float a[kCombineAhead];
#pragma unroll
  for (int u = 0; u < kCombineAhead; ++u) {
    const int sp = g + u * kCombineGroups;
    a[u] = sp < splits && d < dim ? pp[sp * ld + 2 + d] : 0.f;
  }
  static_assert(kQsaMaxSplits <= 2 * kThreads, "qsa_combine_kernel: two splits' (m, l) a thread");
  float m[2], l[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int sp = int(threadIdx.x) + k * kThreads;
    m[k] = sp < splits ? pp[sp * ld] : neg_inf;
    l[k] = sp < splits ? pp[sp * ld + 1] : 0.f;
  }
  const float M = block_max(fmaxf(m[0], m[1]), scratch);
  float wl = 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int sp = int(threadIdx.x) + k * kThreads;
    const float ws = m[k] == neg_inf ? 0.f : expf(m[k] - M);
    if (sp < splits) w[sp] = ws;
    wl += ws * l[k];
  }
  const float L = block_sum(wl, scratch);  // its barriers also publish w
  float o = 0.f;
#pragma unroll
  for (int u = 0; u < kCombineAhead; ++u) {
    const int sp = g + u * kCombineGroups;
    if (sp < splits && w[sp] != 0.f) o += w[sp] * a[u];  // a split that saw no position (w = 0) adds nothing
  }
  for (int s0 = kCombineAhead * kCombineGroups; s0 < splits; s0 += kCombineAhead * kCombineGroups) {
#pragma unroll
    for (int u = 0; u < kCombineAhead; ++u) {
      const int sp = s0 + g + u * kCombineGroups;
      a[u] = sp < splits && d < dim ? pp[sp * ld + 2 + d] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kCombineAhead; ++u) {
      const int sp = s0 + g + u * kCombineGroups;
      if (sp < splits && w[sp] != 0.f) o += w[sp] * a[u];
    }
  }
  sums[g][c] = o;
  __syncthreads();
  if (g != 0 || d >= dim) return;
  o = 0.f;
#pragma unroll
  for (int k = 0; k < kCombineGroups; ++k) o += sums[k][c];
  o = L > 0.f ? o / L : 0.f;
  if (gate) o *= sigmoidf_(to_f(gate[int64_t(t) * ld_gate + int64_t(hq) * gate_hs + d]));
  out[int64_t(t) * ldo + int64_t(hq) * dim + d] = from_f<T>(o);
}

// The float32 activations of the ops interface (compiled by NVRTC too, for the SM70 check).
template __global__ void qsa_combine_kernel<float>(const float*, int, int, int, const float*, int64_t, int64_t, float*,
                                                   int64_t);

// ---------------------------------------------------------------- tile-union attention (prefill, SM80+)
//
// Neighbouring queries of a sequence select mostly the same key blocks (the indexer scores the same pooled keys with
// similar queries), so a block serves a group of up to 8 consecutive queries of one sequence and one KV head g: it
// reads the union of their selections once, in logical order, and computes every (query, head) row of the group
// against it, each row masked to its own query's selection. The union: each query ORs its bit into a byte per logical
// position (a word of 4 positions, global scratch), then a block-wide ordered compaction lists the positions with a
// non-zero byte as (cache row, byte). Rows: row r = query r / G, head r % G (G = heads / kv_heads), up to 96;
// 12 warps, warp w = (m-tile w / 2 of 16 rows, half w % 2). Per tile of 32 union positions: scores S = Q K^T (warp:
// its m-tile x the half's 16 columns, all of the head dim), online softmax in float32 (the pair of warps of an m-tile
// exchange row maxima through shared memory; each lane keeps a partial row sum), then O += P V (warp: its m-tile x the
// half's head-dim columns, O in registers). Products are FP16x2 (hi·hi + hi·lo + lo·hi, FP32 accumulation) on
// mma.sync m16n8k16 with ldmatrix operands: the same arithmetic as qsa_attention_kernel. Tile i + 1's K rows are in
// flight (registers) during tile i's scores and its V rows during tile i's P V.

constexpr int kUnionThreads = 384;
constexpr int kUnionWarps = kUnionThreads / 32;
constexpr int kUnionMaxRows = 16 * (kUnionWarps / 2);  // 96 rows: 6 m-tiles
constexpr int kUnionTile = 32;                         // union positions a tile
constexpr int kUnionPPitch = kUnionTile + 8;           // halves a row of P (80 bytes: ldmatrix rows on distinct banks)
constexpr int kUnionScanPer = 8;                       // scratch words a thread takes per round of the compaction
static_assert(kUnionMaxRows == 96 && kUnionTile == 32, "qsa_union_attention_kernel's warp roles");

// Shared memory of qsa_union_attention_kernel<NT> (head dim padded to D16 = 16 NT, pitch D16 + 8 halves) for `rows`
// query rows (a multiple of 16).
struct UnionSmem {
  int pd;
  __half *Qh, *Ql, *Kh, *Kl, *Vh, *Vl, *Ph, *Pl;
  float* red;       // [2][kUnionMaxRows]: the halves' row maxima, then row sums
  int32_t* rows;    // [2][kUnionTile]: cache rows of two tiles (-1: none)
  uint32_t* masks;  // [2][kUnionTile]: query bits of two tiles' positions
  int32_t* ints;    // [kUnionWarps + 8]: scan totals, group facts
  __host__ __device__ static size_t bytes(int nt, int rows) {
    const size_t pd = size_t(16 * nt + 8);
    return sizeof(__half) * (2 * rows * pd + 4 * kUnionTile * pd + size_t(2) * rows * kUnionPPitch) +
           sizeof(float) * 2 * kUnionMaxRows + (sizeof(int32_t) + sizeof(uint32_t)) * 2 * kUnionTile +
           sizeof(int32_t) * (kUnionWarps + 8);
  }
  __device__ UnionSmem(unsigned char* base, int nt, int n_rows) {
    pd = 16 * nt + 8;
    Qh = reinterpret_cast<__half*>(base);
    Ql = Qh + n_rows * pd;
    Kh = Ql + n_rows * pd;
    Kl = Kh + kUnionTile * pd;
    Vh = Kl + kUnionTile * pd;
    Vl = Vh + kUnionTile * pd;
    Ph = Vl + kUnionTile * pd;
    Pl = Ph + n_rows * kUnionPPitch;
    red = reinterpret_cast<float*>(Pl + n_rows * kUnionPPitch);  // every region above a multiple of 16 bytes
    rows = reinterpret_cast<int32_t*>(red + 2 * kUnionMaxRows);
    masks = reinterpret_cast<uint32_t*>(rows + 2 * kUnionTile);
    ints = reinterpret_cast<int32_t*>(masks + 2 * kUnionTile);
  }
};

// Non-zero bytes of a word.
__device__ __forceinline__ int nonzero_bytes(uint32_t v) {
  return int((v & 0xffu) != 0) + int((v & 0xff00u) != 0) + int((v & 0xff0000u) != 0) + int((v >> 24) != 0);
}

// Union entry e of a list of n (cache row, query bits), or (-1, 0) past the end.
__device__ __forceinline__ uint2 union_entry(const uint2* list, int n, int e) {
  return e < n ? __ldcg(list + e) : make_uint2(0xffffffffu, 0u);
}

// A lane's union entry into slot b of the tile facts.
__device__ __forceinline__ void union_entry_store(const UnionSmem& sm, int b, int lane, uint2 v) {
  sm.rows[b * kUnionTile + lane] = int32_t(v.x);
  sm.masks[b * kUnionTile + lane] = v.y;
}

// A tile's K or V rows of KV head g (slot b's cache rows) as float4s into registers, zero past `dim` and for rows < 0.
template <int NT, int PER>
__device__ __forceinline__ void union_load(float4 (&x)[PER], const float* __restrict__ cache, int64_t kvw, int g,
                                           int dim, const UnionSmem& sm, int b) {
  constexpr int Q4 = 4 * NT, N4 = kUnionTile * Q4;  // float4s a row (D16 / 4), a tile
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int e = int(threadIdx.x) + u * kUnionThreads, i = e / Q4, d = 4 * (e % Q4);
    x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (e < N4) {
      const int64_t row = sm.rows[b * kUnionTile + i];
      if (row >= 0 && d < dim) x[u] = __ldg(reinterpret_cast<const float4*>(cache + row * kvw + int64_t(g) * dim + d));
    }
  }
}

// The registers of union_load as FP16x2 halves into hi / lo [kUnionTile][pd].
template <int NT, int PER>
__device__ __forceinline__ void union_store(const float4 (&x)[PER], const UnionSmem& sm, __half* hi, __half* lo) {
  constexpr int Q4 = 4 * NT, N4 = kUnionTile * Q4;
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int e = int(threadIdx.x) + u * kUnionThreads, i = e / Q4, d = 4 * (e % Q4);
    if (e < N4) store_f16x2_4(x[u], hi + i * sm.pd + d, lo + i * sm.pd + d);
  }
}

// FP16x2 pair of two floats (a, b) as raw half2 words: hi and lo.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t* hi, uint32_t* lo) {
  __half ah, al, bh, bl;
  split_f16x2(a, &ah, &al);
  split_f16x2(b, &bh, &bl);
  *hi = h2_bits(__halves2half2(ah, bh));
  *lo = h2_bits(__halves2half2(al, bl));
}

// Block = (group of up to qpc consecutive rows of one sequence, KV head g). The groups: each sequence's rows
// (seq_starts) in runs of qpc, sequence by sequence; this launch's are groups group0 .. group0 + gridDim.x - 1, the
// last first. words: this launch's zeroed scratch, words_ld per block; lists: list_ld (cache row, query bits) entries
// per block (at least the union's size: qpc times the selection width, or the positions); cache rows below 2^31. Writes
// o * sigmoid(gate) (gate may be null). Requires dim % 4 == 0, 16-byte aligned caches, qpc * G <= 96 and qpc <= 8.
template <int NT>
__global__ void __launch_bounds__(kUnionThreads, 1)
    qsa_union_attention_kernel(const float* __restrict__ q, int64_t ldq, const int32_t* __restrict__ seq_starts,
                               int num_seqs, int qpc, int group0, const int32_t* __restrict__ tok_pos,
                               const int32_t* __restrict__ selected, int64_t ld_sel, const int32_t* __restrict__ counts,
                               QsaPaging pg, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                               int heads, int kv_heads, int dim, const float* __restrict__ gate, int64_t ld_gate,
                               int64_t gate_hs, float* __restrict__ out, int64_t ldo, uint32_t* __restrict__ words,
                               int64_t words_ld, uint2* __restrict__ lists, int64_t list_ld, int32_t* status) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D16 = 16 * NT;
  constexpr int PER = (kUnionTile * 4 * NT + kUnionThreads - 1) / kUnionThreads;  // float4s a thread loads a tile
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int G = heads / kv_heads, g = blockIdx.y;
  const int n_rows = (qpc * G + 15) & ~15;
  const UnionSmem sm(smem_raw, NT, n_rows);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int block_id = blockIdx.y * gridDim.x + blockIdx.x;
  uint32_t* wd = words + int64_t(block_id) * words_ld;
  uint2* list = lists + int64_t(block_id) * list_ld;
  // The group: sequence, first row, queries, largest position.
  if (threadIdx.x == 0) {
    // Groups in reverse: a prefill's later queries, with the longer contexts, first (the shorter ones fill the tail).
    int b = group0 + int(gridDim.x - 1 - blockIdx.x), s = 0, t0 = 0, nq = 0, pmax = -1;
    for (; s < num_seqs; ++s) {
      const int n = seq_starts[s + 1] - seq_starts[s], groups = (n + qpc - 1) / qpc;
      if (b < groups) {
        t0 = seq_starts[s] + b * qpc;
        nq = min(qpc, seq_starts[s + 1] - t0);
        break;
      }
      b -= groups;
    }
    for (int i = 0; i < nq; ++i) pmax = max(pmax, tok_pos[t0 + i]);
    sm.ints[kUnionWarps] = s;
    sm.ints[kUnionWarps + 1] = t0;
    sm.ints[kUnionWarps + 2] = nq;
    sm.ints[kUnionWarps + 3] = pmax;
  }
  __syncthreads();
  const int seq = sm.ints[kUnionWarps], t0 = sm.ints[kUnionWarps + 1], nq = sm.ints[kUnionWarps + 2];
  const int pmax = sm.ints[kUnionWarps + 3];
  if (nq == 0) return;  // past the last group (the whole block)
  const float scale = rsqrtf(float(dim));
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t kvw = int64_t(kv_heads) * dim;
  // Q rows (scaled) as FP16x2 halves; rows past the group's queries zero.
  for (int e = threadIdx.x; e < n_rows * D16; e += kUnionThreads) {
    const int r = e / D16, d = e % D16, qi = r / G, h = r % G;
    const float x = (qi < nq && d < dim) ? q[int64_t(t0 + qi) * ldq + int64_t(g * G + h) * dim + d] * scale : 0.f;
    split_f16x2(x, sm.Qh + r * sm.pd + d, sm.Ql + r * sm.pd + d);
  }
  // Each query's bit on its selected positions (a position after the query is flagged and never followed).
  for (int qi = 0; qi < nq; ++qi) {
    const int t = t0 + qi, p = tok_pos[t], cnt = counts[t];
    for (int e = threadIdx.x; e < cnt; e += kUnionThreads) {
      const int pos = selected[int64_t(t) * ld_sel + e];
      if (pos < 0 || pos > p || (pos >> 2) >= words_ld)
        flag(status, kQsaBadPosition);
      else
        atomicOr(wd + (pos >> 2), 1u << (8 * (pos & 3) + qi));
    }
  }
  __syncthreads();
  // The union in logical order: an ordered compaction of the non-zero bytes of words 0 .. pmax / 4 (at most the
  // block's words: a position past them is flagged and not followed).
  int n_words = (pmax >> 2) + 1;
  if (n_words > words_ld) {
    if (threadIdx.x == 0) flag(status, kQsaBadPosition);
    n_words = int(words_ld);
  }
  int n_union = 0;
  for (int r0 = 0; r0 < n_words; r0 += kUnionThreads * kUnionScanPer) {
    const int w0 = r0 + int(threadIdx.x) * kUnionScanPer;
    uint32_t v[kUnionScanPer];
    int count = 0;
#pragma unroll
    for (int u = 0; u < kUnionScanPer; ++u) {
      v[u] = w0 + u < n_words ? __ldcg(wd + w0 + u) : 0u;
      count += nonzero_bytes(v[u]);
    }
    int incl = count;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    if (lane == 31) sm.ints[warp] = incl;
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kUnionWarps; ++w) {
      before += w < warp ? sm.ints[w] : 0;
      total += sm.ints[w];
    }
    int at = n_union + before + incl - count;
#pragma unroll
    for (int u = 0; u < kUnionScanPer; ++u)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t m = (v[u] >> (8 * b)) & 0xffu;
        if (m != 0u && at < list_ld) {
          const int64_t row = phys_token(pg, seq, 4 * (w0 + u) + b, status);
          list[at++] = make_uint2(uint32_t(int32_t(row)), row >= 0 ? m : 0u);
        }
      }
    n_union += total;
    __syncthreads();  // ints[] is rewritten by the next round
  }
  if (n_union > list_ld) {  // the caller's bound: never, but said and cut rather than written past
    if (threadIdx.x == 0) flag(status, kQsaCountOverflow);
    n_union = int(list_ld);
  }
  const int n_tiles = (n_union + kUnionTile - 1) / kUnionTile;
  if (warp < 2) union_entry_store(sm, warp, lane, union_entry(list, n_union, kUnionTile * warp + lane));
  __syncthreads();
  float4 pre[PER];
  if (n_tiles > 0) {
    union_load<NT, PER>(pre, k_cache, kvw, g, dim, sm, 0);
    union_store<NT, PER>(pre, sm, sm.Kh, sm.Kl);
    union_load<NT, PER>(pre, v_cache, kvw, g, dim, sm, 0);
    union_store<NT, PER>(pre, sm, sm.Vh, sm.Vl);
  }
  __syncthreads();

  const int mi = warp >> 1, half = warp & 1;
  const bool active = 16 * mi < nq * G;  // the warp's m-tile holds rows of the group's queries
  const int gq = lane >> 2, tq = lane & 3;
  const int rA = 16 * mi + gq, rB = rA + 8;
  const uint32_t bitA = rA / G < 8 ? 1u << (rA / G) : 0u, bitB = rB / G < 8 ? 1u << (rB / G) : 0u;
  // ldmatrix addresses: A (Q, P) rows 16 mi + lane % 16 at column 8 (lane / 16); K rows of the half's columns.
  const int a_row = 16 * mi + (lane & 15), a_col = 8 * (lane >> 4);
  const int bm = lane >> 3, br = lane & 7;
  const int k_row = 16 * half + 8 * (bm >> 1) + br, k_col = 8 * (bm & 1);
  const int v_row = 8 * (bm & 1) + br, v_col = 8 * (NT * half) + 8 * (bm >> 1);
  float o[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float mA = neg_inf, mB = neg_inf, lA = 0.f, lB = 0.f;

  for (int i = 0; i < n_tiles; ++i) {
    const int b = i & 1;
    const bool next = i + 1 < n_tiles;
    if (next) union_load<NT, PER>(pre, k_cache, kvw, g, dim, sm, b ^ 1);
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (active) {  // scores of the m-tile x the half's 16 columns
      // The three products in separate accumulators: chains of NT dependent MMAs instead of 3 NT.
      float x[3][2][4] = {};
#pragma unroll 4
      for (int ks = 0; ks < NT; ++ks) {
        uint32_t ah[4], al[4], kh[4], kl[4];
        ldmatrix_x4(ah, sm.Qh + a_row * sm.pd + 16 * ks + a_col);
        ldmatrix_x4(al, sm.Ql + a_row * sm.pd + 16 * ks + a_col);
        ldmatrix_x4(kh, sm.Kh + k_row * sm.pd + 16 * ks + k_col);
        ldmatrix_x4(kl, sm.Kl + k_row * sm.pd + 16 * ks + k_col);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          mma_m16n8k16(x[0][n], ah[0], ah[1], ah[2], ah[3], kh[2 * n], kh[2 * n + 1]);
          mma_m16n8k16(x[1][n], ah[0], ah[1], ah[2], ah[3], kl[2 * n], kl[2 * n + 1]);
          mma_m16n8k16(x[2][n], al[0], al[1], al[2], al[3], kh[2 * n], kh[2 * n + 1]);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = x[0][n][e] + (x[1][n][e] + x[2][n][e]);
      float xA = neg_inf, xB = neg_inf;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t m = sm.masks[b * kUnionTile + 16 * half + 8 * n + 2 * tq + e];
          if (!(m & bitA)) s[n][e] = neg_inf;
          if (!(m & bitB)) s[n][2 + e] = neg_inf;
          xA = fmaxf(xA, s[n][e]);
          xB = fmaxf(xB, s[n][2 + e]);
        }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, off));
        xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, off));
      }
      if (tq == 0) {
        sm.red[half * kUnionMaxRows + rA] = xA;
        sm.red[half * kUnionMaxRows + rB] = xB;
      }
    }
    __syncthreads();  // (1) scores done: K is free, both halves' maxima are in
    if (next) {
      union_store<NT, PER>(pre, sm, sm.Kh, sm.Kl);
      union_load<NT, PER>(pre, v_cache, kvw, g, dim, sm, b ^ 1);
    }
    // Slot b (tile i's facts, read above) takes tile i + 2's, stored after P V (the last warp's load in flight).
    const bool fetch = warp == kUnionWarps - 1 && i + 2 < n_tiles;
    const uint2 ahead = fetch ? union_entry(list, n_union, kUnionTile * (i + 2) + lane) : make_uint2(0u, 0u);
    if (active) {  // online softmax: P of the half's columns, O and the partial row sums rescaled
      const float nA = fmaxf(mA, fmaxf(sm.red[rA], sm.red[kUnionMaxRows + rA]));
      const float nB = fmaxf(mB, fmaxf(sm.red[rB], sm.red[kUnionMaxRows + rB]));
      const float cA = mA == neg_inf ? 0.f : expf(mA - nA), cB = mB == neg_inf ? 0.f : expf(mB - nB);
      mA = nA;
      mB = nB;
      float sA = 0.f, sB = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = s[n][e] == neg_inf ? 0.f : expf(s[n][e] - (e < 2 ? nA : nB));
        sA += p[0] + p[1];
        sB += p[2] + p[3];
        const int c = 16 * half + 8 * n + 2 * tq;
        uint32_t hi, lo;
        split_pair(p[0], p[1], &hi, &lo);
        *reinterpret_cast<uint32_t*>(sm.Ph + rA * kUnionPPitch + c) = hi;
        *reinterpret_cast<uint32_t*>(sm.Pl + rA * kUnionPPitch + c) = lo;
        split_pair(p[2], p[3], &hi, &lo);
        *reinterpret_cast<uint32_t*>(sm.Ph + rB * kUnionPPitch + c) = hi;
        *reinterpret_cast<uint32_t*>(sm.Pl + rB * kUnionPPitch + c) = lo;
      }
      lA = lA * cA + sA;
      lB = lB * cB + sB;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        o[j][0] *= cA;
        o[j][1] *= cA;
        o[j][2] *= cB;
        o[j][3] *= cB;
      }
    }
    __syncthreads();  // (2) P is in
    if (active) {     // O += P V over the half's head-dim columns
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t ph[4], pl[4];
        ldmatrix_x4(ph, sm.Ph + a_row * kUnionPPitch + 16 * kk + a_col);
        ldmatrix_x4(pl, sm.Pl + a_row * kUnionPPitch + 16 * kk + a_col);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t vh[4], vl[4];
          const int off = (16 * kk + v_row) * sm.pd + v_col + 16 * np;
          ldmatrix_x4<true>(vh, sm.Vh + off);
          ldmatrix_x4<true>(vl, sm.Vl + off);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float(&acc)[4] = o[2 * np + e];
            mma_m16n8k16(acc, ph[0], ph[1], ph[2], ph[3], vh[2 * e], vh[2 * e + 1]);
            mma_m16n8k16(acc, ph[0], ph[1], ph[2], ph[3], vl[2 * e], vl[2 * e + 1]);
            mma_m16n8k16(acc, pl[0], pl[1], pl[2], pl[3], vh[2 * e], vh[2 * e + 1]);
          }
        }
      }
    }
    if (fetch) union_entry_store(sm, b, lane, ahead);
    __syncthreads();  // (3) V is free, slot b holds tile i + 2
    if (next) union_store<NT, PER>(pre, sm, sm.Vh, sm.Vl);
  }
  // Row sums: the quad's lanes, then the two halves.
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, off);
    lB += __shfl_xor_sync(0xffffffffu, lB, off);
  }
  if (active && tq == 0) {
    sm.red[half * kUnionMaxRows + rA] = lA;
    sm.red[half * kUnionMaxRows + rB] = lB;
  }
  __syncthreads();
  if (!active) return;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = rr == 0 ? rA : rB, qi = r / G, h = r % G;
    if (qi >= nq) continue;
    const float L = sm.red[r] + sm.red[kUnionMaxRows + r];
    const int t = t0 + qi, hq = g * G + h;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 8 * (NT * half + j) + 2 * tq + e;
        if (d >= dim) continue;
        float v = L > 0.f ? o[j][2 * rr + e] / L : 0.f;
        if (gate) v *= sigmoidf_(gate[int64_t(t) * ld_gate + int64_t(hq) * gate_hs + d]);
        out[int64_t(t) * ldo + int64_t(hq) * dim + d] = v;
      }
  }
#endif
}

// The head-dim paddings 32, 64, 128 and 256 (compiled by NVRTC too, for the SM70 check).
#define FN_QSA_UNION(NT)                                                                                             \
  template __global__ void qsa_union_attention_kernel<NT>(                                                           \
      const float*, int64_t, const int32_t*, int, int, int, const int32_t*, const int32_t*, int64_t, const int32_t*, \
      QsaPaging, const float*, const float*, int, int, int, const float*, int64_t, int64_t, float*, int64_t,         \
      uint32_t*, int64_t, uint2*, int64_t, int32_t*);
FN_QSA_UNION(2)
FN_QSA_UNION(4)
FN_QSA_UNION(8)
FN_QSA_UNION(16)
#undef FN_QSA_UNION
}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (splits < 1 || splits > kQsaMaxSplits || (splits > 1 && split_len % kTile != 0)) return cudaErrorInvalidValue;
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
    launch(qsa_combine_kernel<float>, dim3{unsigned(tokens * heads), unsigned((dim + kCombineCols - 1) / kCombineCols)},
           kThreads, 0, stream, partial, heads, dim, splits, gate, ld_gate, gate_head_stride, out, ldo);
  return cudaGetLastError();
}
QsaUnionPlan qsa_union_plan(int heads, int kv_heads, int dim) {
  QsaUnionPlan p;
  const int G = kv_heads > 0 ? heads / kv_heads : 0;
  if (G < 1 || G > kUnionMaxRows || dim < 1 || dim > 256 || dim % 4 != 0) return p;
  if (kernel_ptx_version(reinterpret_cast<const void*>(qsa_union_attention_kernel<16>)) < 80) return p;
  p.nt = dim <= 32 ? 2 : dim <= 64 ? 4 : dim <= 128 ? 8 : 16;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&p.multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return p;
  }
  for (int qpc = std::min(8, kUnionMaxRows / G); qpc >= 1; --qpc) {
    const size_t smem = UnionSmem::bytes(p.nt, (qpc * G + 15) & ~15);
    if (smem <= size_t(optin)) {
      p.qpc = qpc;
      p.smem = smem;
      return p;
    }
  }
  return p;
}

cudaError_t launch_qsa_union_attention(const QsaUnionPlan& plan, const float* q, int64_t ldq, const int32_t* seq_starts,
                                       int num_seqs, int groups, const int32_t* tok_pos, const int32_t* selected,
                                       int64_t ld_sel, const int32_t* counts, QsaPaging pg, const float* k_cache,
                                       const float* v_cache, int heads, int kv_heads, int dim, const float* gate,
                                       int64_t ld_gate, int64_t gate_head_stride, float* out, int64_t ldo,
                                       uint32_t* words, int64_t words_ld, uint2* lists, int64_t list_ld,
                                       int group_batch, int32_t* status, cudaStream_t stream) {
  if (groups == 0) return cudaSuccess;
  if (plan.qpc < 1 || group_batch < 1) return cudaErrorInvalidValue;
  const auto kernel = plan.nt == 2   ? qsa_union_attention_kernel<2>
                      : plan.nt == 4 ? qsa_union_attention_kernel<4>
                      : plan.nt == 8 ? qsa_union_attention_kernel<8>
                                     : qsa_union_attention_kernel<16>;
  cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), plan.smem);
  if (err != cudaSuccess) return err;
  for (int g0 = 0; g0 < groups; g0 += group_batch) {
    const int n = std::min(group_batch, groups - g0);
    err = cudaMemsetAsync(words, 0, sizeof(uint32_t) * size_t(n) * kv_heads * words_ld, stream);
    if (err != cudaSuccess) return err;
    launch(kernel, dim3(n, kv_heads), kUnionThreads, plan.smem, stream, q, ldq, seq_starts, num_seqs, plan.qpc, g0,
           tok_pos, selected, ld_sel, counts, pg, k_cache, v_cache, heads, kv_heads, dim, gate, ld_gate,
           gate_head_stride, out, ldo, words, words_ld, lists, list_ld, status);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}
#endif

}  // namespace flashnext::cuda::detail
