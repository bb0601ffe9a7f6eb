// Gated DeltaNet kernels (MODEL.md "Gated DeltaNet (linear attention) layer"; reference Qwen4ExpTextGatedDeltaNet,
// causal_conv1d_fn / causal_conv1d_update, torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule).
// The gated delta rule: the recurrence (decode) and the chunked form (prefill), FP32 activations and arithmetic,
// FP32 recurrent state [slot, nv, dk, dv]. The causal conv of the ops interface is in cuda_ops_kernels.cu. Only SM70
// instructions (CUDA cores, shuffles, shared memory), but for the chunked form's tensor-core state walk
// (gdn_chunk_walk_mma_kernel, SM80+: mma.sync, ldmatrix, cp.async).
#ifndef __CUDACC_RTC__
#include <algorithm>

#include "ops/cuda/kernel_attributes.h"
#endif

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gdn_kernels.h"
#include "ops/cuda/mma_sm80.cuh"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;

// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)   (FP32, g <= 0).
template <class T>
__device__ __forceinline__ void gdn_gates(const T* a, const T* b, const float* a_log, const float* dt_bias, int head,
                                          float* beta, float* g) {
  *beta = sigmoidf_(to_f(*b));
  *g = -expf(a_log[head]) * softplusf_(to_f(*a) + dt_bias[head]);
}

// The folded conv (GdnConvIn). Input of channel ch at row rr of a sequence whose rows start at r0: its raw projection
// row, or for rr < r0 row ctx - (r0 - rr) of the slot's conv state cst [ctx, ld] (ctx = K - 1).
template <class T>
__device__ __forceinline__ float conv_input(const T* qkv, int64_t ld, const float* cst, int ctx, int r0, int rr,
                                            int64_t ch) {
  return rr >= r0 ? to_f(qkv[int64_t(rr) * ld + ch]) : cst[int64_t(ctx - (r0 - rr)) * ld + ch];
}

// silu of channel ch's causal conv at row r: the taps k = 0 .. K-1 in order, as conv_slots_kernel.
template <class T>
__device__ __forceinline__ float conv_at(const T* qkv, int64_t ld, const GdnConvIn& cv, const float* cst, int r0, int r,
                                         int64_t ch) {
  const int ctx = cv.K - 1;
  float x[kGdnFoldedConvMaxTaps], w[kGdnFoldedConvMaxTaps];
#pragma unroll
  for (int k = 0; k < kGdnFoldedConvMaxTaps; ++k)
    if (k < cv.K) {  // every tap's loads issued before the sum
      x[k] = conv_input(qkv, ld, cst, ctx, r0, r - ctx + k, ch);
      w[k] = to_f(cv.w[ch * cv.K + k]);
    }
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < kGdnFoldedConvMaxTaps; ++k)
    if (k < cv.K) acc += w[k] * x[k];
  return siluf_(acc);
}

// Channel ch's conv state after the rows r0 .. r1-1: its last K - 1 inputs, all read before any is written.
template <class T>
__device__ __forceinline__ void store_conv_state(const T* qkv, int64_t ld, const GdnConvIn& cv, float* cst, int r0,
                                                 int r1, int64_t ch) {
  const int ctx = cv.K - 1;
  float x[kGdnFoldedConvMaxTaps - 1];
#pragma unroll
  for (int q = 0; q < kGdnFoldedConvMaxTaps - 1; ++q)
    if (q < ctx) x[q] = conv_input(qkv, ld, cst, ctx, r0, r1 - ctx + q, ch);
#pragma unroll
  for (int q = 0; q < kGdnFoldedConvMaxTaps - 1; ++q)
    if (q < ctx) cst[int64_t(q) * ld + ch] = x[q];
}

// The recurrence over a few rows per sequence. Block = (sequence, value head, slice of 32 value columns); thread
// (warp w, lane l) owns column j = 32*slice + l and key rows i = w, w+8, ... of the state S [dk, dv], which stays in
// its registers over the sequence's rows seq_starts[s] .. seq_starts[s+1] (row s alone without seq_starts: decode)
// and is stored once after them. Each row takes exactly the operations of a decode step, in the same order, so n rows
// give the state and outputs of n decode steps bit for bit. With norm.z (GdnOutNorm), the last block of the
// (sequence, value head) to finish (a counter per (slot, head), counted by thread 0 with an acquire-release atomic at
// GPU scope after a block barrier, as the W4A16 down GEMV's combine) applies the gated norm to the head's dv outputs
// of every row, a warp per row, reading them from L2 (__ldcg). With conv.w (GdnConvIn), q, k and v are the conv's
// outputs computed from the raw rows and the slot's conv state; each block writes the new conv state of its own 32 v
// channels, and the last block of the key head's value heads (a counter per (slot, key head), as above) that of the
// key head's q and k channels, once every block that reads them has counted. FOLD: conv.w is set (compiled apart, so
// that the other form keeps its registers).
// Registers (sm_90): without the fold, 4 blocks an SM as before the epilogues (64 registers, no spill); with it, 2
// (122 registers, no spill; bounded to 3 it spills 64 bytes), which is why the host folds the conv in only where the
// launch fits one wave (gdn_recurrent_folded_resident_blocks). With the fold, warp 0 computes the row's v conv into
// shared memory (vs) before the barrier after which every warp reads it.
static_assert(2 * kGdnMaxDk <= kThreads, "gdn_recurrent_kernel: a thread per q and k element");
template <class T, bool FOLD>
__global__ void __launch_bounds__(kThreads, FOLD ? 2 : 4)
    gdn_recurrent_kernel(const T* __restrict__ qkv, int64_t ld_qkv, const T* __restrict__ a, const T* __restrict__ bb,
                         int64_t ld_ab, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                         float* __restrict__ state, const int32_t* __restrict__ slots,
                         const int32_t* __restrict__ seq_starts, GdnHeads d, T* __restrict__ out, int64_t ld_out,
                         GdnConvIn conv, GdnOutNorm norm) {
  pdl_begin();
  __shared__ float qs[kGdnMaxDk], ks[kGdnMaxDk];
  __shared__ float part[kThreads / 32][32];
  __shared__ float scratch[32];
  __shared__ float vs[32];
  constexpr int kRows = kGdnMaxDk / (kThreads / 32);
  const int slices = (d.dv + 31) / 32;
  const int seq = blockIdx.x / (d.nv * slices);
  const int head = (blockIdx.x / slices) % d.nv;
  const int slice = blockIdx.x % slices;
  const int kh = head / (d.nv / d.nk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r0 = seq_starts ? seq_starts[seq] : seq, r1 = seq_starts ? seq_starts[seq + 1] : seq + 1;
  const int j = slice * 32 + lane;
  const bool col = j < d.dv;
  float* S = state + (int64_t(slots[seq]) * d.nv + head) * d.dk * d.dv;
  float* cst = FOLD ? conv.state + int64_t(slots[seq]) * (conv.K - 1) * ld_qkv : nullptr;
  const int64_t ch_v = int64_t(2 * d.nk * d.dk) + int64_t(head) * d.dv + j;
  float s[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = warp + m * (kThreads / 32);
    s[m] = (col && i < d.dk) ? S[int64_t(i) * d.dv + j] : 0.f;
  }
  for (int r = r0; r < r1; ++r) {
    // qs, ks and part of the row before are no longer read: the barriers after its outputs (and block_sum's) order it.
    const T* row = qkv + int64_t(r) * ld_qkv;
    // q by the first dk threads, k by the next dk (2 dk <= kThreads), the same sums with the conv folded in or not:
    // its outputs are bit for bit conv_slots_kernel's, so both forms give the same bits.
    float sq = 0.f, sk = 0.f;
    for (int e = threadIdx.x; e < 2 * d.dk; e += kThreads) {
      const bool is_q = e < d.dk;
      const int i = is_q ? e : e - d.dk;
      const int64_t ch = int64_t(is_q ? kh : d.nk + kh) * d.dk + i;
      const float x = FOLD ? conv_at(qkv, ld_qkv, conv, cst, r0, r, ch) : to_f(row[ch]);
      if (is_q) {
        qs[i] = x;
        sq += x * x;
      } else {
        ks[i] = x;
        sk += x * x;
      }
    }
    sq = block_sum(sq, scratch);
    sk = block_sum(sk, scratch);
    const float rq = rsqrtf(sq + 1e-6f) * rsqrtf(float(d.dk)), rk = rsqrtf(sk + 1e-6f);
    float beta, g;
    gdn_gates(a + int64_t(r) * ld_ab + head, bb + int64_t(r) * ld_ab + head, a_log, dt_bias, head, &beta, &g);
    const float decay = expf(g);
    float kv = 0.f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = warp + m * (kThreads / 32);
      s[m] = s[m] * decay;
      if (i < d.dk) kv += s[m] * ks[i] * rk;
    }
    // vs of the row before was read before the barriers after its outputs.
    if (FOLD && warp == 0) vs[lane] = col ? conv_at(qkv, ld_qkv, conv, cst, r0, r, ch_v) : 0.f;
    part[warp][lane] = kv;
    __syncthreads();
    kv = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) kv += part[w][lane];
    const float v = !col ? 0.f : FOLD ? vs[lane] : to_f(row[ch_v]);
    const float delta = beta * (v - kv);
    float o = 0.f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = warp + m * (kThreads / 32);
      if (i < d.dk) {
        s[m] += ks[i] * rk * delta;
        o += s[m] * qs[i] * rq;
      }
    }
    __syncthreads();
    part[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
      o = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) o += part[w][lane];
      if (col) out[int64_t(r) * ld_out + int64_t(head) * d.dv + j] = from_f<T>(o);
    }
  }
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = warp + m * (kThreads / 32);
    if (col && i < d.dk) S[int64_t(i) * d.dv + j] = s[m];
  }
  // The block's own v channels' conv state: every warp read them in the rows above, before the last row's barriers.
  if (FOLD && warp == 0 && col) store_conv_state(qkv, ld_qkv, conv, cst, r0, r1, ch_v);
  if (!FOLD && !norm.z) return;
  __shared__ int last_conv, last_norm;
  __syncthreads();  // the block's reads of the conv state and its outputs happen before thread 0's release
  if (threadIdx.x == 0) {
    const int slot = slots[seq];
    int32_t before;
    if (FOLD) {
      int32_t* cnt = conv.done + int64_t(slot) * d.nk + kh;
      asm volatile("atom.acq_rel.gpu.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(cnt) : "memory");
      last_conv = before == (d.nv / d.nk) * slices - 1;
      if (last_conv) *cnt = 0;  // every block of this (slot, key head) has counted; the next launch is ordered after
    }
    if (norm.z) {
      int32_t* cnt = norm.done + int64_t(slot) * d.nv + head;
      asm volatile("atom.acq_rel.gpu.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(cnt) : "memory");
      last_norm = before == slices - 1;
      if (last_norm) *cnt = 0;
    }
  }
  __syncthreads();
  if (FOLD && last_conv) {  // the key head's q and k channels
    for (int i = threadIdx.x; i < 2 * d.dk; i += kThreads)
      store_conv_state(qkv, ld_qkv, conv, cst, r0, r1,
                       i < d.dk ? int64_t(kh) * d.dk + i : int64_t(d.nk + kh) * d.dk + i - d.dk);
  }
  if (!norm.z || !last_norm) return;
  for (int r = r0 + warp; r < r1; r += kThreads / 32) {  // a warp per row
    T* orow = out + int64_t(r) * ld_out + int64_t(head) * d.dv;
    float ss = 0.f;
#pragma unroll 1
    for (int c = lane; c < d.dv; c += 32) {
      const float v = to_f(__ldcg(orow + c));
      ss += v * v;
    }
    const float rs = rsqrtf(warp_sum(ss) / float(d.dv) + norm.eps);
    const float* zr = norm.z + int64_t(r) * norm.ld_z + int64_t(head) * d.dv;
#pragma unroll 1
    for (int c = lane; c < d.dv; c += 32) {
      const float zv = zr[c];
      orow[c] = from_f<T>(to_f(norm.w[c]) * to_f(__ldcg(orow + c)) * rs * (norm.silu ? siluf_(zv) : sigmoidf_(zv)));
    }
  }
}

// Chunked prefill (WY form, chunks of C = kGdnChunk tokens), equal to the recurrence; the reference's
// torch_chunk_gated_delta_rule computes the same quantities. Per chunk of L rows with cumulative log-decay G (every
// exponent below is <= 0), normalised q (times dk^-1/2) and k:
//   A[r,c] = beta_r (k_r·k_c) e^{G_r-G_c} (c<r);  T = (I+A)^-1;  U = T (beta v);  W = T (beta k e^{G})
//   M[r,c] = (q_r·k_c) e^{G_r-G_c} (c<=r)
//   v_new = U - W S;  o_r = e^{G_r} q_r S + sum_{c<=r} M[r,c] v_new_c
//   S' = e^{G_{L-1}} S + sum_c e^{G_{L-1}-G_c} k_c ⊗ v_new_c
// Three kernels: gdn_chunk_prep (every chunk of every sequence at once: A, T, W, U, M and the decayed q and k),
// gdn_chunk_state (per sequence, value head and 32 value columns, the chunks in order: v_new and the state before
// each chunk), gdn_chunk_output (every chunk at once: o). Their intermediates live in a scratch of
// gdn_chunk_scratch_floats() floats; the chunk of sequence s with index ci has slot s + cu[s] / C + ci there.
constexpr int kChunk = kGdnChunk;
constexpr int kSlice = 32;  // value columns per gdn_chunk_state block

// Per (slot, head) arrays of the scratch: W, Kl (= k e^{G_{L-1}-G}), Qg (= q e^{G}) [C, dk]; U [C, dv]; M [C, C];
// Sc (the state before the chunk) [dk, dv]; eL (e^{G_{L-1}}). The CUDA-core kernels write v_new over U. The split
// form, for the tensor-core walk (gdn_chunk_walk_mma_kernel), holds W, Kl, Qg and M as FP16x2 planes (a pair's n
// floats hold its hi plane of n halves, then its lo plane), U transposed [dv, C], and no Sc.
struct ChunkScratch {
  float *W, *Kl, *Qg, *U, *M, *Sc, *eL;
  int heads;  // heads of this pass: the arrays are indexed by slot * heads + (head - first head)
  __device__ int64_t pair(int slot, int h) const { return int64_t(slot) * heads + h; }
};

// Powers of two the split form's W, Kl, Qg and M are stored times (exact): they bring the elements of the released
// widths (dk = 128: q l2-normalised times dk^-1/2, about 2^-7; k normalised, about 2^-3.5) near 1, where the lo
// half of an FP16x2 pair is no FP16 subnormal; the walk takes them out of its products exactly. They are fixed: the
// decay factors e^{G_r} of Qg and of W's right-hand side beta e^{G} k, and q nearly orthogonal to k in M, can still
// bring a chunk's elements down to where the lo halves are subnormal (g_0 = -6, beta 0.5: elements near 2^-9, an
// error near 2^-16 of the largest element instead of 2^-22; a review of Session 24). Per-chunk powers of two stored
// beside eL would remove that; not done yet.
constexpr float kSplitQgScale = 128.f, kSplitKwScale = 16.f, kSplitMScale = 16.f;

// The hi plane of pair P's array of n floats in the split form (the lo plane follows it at + n).
__device__ __forceinline__ __half* hi_plane(float* region, int64_t P, int64_t n) {
  return reinterpret_cast<__half*>(region + P * n);
}

// Element e of pair P's array of n floats in a scratch region: the float, or (Split) its FP16x2 halves at e of the
// pair's hi plane and of its lo plane.
template <bool Split>
__device__ __forceinline__ void put(float* region, int64_t P, int64_t n, int64_t e, float v) {
  if constexpr (Split) {
    __half* hi = hi_plane(region, P, n);
    split_f16x2(v, hi + e, hi + n + e);
  } else {
    region[P * n + e] = v;
  }
}

// acc[m][n] += a_m b_n: the 4 x 4 outer product of a thread's register tile.
__device__ __forceinline__ void outer4_add(float (&acc)[4][4], float4 a, float4 b) {
  const float aa[4] = {a.x, a.y, a.z, a.w}, ba[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) acc[m][n] += aa[m] * ba[n];
}

__device__ __forceinline__ int chunk_slot_base(const int32_t* cu, int s) { return s + cu[s] / kChunk; }

// The (sequence, chunk index) of a scratch slot: the largest s with chunk_slot_base(s) <= slot; false when no chunk
// has that slot (slots are unique: a sequence of n rows from row a has at most floor((a+n)/C) - floor(a/C) + 1 chunks).
__device__ bool slot_chunk(const int32_t* cu, int num_seqs, int slot, int* seq, int* ci) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunk_slot_base(cu, mid) <= slot)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int c = slot - chunk_slot_base(cu, lo);
  if (c < 0 || int64_t(c) * kChunk >= cu[lo + 1] - cu[lo]) return false;
  *seq = lo;
  *ci = c;
  return true;
}

// Floats of the prep kernel's Qn region, which T [C][C+1] reuses (larger than Qn [C][dk+1] when dk < C), and of its
// whole shared memory.
__host__ __device__ inline int prep_qn_floats(int dk) {
  return kChunk * (dk + 1) > kChunk * (kChunk + 1) ? kChunk * (dk + 1) : kChunk * (kChunk + 1);
}
constexpr int kTBlock = 16;  // block size of T's inversion
__host__ __device__ inline int prep_smem_floats(int dk) {
  return kChunk * (dk + 1) + prep_qn_floats(dk) + kChunk * (kChunk + 1) + 4 * kChunk +
         (kChunk / kTBlock - 1) * kTBlock * kTBlock;
}

// Block = (slot, head of the pass). Shared: Kn [C][dk+1], Qn [C][dk+1] (reused for T [C][C+1]), A [C][C+1], beta, G,
// eG, eL, and the block products of T's inversion. Split: the tensor-core walk's form (ChunkScratch).
template <bool Split>
__global__ void __launch_bounds__(kThreads)
    gdn_chunk_prep_kernel(const float* __restrict__ qkv, int64_t ld_qkv, const float* __restrict__ a,
                          const float* __restrict__ bb, int64_t ld_ab, const float* __restrict__ a_log,
                          const float* __restrict__ dt_bias, const int32_t* __restrict__ cu, int num_seqs, GdnHeads d,
                          int head0, ChunkScratch sc) {
  pdl_begin();
  extern __shared__ __align__(16) float smem_raw[];
  constexpr int C = kChunk;
  const int ldk = d.dk + 1;
  float* Kn = smem_raw;
  float* Qn = Kn + C * ldk;
  float* Tm = Qn;  // after the products that read Qn; the region holds the larger of the two
  float* A = Qn + prep_qn_floats(d.dk);
  float* beta = A + C * (C + 1);
  float* G = beta + C;
  float* eG = G + C;
  float* eLv = eG + C;
  float* Pm = eLv + C;  // [C/16 - 1][16][16] block products of T's inversion
  int seq, ci;
  if (!slot_chunk(cu, num_seqs, blockIdx.x, &seq, &ci)) return;
  const int head = head0 + blockIdx.y, kh = head / (d.nv / d.nk);
  const int c0 = cu[seq] + ci * C, L = min(C, cu[seq + 1] - c0);
  const int64_t P = sc.pair(blockIdx.x, blockIdx.y);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kThreads / 32;
  // (a) q, k l2-normalised (q times dk^-1/2), gates; rows past L are zero. One warp per row.
  const float qscale = rsqrtf(float(d.dk));
  for (int r = warp; r < C; r += kWarps) {
    const int64_t t = c0 + r;
    float sq = 0.f, sk = 0.f;
    if (r < L) {
      const float* row = qkv + t * ld_qkv;
      for (int i = lane; i < d.dk; i += 32) {
        const float q = row[int64_t(kh) * d.dk + i], k = row[int64_t(d.nk + kh) * d.dk + i];
        Qn[r * ldk + i] = q;
        Kn[r * ldk + i] = k;
        sq += q * q;
        sk += k * k;
      }
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float rq = rsqrtf(sq + 1e-6f) * qscale, rk = rsqrtf(sk + 1e-6f);
    for (int i = lane; i < d.dk; i += 32) {
      Qn[r * ldk + i] = r < L ? Qn[r * ldk + i] * rq : 0.f;
      Kn[r * ldk + i] = r < L ? Kn[r * ldk + i] * rk : 0.f;
    }
    if (lane == 0) {
      float bt = 0.f, g = 0.f;
      if (r < L) gdn_gates(a + t * ld_ab + head, bb + t * ld_ab + head, a_log, dt_bias, head, &bt, &g);
      beta[r] = bt;
      G[r] = g;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // cumulative log-decay, summed in order as torch.cumsum
    for (int r = 1; r < C; ++r) G[r] += G[r - 1];
    sc.eL[P] = expf(G[L - 1]);
  }
  __syncthreads();
  if (threadIdx.x < C) {
    const int r = threadIdx.x;
    eG[r] = expf(G[r]);
    eLv[r] = r < L ? expf(G[L - 1] - G[r]) : 0.f;
  }
  __syncthreads();
  // The decayed q and k for the state and output kernels.
  for (int e = threadIdx.x; e < C * d.dk; e += kThreads) {
    const int r = e / d.dk, i = e % d.dk;
    put<Split>(sc.Qg, P, C * d.dk, e, Qn[r * ldk + i] * eG[r] * (Split ? kSplitQgScale : 1.f));
    put<Split>(sc.Kl, P, C * d.dk, e, Kn[r * ldk + i] * eLv[r] * (Split ? kSplitKwScale : 1.f));
  }
  // (b) A and M, a 4x4 tile of (r, c) per thread; tiles wholly above the diagonal are zero.
  {
    const int r0 = 4 * (threadIdx.x / 16), cc0 = 4 * (threadIdx.x % 16);
    float kk[4][4] = {}, qk[4][4] = {};
    if (cc0 <= r0 + 3 && r0 < L) {
      for (int i = 0; i < d.dk; ++i) {
        float kr[4], qr[4], kc[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          kr[m] = Kn[(r0 + m) * ldk + i];
          qr[m] = Qn[(r0 + m) * ldk + i];
          kc[m] = Kn[(cc0 + m) * ldk + i];
        }
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            kk[m][n] += kr[m] * kc[n];
            qk[m][n] += qr[m] * kc[n];
          }
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int r = r0 + m, c = cc0 + n;
        const bool lower = c <= r && r < L;
        const float dec = lower ? expf(G[r] - G[c]) : 0.f;
        A[r * (C + 1) + c] = (lower && c < r) ? beta[r] * kk[m][n] * dec : 0.f;
        put<Split>(sc.M, P, C * C, r * C + c, lower ? qk[m][n] * dec * (Split ? kSplitMScale : 1.f) : 0.f);
      }
  }
  __syncthreads();
  // (c) T = (I + A)^-1 (unit lower triangular) into Tm (over Qn), in 16 x 16 blocks: the diagonal blocks are the
  // inverses of A's (forward substitution, a thread per column), then block row i = 1, 2, 3 from
  // (I + A_ii) T_ij + sum_{k=j}^{i-1} A_ik T_kj = 0:  P_j = sum_k A_ik T_kj,  T_ij = -T_ii P_j (every thread).
  {
    constexpr int B = kTBlock, NB = C / B;
    constexpr int ldt = C + 1;
    for (int e = threadIdx.x; e < C * ldt; e += kThreads) Tm[e] = 0.f;
    for (int e = threadIdx.x; e < C * d.dk; e += kThreads) {  // Kn becomes beta e^G k, W's right-hand side
      const int r = e / d.dk, i = e % d.dk;
      Kn[r * ldk + i] *= beta[r] * eG[r];
    }
    __syncthreads();
    if (threadIdx.x < C) {
      const int q = threadIdx.x / B, j = threadIdx.x % B, J = q * B + j;
      Tm[J * ldt + J] = 1.f;
      for (int r = j + 1; r < B; ++r) {
        const int R = q * B + r;
        float acc = 0.f;
        for (int c = j; c < r; ++c) acc -= A[R * ldt + q * B + c] * Tm[(q * B + c) * ldt + J];
        Tm[R * ldt + J] = acc;
      }
    }
    __syncthreads();
    for (int i = 1; i < NB; ++i) {
      for (int o = threadIdx.x; o < i * B * B; o += kThreads) {
        const int jb = o / (B * B), r = (o / B) % B, c = o % B;
        float acc = 0.f;
        for (int k = jb; k < i; ++k)
#pragma unroll
          for (int m = 0; m < B; ++m) acc += A[(i * B + r) * ldt + k * B + m] * Tm[(k * B + m) * ldt + jb * B + c];
        Pm[o] = acc;
      }
      __syncthreads();
      for (int o = threadIdx.x; o < i * B * B; o += kThreads) {
        const int jb = o / (B * B), r = (o / B) % B, c = o % B;
        float acc = 0.f;
#pragma unroll
        for (int m = 0; m < B; ++m) acc -= Tm[(i * B + r) * ldt + i * B + m] * Pm[jb * B * B + m * B + c];
        Tm[(i * B + r) * ldt + jb * B + c] = acc;
      }
      __syncthreads();
    }
  }
  // (d) W = T (beta e^G k) and U = T (beta v): rows 4ty.., columns tx + 16n of a block of at most 128 columns per
  // thread. T[r][c] = 0 for c > r, and the right-hand sides' rows past L are zero.
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16, r0 = 4 * ty;
  const int cmax = min(r0 + 3, L - 1);
  // store(r, j, sum_c T[r][c] src[c][j]) for the `cols` columns of src (row stride ldk).
  auto t_times = [&](const float* src, int cols, auto&& store) {
    float acc[4][8] = {};
    for (int c = 0; c <= cmax; ++c) {
      float tr[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) tr[m] = Tm[(r0 + m) * (C + 1) + c];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int j = tx + 16 * n;
        const float x = j < cols ? src[c * ldk + j] : 0.f;
#pragma unroll
        for (int m = 0; m < 4; ++m) acc[m][n] += tr[m] * x;
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int j = tx + 16 * n;
        if (j < cols) store(r0 + m, j, acc[m][n]);
      }
  };
  t_times(Kn, d.dk, [&](int r, int j, float v) {
    put<Split>(sc.W, P, C * d.dk, r * d.dk + j, v * (Split ? kSplitKwScale : 1.f));
  });
  float* Vb = Kn;  // beta v, a block of up to min(dk + 1, 128) columns at a time (Kn is free now)
  const int vcols = min(d.dv, min(ldk, 128));
  for (int j0 = 0; j0 < d.dv; j0 += vcols) {
    const int cols = min(vcols, d.dv - j0);
    __syncthreads();
    for (int e = threadIdx.x; e < C * cols; e += kThreads) {
      const int r = e / cols, j = e % cols;
      const float* vrow = qkv + (c0 + r) * ld_qkv + int64_t(2 * d.nk * d.dk) + int64_t(head) * d.dv;
      Vb[r * ldk + j] = r < L ? beta[r] * vrow[j0 + j] : 0.f;
    }
    __syncthreads();
    t_times(Vb, cols, [&](int r, int j, float v) {
      if constexpr (Split)
        sc.U[P * C * d.dv + (j0 + j) * C + r] = v;
      else
        sc.U[P * C * d.dv + r * d.dv + j0 + j] = v;
    });
  }
}

struct StateSmem {
  static size_t floats(int dk) {
    return size_t(dk) * kSlice + size_t(kChunk) * (dk + 4) + size_t(kChunk) * dk + size_t(kChunk) * kSlice;
  }
};

// Block = (sequence, head of the pass, slice of 32 value columns); walks the sequence's chunks in order. Thread
// (ty, tx) holds the state rows 4ty..4ty+3 and columns 4tx..4tx+3 of the slice in registers; the shared copy S
// [dk][32], W [C][dk+4], Kl [C][dk] and v_new [C][32] serve the products. Writes v_new over U and the state before
// each chunk to Sc; the final state to the pool.
__global__ void __launch_bounds__(kThreads, 2)
    gdn_chunk_state_kernel(float* __restrict__ state, const int32_t* __restrict__ slots,
                           const int32_t* __restrict__ cu, GdnHeads d, int head0, ChunkScratch sc) {
  pdl_begin();
  extern __shared__ __align__(16) float smem_raw[];
  constexpr int C = kChunk;
  const int ldw = d.dk + 4;
  float* S = smem_raw;
  float* Ws = S + d.dk * kSlice;
  float* Ks = Ws + C * ldw;
  float* Vn = Ks + C * d.dk;
  const int seq = blockIdx.x, hp = blockIdx.y, head = head0 + hp, j0 = blockIdx.z * kSlice;
  const int start = cu[seq], len = cu[seq + 1] - start;
  if (len <= 0) return;
  const int base = chunk_slot_base(cu, seq);
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int i0 = 4 * ty, jj0 = 4 * tx;
  float* Sg = state + (int64_t(slots[seq]) * d.nv + head) * d.dk * d.dv;
  float s[4][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int i = i0 + m, j = j0 + jj0 + n;
      s[m][n] = (i < d.dk && j < d.dv) ? Sg[int64_t(i) * d.dv + j] : 0.f;
    }
  // The next chunk's W and Kl rows and this thread's U entries are loaded into registers while the current chunk
  // computes (SM70 has no cp.async): every load of a chunk in flight at once, its latency hidden behind a chunk.
  constexpr int kLoads = kChunk * kGdnMaxDk / 4 / kThreads;  // float4 of W (and of Kl) per thread and chunk
  static_assert(kChunk * kGdnMaxDk / 4 == kLoads * kThreads, "whole float4 loads per thread");
  const int q4 = d.dk / 4, r0 = 2 * ty;
  float4 wn[kLoads], kn[kLoads];
  float un[2][4], eln = 0.f;
  auto fetch = [&](int ci) {
    const int64_t P = sc.pair(base + ci, hp);
    const int L = min(C, len - ci * C);
    const float4* Wg = reinterpret_cast<const float4*>(sc.W + P * C * d.dk);
    const float4* Kg = reinterpret_cast<const float4*>(sc.Kl + P * C * d.dk);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = threadIdx.x + u * kThreads;
      if (e < L * q4) {
        wn[u] = Wg[e];
        kn[u] = Kg[e];
      }
    }
    const float* Ug = sc.U + P * C * d.dv;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int r = r0 + m, j = j0 + jj0 + n;
        un[m][n] = (r < L && j < d.dv) ? Ug[r * d.dv + j] : 0.f;
      }
    eln = sc.eL[P];
  };
  fetch(0);
  for (int ci = 0; ci * C < len; ++ci) {
    const int64_t P = sc.pair(base + ci, hp);
    const int L = min(C, len - ci * C);
    float* Sc = sc.Sc + P * d.dk * d.dv;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int i = i0 + m, j = j0 + jj0 + n;
        if (i < d.dk) {
          S[i * kSlice + jj0 + n] = s[m][n];
          if (j < d.dv) Sc[int64_t(i) * d.dv + j] = s[m][n];
        }
      }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = threadIdx.x + u * kThreads;
      if (e < L * q4) {
        const int r = e / q4, i = 4 * (e % q4);
        *reinterpret_cast<float4*>(Ws + r * ldw + i) = wn[u];
        *reinterpret_cast<float4*>(Ks + 4 * e) = kn[u];
      }
    }
    float ucur[2][4];
    const float el = eln;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) ucur[m][n] = un[m][n];
    __syncthreads();
    if ((ci + 1) * C < len) fetch(ci + 1);
    // v_new = U - W S: rows 2ty, 2ty + 1, columns jj0..jj0+3.
    float acc[2][4] = {};
    if (r0 < L) {
      const int r1 = min(r0 + 1, L - 1);  // a row past L repeats the last (its result is not kept)
      for (int i = 0; i < d.dk; i += 4) {
        const float4 w0 = *reinterpret_cast<const float4*>(Ws + r0 * ldw + i);
        const float4 w1 = *reinterpret_cast<const float4*>(Ws + r1 * ldw + i);
        const float wa[4] = {w0.x, w0.y, w0.z, w0.w}, wb[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float4 sv = *reinterpret_cast<const float4*>(S + (i + k) * kSlice + jj0);
          const float sa[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            acc[0][n] += wa[k] * sa[n];
            acc[1][n] += wb[k] * sa[n];
          }
        }
      }
    }
    float* Ug = sc.U + P * C * d.dv;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int r = r0 + m, j = j0 + jj0 + n;
        float v = 0.f;
        if (r < L && j < d.dv) {
          v = ucur[m][n] - acc[m][n];
          Ug[r * d.dv + j] = v;
        }
        Vn[r * kSlice + jj0 + n] = v;
      }
    __syncthreads();
    // S' = e^{G_{L-1}} S + Kl^T v_new.
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) s[m][n] *= el;
    if (i0 < d.dk) {
      for (int r = 0; r < L; ++r) {
        outer4_add(s, *reinterpret_cast<const float4*>(Ks + r * d.dk + i0),
                   *reinterpret_cast<const float4*>(Vn + r * kSlice + jj0));
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int i = i0 + m, j = j0 + jj0 + n;
      if (i < d.dk && j < d.dv) Sg[int64_t(i) * d.dv + j] = s[m][n];
    }
}

// Block = (slot, head of the pass, 64 value columns): o = Qg Sc + M v_new for the chunk's rows, a 4x4 tile per
// thread, both products staged through shared tiles of 32 along the reduced dimension.
__global__ void __launch_bounds__(kThreads)
    gdn_chunk_output_kernel(const int32_t* __restrict__ cu, int num_seqs, GdnHeads d, int head0, ChunkScratch sc,
                            float* __restrict__ out, int64_t ld_out) {
  pdl_begin();
  constexpr int C = kChunk, KT = 32, NT = 64;
  __shared__ __align__(16) float As[KT][C + 4];
  __shared__ __align__(16) float Bs[KT][NT + 4];
  int seq, ci;
  if (!slot_chunk(cu, num_seqs, blockIdx.x, &seq, &ci)) return;
  const int hp = blockIdx.y, head = head0 + hp, j0 = blockIdx.z * NT;
  const int c0 = cu[seq] + ci * C, L = min(C, cu[seq + 1] - c0);
  const int64_t P = sc.pair(blockIdx.x, hp);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int phase = 0; phase < 2; ++phase) {
    const int K = phase == 0 ? d.dk : C;
    const float* Am = phase == 0 ? sc.Qg + P * C * d.dk : sc.M + P * C * C;  // [C][K]
    const float* Bm = phase == 0 ? sc.Sc + P * d.dk * d.dv : sc.U + P * C * d.dv;  // [K][dv]
    const int kend = phase == 0 ? K : L;  // M's columns past L are zero
    for (int k0 = 0; k0 < kend; k0 += KT) {
      for (int e = threadIdx.x; e < C * KT; e += kThreads) {
        const int r = e / KT, k = e % KT;
        As[k][r] = (r < L && k0 + k < K) ? Am[r * K + k0 + k] : 0.f;
      }
      for (int e = threadIdx.x; e < KT * NT; e += kThreads) {
        const int k = e / NT, c = e % NT;
        Bs[k][c] = (k0 + k < K && j0 + c < d.dv) ? Bm[int64_t(k0 + k) * d.dv + j0 + c] : 0.f;
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < KT; ++k) {
        outer4_add(acc, *reinterpret_cast<const float4*>(&As[k][4 * ty]),
                   *reinterpret_cast<const float4*>(&Bs[k][4 * tx]));
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int r = 4 * ty + m, j = j0 + 4 * tx + n;
      if (r < L && j < d.dv) out[int64_t(c0 + r) * ld_out + int64_t(head) * d.dv + j] = acc[m][n];
    }
}

// ---------------------------------------------------------------- the state walk on the tensor cores (SM80+)
// gdn_chunk_walk_mma_kernel replaces the state and output kernels where mma.sync exists, over the split scratch of
// gdn_chunk_prep_kernel<true>. The state is held transposed, S^T [value column][key dim], in mma.sync m16n8k16
// accumulators, so that it is the A operand of the products with it as it stands (an accumulator pair of n8 tiles is
// an A fragment of 16 k-slots), and so are the v_new^T products:
//   v_new^T = U^T - S^T W^T;   o^T = S^T Qg^T + v_new^T M^T;   S'^T = e^{G_{L-1}} S^T + v_new^T Kl
// FP16x2 products (hi·hi + hi·lo + lo·hi, float32 accumulation). S^T enters its products scaled by a power of two
// sigma that brings the warp's max |S| into [2^14, 2^15) (its FP16 halves cannot overflow and keep about 2^-22 of
// the largest element), v_new the same way (scaled up by at most 2^10, so that its products cannot overflow the state:
// entries of v_new below about 2^-34 are lost, which float32 FMAs keep), the staged operands times the kSplit*Scale
// of the prep kernel; every scale is taken out of the products again exactly. Accuracy: about 2^-22 of the largest
// element of the warp's operand (its 16 value columns of the state, or of v_new, in the chunk), where float32 FMAs
// keep 2^-24 of each element.
constexpr int kWalkThreads = 128;                  // 4 warps, 16 value columns each
constexpr int kWalkCols = 16 * kWalkThreads / 32;  // value columns per block
constexpr int kWalkTiles = kGdnMaxDk / 8;          // n8 tiles of a warp's S^T rows

constexpr int kWalkUPitch = kChunk + 8;  // floats per row of the staged U^T (no bank conflicts)

// Bytes of the walk's shared memory: the chunk's W, Qg, Kl [2][C][dk + 8] and M [2][C][C + 8] FP16 planes, and the
// block's rows of U^T [kWalkCols][kWalkUPitch] floats.
__host__ __device__ inline size_t walk_smem_bytes(int dk) {
  return sizeof(__half) * (size_t(6) * kChunk * (dk + 8) + size_t(2) * kChunk * (kChunk + 8)) +
         sizeof(float) * size_t(kWalkCols) * kWalkUPitch;
}

// sigma = 2^e with max_abs sigma in [2^14, 2^15), e at most max_e; 1 for a zero or non-finite max_abs.
__device__ __forceinline__ void pow2_scale(float max_abs, int max_e, float* sigma, float* inv_sigma) {
  int e2 = 0;
  if (max_abs > 0.f && max_abs < __int_as_float(0x7f800000)) {
    int ex = 0;
    (void)frexpf(max_abs, &ex);
    e2 = max(-126, min(max_e, 15 - ex));
  }
  *sigma = ldexpf(1.f, e2);
  *inv_sigma = ldexpf(1.f, -e2);
}

// The A fragment of the k-step over accumulator tiles t0 (k-slots 0-7) and t1 (8-15), each value times `scale`, as
// FP16x2 halves ah + al (a0 = t0 row g, a1 = t0 row g + 8, a2 = t1 row g, a3 = t1 row g + 8).
__device__ __forceinline__ void acc_to_a_f16x2(const float (&t0)[4], const float (&t1)[4], float scale,
                                               uint32_t (&ah)[4], uint32_t (&al)[4]) {
  const float v[8] = {t0[0], t0[1], t0[2], t0[3], t1[0], t1[1], t1[2], t1[3]};
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    __half h0, l0, h1, l1;
    split_f16x2(v[2 * p] * scale, &h0, &l0);
    split_f16x2(v[2 * p + 1] * scale, &h1, &l1);
    ah[p] = h2_bits(__halves2half2(h0, h1));
    al[p] = h2_bits(__halves2half2(l0, l1));
  }
}

// acc[2 p], acc[2 p + 1] += (A_hi + A_lo) (B_p,hi + B_p,lo) less lo·lo for the B pairs p0 <= p < N of one A (pair
// p: ldmatrix x4 of tile 2 p's b0, b1, then of tile 2 p + 1's). Each accumulator gets its three products in the order
// hi·hi, hi·lo, lo·hi, issued term by term over the pairs, so that 2 (N - p0) independent accumulations are in flight
// rather than one chain of three.
template <int N>
__device__ __forceinline__ void mma_pairs_f16x2(float (*acc)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                                const uint32_t (&bh)[N][4], const uint32_t (&bl)[N][4], int p0 = 0) {
#pragma unroll
  for (int term = 0; term < 3; ++term)
#pragma unroll
    for (int p = 0; p < N; ++p) {
      if (p < p0) continue;
      const uint32_t(&a)[4] = term == 2 ? al : ah;
      const uint32_t(&b)[4] = term == 1 ? bl[p] : bh[p];
      mma_m16n8k16(acc[2 * p], a[0], a[1], a[2], a[3], b[0], b[1]);
      mma_m16n8k16(acc[2 * p + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
    }
}

// Compile-time flag of the walk's product loops: true for a whole chunk (L = C) at dk = kGdnMaxDk. Then no tile is
// past the bounds, the shared pitches are constants (LDSM addresses one register plus immediates), and a k-step's
// B fragments are loaded at once and its products issued without branches, over up to 8 accumulators; otherwise
// the loops test the bounds a pair of tiles at a time.
template <bool B>
struct WalkFull {
  static constexpr bool value = B;
};
constexpr int kWalkPk = kGdnMaxDk + 8;  // the pitch of W, Qg and Kl at dk = kGdnMaxDk

// Block = (sequence, head of the pass, kWalkCols value columns); warp w the columns 16 w .. 16 w + 15 of them, lane
// (g, t) = (lane / 4, lane % 4) the accumulator rows ca = g and cb = g + 8. Walks the sequence's chunks in order: the
// chunk's W, Qg and the block's rows of U^T (one cp.async group) and Kl and M (another) are staged while the chunk
// before computes. Writes o for the chunk's rows and, after the last chunk, the state. dk a multiple of 16 and at
// most kGdnMaxDk.
__global__ void __launch_bounds__(kWalkThreads)
    gdn_chunk_walk_mma_kernel(float* __restrict__ state, const int32_t* __restrict__ slots,
                              const int32_t* __restrict__ cu, GdnHeads d, int head0, ChunkScratch sc,
                              float* __restrict__ out, int64_t ld_out) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_walk[];
  constexpr int C = kChunk;
  const int dk = d.dk, pk = dk + 8, pm = C + 8, nt = dk / 8;
  __half* Ws = reinterpret_cast<__half*>(smem_walk);  // [hi, lo][C][pk]
  __half* Qs = Ws + 2 * C * pk;
  __half* Ks = Qs + 2 * C * pk;
  __half* Ms = Ks + 2 * C * pk;                           // [hi, lo][C][pm]
  float* Us = reinterpret_cast<float*>(Ms + 2 * C * pm);  // [kWalkCols][kWalkUPitch]
  const int seq = blockIdx.x, hp = blockIdx.y, head = head0 + hp;
  const int start = cu[seq], len = cu[seq + 1] - start;
  if (len <= 0) return;
  const int base = chunk_slot_base(cu, seq);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, bm = lane >> 3;
  const int col0 = blockIdx.z * kWalkCols, ca = col0 + 16 * warp + g, cb = ca + 8;
  const bool va = ca < d.dv, vb = cb < d.dv;
  float* Sg = state + (int64_t(slots[seq]) * d.nv + head) * dk * d.dv;
  // S^T tile n (key dims 8n ..): [0] (ca, 8n + 2t), [1] (ca, 8n + 2t + 1), [2], [3] the same of cb.
  float s[kWalkTiles][4];
#pragma unroll
  for (int n = 0; n < kWalkTiles; ++n) {
    const int64_t i = 8 * n + 2 * t;
    const bool in = n < nt;
    s[n][0] = in && va ? Sg[i * d.dv + ca] : 0.f;
    s[n][1] = in && va ? Sg[(i + 1) * d.dv + ca] : 0.f;
    s[n][2] = in && vb ? Sg[i * d.dv + cb] : 0.f;
    s[n][3] = in && vb ? Sg[(i + 1) * d.dv + cb] : 0.f;
  }
  // The hi and lo planes [C][cols] of pair P's array into dst [2][C][pitch], 16 bytes a cp.async.
  auto stage = [&](float* region, int64_t P, __half* dst, int cols, int pitch) {
    const int64_t n = int64_t(C) * cols;
    const __half* src = hi_plane(region, P, n);
    const int per_row = cols / 8;
    for (int e = threadIdx.x; e < 2 * C * per_row; e += kWalkThreads) {
      const int plane = e / (C * per_row), r = (e / per_row) % C, c8 = 8 * (e % per_row);
      cp_async16(dst + (plane * C + r) * pitch + c8, src + plane * n + int64_t(r) * cols + c8, true);
    }
  };
  auto stage_wq = [&](int ci) {
    const int64_t P = sc.pair(base + ci, hp);
    stage(sc.W, P, Ws, dk, pk);
    stage(sc.Qg, P, Qs, dk, pk);
    const float* Ut = sc.U + P * C * d.dv;  // U^T [dv][C]; the block's rows, zeros past dv
    for (int e = threadIdx.x; e < kWalkCols * C / 4; e += kWalkThreads) {
      const int c = e / (C / 4), r4 = 4 * (e % (C / 4));
      const bool in = col0 + c < d.dv;
      cp_async16(Us + c * kWalkUPitch + r4, in ? Ut + int64_t(col0 + c) * C + r4 : Ut, in);
    }
    cp_async_commit();
  };
  auto stage_km = [&](int ci) {
    const int64_t P = sc.pair(base + ci, hp);
    stage(sc.Kl, P, Ks, dk, pk);
    stage(sc.M, P, Ms, C, pm);
    cp_async_commit();
  };
  stage_wq(0);
  stage_km(0);
  // Every wait below leaves one group pending: the groups alternate (W, Qg, U^T), (Kl, M), an empty one past the
  // last chunk.
  for (int ci = 0; ci * C < len; ++ci) {
    const int64_t P = sc.pair(base + ci, hp);
    const int L = min(C, len - ci * C), c0 = start + ci * C;
    const bool more = (ci + 1) * C < len;
    float pv[8][4], po[8][4];  // tile j: chunk rows 8j + 2t, 8j + 2t + 1 of ca, then of cb
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) pv[j][e] = po[j][e] = 0.f;
    const float el = sc.eL[P];
    float mx = 0.f;
#pragma unroll
    for (int n = 0; n < kWalkTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx = fmaxf(mx, fabsf(s[n][e]));
    float sig, isig;
    pow2_scale(warp_max(mx), 126, &sig, &isig);
    const bool full = L == C && nt == kWalkTiles;  // WalkFull
    const int nj = (L + 15) / 16;                  // pairs of n8 tiles of chunk rows up to L (the rows past are zero)
    // acc[j] += (S^T sigma) B^T for the staged rows B [C][pk] of W (which 0) or Qg (1): k-steps over the key dims.
    auto s_times = [&](int which, float(&acc)[8][4], auto full_tag) {
      constexpr bool F = decltype(full_tag)::value;
      constexpr int G = F ? 4 : 1;  // pairs of tiles per batch
      const int pkk = F ? kWalkPk : pk;
      const __half* Bs = Ws + which * 2 * C * pkk;
#pragma unroll
      for (int k = 0; k < kWalkTiles / 2; ++k) {
        if (!F && 2 * k >= nt) break;
        uint32_t ah[4], al[4];
        acc_to_a_f16x2(s[2 * k], s[2 * k + 1], sig, ah, al);
#pragma unroll
        for (int j0 = 0; j0 < 4; j0 += G) {
          if (!F && j0 >= nj) break;
          uint32_t bh[G][4], bl[G][4];
#pragma unroll
          for (int p = 0; p < G; ++p) {
            const int off = (16 * (j0 + p) + 8 * (bm >> 1) + (lane & 7)) * pkk + 16 * k + 8 * (bm & 1);
            ldmatrix_x4(bh[p], Bs + off);
            ldmatrix_x4(bl[p], Bs + C * pkk + off);
          }
          mma_pairs_f16x2<G>(acc + 2 * j0, ah, al, bh, bl);
        }
      }
    };
    cp_async_wait<1>();
    __syncthreads();  // W, Qg and U^T of this chunk are in
    if (full)
      s_times(0, pv, WalkFull<true>{});
    else
      s_times(0, pv, WalkFull<false>{});
    const int ua = (16 * warp + g) * kWalkUPitch, ub = ua + 8 * kWalkUPitch;
    const float iw = isig * (1.f / kSplitKwScale);
    mx = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // v_new^T = U^T - P_v / (sigma kSplitKwScale)
      const float2 a = *reinterpret_cast<const float2*>(Us + ua + 8 * j + 2 * t);
      const float2 b = *reinterpret_cast<const float2*>(Us + ub + 8 * j + 2 * t);
      pv[j][0] = a.x - pv[j][0] * iw;
      pv[j][1] = a.y - pv[j][1] * iw;
      pv[j][2] = b.x - pv[j][2] * iw;
      pv[j][3] = b.y - pv[j][3] * iw;
#pragma unroll
      for (int e = 0; e < 4; ++e) mx = fmaxf(mx, fabsf(pv[j][e]));
    }
    float sv, isv;
    pow2_scale(warp_max(mx), 10, &sv, &isv);
    uint32_t vh[4][4], vl[4][4];  // A fragments of v_new^T sv, k-steps over the chunk rows
#pragma unroll
    for (int k = 0; k < 4; ++k) acc_to_a_f16x2(pv[2 * k], pv[2 * k + 1], sv, vh[k], vl[k]);
    if (full)
      s_times(1, po, WalkFull<true>{});
    else
      s_times(1, po, WalkFull<false>{});
    __syncthreads();  // every warp is done with W, Qg and U^T
    if (more)
      stage_wq(ci + 1);
    else
      cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // Kl and M of this chunk are in
    // o^T sv kSplitMScale = (S^T Qg^T) sv kSplitMScale + (v_new^T sv) (M^T kSplitMScale); B from M's rows.
    const float om = isig * (1.f / kSplitQgScale) * sv * kSplitMScale;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) po[j][e] *= om;
    // k-steps over the chunk rows c (16 k ..), each over the pairs of output rows r (16 jp ..) from jp = k: the
    // tiles with every c > r (jp < k) are zero, M being lower triangular.
    auto m_update = [&](auto full_tag) {
      constexpr bool F = decltype(full_tag)::value;
      const __half* Mb = Ws + 6 * C * (F ? kWalkPk : pk);  // Ms
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!F && k >= nj) break;
        if constexpr (F) {
          uint32_t bh[4][4], bl[4][4];
#pragma unroll
          for (int jp = k; jp < 4; ++jp) {
            const int off = (16 * jp + 8 * (bm >> 1) + (lane & 7)) * pm + 16 * k + 8 * (bm & 1);
            ldmatrix_x4(bh[jp], Mb + off);
            ldmatrix_x4(bl[jp], Mb + C * pm + off);
          }
          mma_pairs_f16x2<4>(po, vh[k], vl[k], bh, bl, k);
        } else {
#pragma unroll
          for (int jp = k; jp < 4; ++jp) {
            if (jp >= nj) break;  // output rows past L are not written
            const int off = (16 * jp + 8 * (bm >> 1) + (lane & 7)) * pm + 16 * k + 8 * (bm & 1);
            uint32_t bh[1][4], bl[1][4];
            ldmatrix_x4(bh[0], Mb + off);
            ldmatrix_x4(bl[0], Mb + C * pm + off);
            mma_pairs_f16x2<1>(po + 2 * jp, vh[k], vl[k], bh, bl);
          }
        }
      }
    };
    if (full)
      m_update(WalkFull<true>{});
    else
      m_update(WalkFull<false>{});
    float* orow = out + int64_t(c0) * ld_out + int64_t(head) * d.dv;
    const float io = isv * (1.f / kSplitMScale);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = 8 * j + 2 * t;
      if (r < L) {
        if (va) orow[int64_t(r) * ld_out + ca] = po[j][0] * io;
        if (vb) orow[int64_t(r) * ld_out + cb] = po[j][2] * io;
      }
      if (r + 1 < L) {
        if (va) orow[int64_t(r + 1) * ld_out + ca] = po[j][1] * io;
        if (vb) orow[int64_t(r + 1) * ld_out + cb] = po[j][3] * io;
      }
    }
    // S^T sv kSplitKwScale = e^{G_{L-1}} S^T sv kSplitKwScale + (v_new^T sv) (Kl kSplitKwScale); B from Kl's rows
    // transposed (k = chunk row, n = key dim).
    const float es = el * sv * kSplitKwScale;
#pragma unroll
    for (int n = 0; n < kWalkTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= es;
    // k-steps over the chunk rows, each over the pairs of key-dim tiles (four at a time).
    auto kl_update = [&](auto full_tag) {
      constexpr bool F = decltype(full_tag)::value;
      constexpr int G = F ? 4 : 1;
      const int pkk = F ? kWalkPk : pk;
      const __half* Kb = Ws + 4 * C * pkk;  // Ks
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!F && k >= nj) break;  // v_new's rows past L are zero
#pragma unroll
        for (int n0 = 0; n0 < kWalkTiles / 2; n0 += G) {
          if (!F && 2 * n0 >= nt) break;
          uint32_t bh[G][4], bl[G][4];
#pragma unroll
          for (int p = 0; p < G; ++p) {
            const int off = (16 * k + 8 * (bm & 1) + (lane & 7)) * pkk + 16 * (n0 + p) + 8 * (bm >> 1);
            ldmatrix_x4<true>(bh[p], Kb + off);
            ldmatrix_x4<true>(bl[p], Kb + C * pkk + off);
          }
          mma_pairs_f16x2<G>(s + 2 * n0, vh[k], vl[k], bh, bl);
        }
      }
    };
    if (full)
      kl_update(WalkFull<true>{});
    else
      kl_update(WalkFull<false>{});
#pragma unroll
    for (int n = 0; n < kWalkTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= isv * (1.f / kSplitKwScale);
    __syncthreads();  // every warp is done with Kl and M
    if (more)
      stage_km(ci + 1);
    else
      cp_async_commit();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int n = 0; n < kWalkTiles; ++n) {
    if (n >= nt) break;
    const int64_t i = 8 * n + 2 * t;
    if (va) {
      Sg[i * d.dv + ca] = s[n][0];
      Sg[(i + 1) * d.dv + ca] = s[n][1];
    }
    if (vb) {
      Sg[i * d.dv + cb] = s[n][2];
      Sg[(i + 1) * d.dv + cb] = s[n][3];
    }
  }
#endif
}

// Both activation types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_GDN_INSTANTIATE(T, FOLD)                                                                                    \
  template __global__ void gdn_recurrent_kernel<T, FOLD>(const T*, int64_t, const T*, const T*, int64_t, const float*, \
                                                         const float*, float*, const int32_t*, const int32_t*,         \
                                                         GdnHeads, T*, int64_t, GdnConvIn, GdnOutNorm);
FN_GDN_INSTANTIATE(float, false)
FN_GDN_INSTANTIATE(float, true)
#undef FN_GDN_INSTANTIATE
// Both scratch forms of the chunk preparation (the launcher's choice is fenced off under NVRTC).
#define FN_GDN_PREP_INSTANTIATE(SPLIT)                                                                              \
  template __global__ void gdn_chunk_prep_kernel<SPLIT>(const float*, int64_t, const float*, const float*, int64_t, \
                                                        const float*, const float*, const int32_t*, int, GdnHeads,  \
                                                        int, ChunkScratch);
FN_GDN_PREP_INSTANTIATE(false)
FN_GDN_PREP_INSTANTIATE(true)
#undef FN_GDN_PREP_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)

cudaError_t launch_gdn_recurrent(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                 const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                 const int32_t* seq_starts, int num_seqs, GdnHeads dims, float* out, int64_t ld_out,
                                 const GdnConvIn& conv, const GdnOutNorm& norm, cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  const unsigned blocks = unsigned(num_seqs) * dims.nv * ((dims.dv + 31) / 32);
  if (conv.w && (conv.K < 1 || conv.K > kGdnFoldedConvMaxTaps)) return cudaErrorInvalidValue;
  launch(conv.w ? gdn_recurrent_kernel<float, true> : gdn_recurrent_kernel<float, false>, blocks, kThreads, 0, stream,
         qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, seq_starts, dims, out, ld_out, conv, norm);
  return cudaGetLastError();
}

int gdn_recurrent_folded_resident_blocks() {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gdn_recurrent_kernel<float, true>, kThreads, 0);
  return e == cudaSuccess ? sms * per_sm : 0;  // these queries' errors are not sticky and are returned, not kept
}

namespace {
// Scratch floats per (slot, head): W, Kl, Qg, U, M, eL, and Sc but for the tensor-core walk (ChunkScratch).
int64_t chunk_pair_floats(GdnHeads d, bool tensor_cores) {
  return int64_t(kChunk) * (3 * d.dk + d.dv) + int64_t(kChunk) * kChunk + 1 + (tensor_cores ? 0 : int64_t(d.dk) * d.dv);
}
int64_t chunk_slots(int num_seqs, int64_t rows) { return num_seqs + rows / kChunk + 1; }
}  // namespace

bool gdn_chunked_tensor_cores_supported(GdnHeads dims) {
  if (dims.dk % 16 != 0 || dims.dk > kGdnMaxDk) return false;
  if (kernel_ptx_version(reinterpret_cast<const void*>(gdn_chunk_walk_mma_kernel)) < 80) return false;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // a failed query means the float32 kernels, not an error left for their launch check
    return false;
  }
  return walk_smem_bytes(dims.dk) <= size_t(optin);
}

int gdn_chunked_heads_per_pass(int num_seqs, int64_t rows, GdnHeads dims, bool tensor_cores,
                               int64_t max_scratch_floats) {
  const int64_t per_head = chunk_slots(num_seqs, rows) * chunk_pair_floats(dims, tensor_cores);
  return int(std::max<int64_t>(1, std::min<int64_t>(dims.nv, max_scratch_floats / per_head)));
}

int64_t gdn_chunked_scratch_floats(int num_seqs, int64_t rows, GdnHeads dims, bool tensor_cores, int heads_per_pass) {
  return chunk_slots(num_seqs, rows) * chunk_pair_floats(dims, tensor_cores) * heads_per_pass;
}

cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu, int num_seqs, int64_t rows, GdnHeads dims, bool tensor_cores,
                                       int heads_per_pass, float* scratch, float* out, int64_t ld_out,
                                       cudaStream_t stream) {
  if (num_seqs == 0 || rows == 0) return cudaSuccess;
  if (tensor_cores && !gdn_chunked_tensor_cores_supported(dims)) return cudaErrorInvalidValue;
  const int64_t nslots = chunk_slots(num_seqs, rows);
  const int hp = heads_per_pass;
  ChunkScratch sc{};
  sc.heads = hp;
  const int64_t pairs = nslots * hp;
  float* p = scratch;
  sc.W = p, p += pairs * kChunk * dims.dk;
  sc.Kl = p, p += pairs * kChunk * dims.dk;
  sc.Qg = p, p += pairs * kChunk * dims.dk;
  sc.U = p, p += pairs * kChunk * dims.dv;
  sc.M = p, p += pairs * kChunk * kChunk;
  if (!tensor_cores) sc.Sc = p, p += pairs * dims.dk * dims.dv;
  sc.eL = p;
  const size_t prep_smem = sizeof(float) * size_t(prep_smem_floats(dims.dk));
  const size_t walk_smem = tensor_cores ? walk_smem_bytes(dims.dk) : sizeof(float) * StateSmem::floats(dims.dk);
  auto prep = tensor_cores ? gdn_chunk_prep_kernel<true> : gdn_chunk_prep_kernel<false>;
  auto walk = tensor_cores ? reinterpret_cast<const void*>(gdn_chunk_walk_mma_kernel)
                           : reinterpret_cast<const void*>(gdn_chunk_state_kernel);
  cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(prep), prep_smem);
  if (err == cudaSuccess) err = ensure_dynamic_smem(walk, walk_smem);
  if (err != cudaSuccess) return err;
  for (int h0 = 0; h0 < dims.nv; h0 += hp) {
    sc.heads = std::min(hp, dims.nv - h0);
    launch(prep, dim3(unsigned(nslots), unsigned(sc.heads)), kThreads, prep_smem, stream, qkv, ld_qkv, a, b, ld_ab,
           a_log, dt_bias, cu, num_seqs, dims, h0, sc);
    if (tensor_cores) {
      launch(gdn_chunk_walk_mma_kernel,
             dim3(unsigned(num_seqs), unsigned(sc.heads), unsigned((dims.dv + kWalkCols - 1) / kWalkCols)),
             kWalkThreads, walk_smem, stream, state, slots, cu, dims, h0, sc, out, ld_out);
    } else {
      launch(gdn_chunk_state_kernel,
             dim3(unsigned(num_seqs), unsigned(sc.heads), unsigned((dims.dv + kSlice - 1) / kSlice)), kThreads,
             walk_smem, stream, state, slots, cu, dims, h0, sc);
      launch(gdn_chunk_output_kernel, dim3(unsigned(nslots), unsigned(sc.heads), unsigned((dims.dv + 63) / 64)),
             kThreads, 0, stream, cu, num_seqs, dims, h0, sc, out, ld_out);
    }
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}
#endif

}  // namespace flashnext::cuda::detail
