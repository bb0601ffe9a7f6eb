// QSA (gated attention with indexer-selected tokens) kernels: MODEL.md "QSA attention layer" and "Indexer";
// reference Qwen4ExpTextQSAIndexer / Qwen4ExpTextAttention. Paged caches, logical positions everywhere (blocks are
// formed from logical positions, never physical slots), FP16 storage, FP32 scores and softmax. Every cache index
// goes through the block table and is bounds-checked: a bad one sets a bit in the status word and is skipped.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;  // selected tokens per attention tile; pooled blocks per scores block

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

// Writes K, V [kv_heads, dim] and the raw indexer key [idx_dim] of each new token at its logical position.
__global__ void qsa_cache_append_kernel(const __half* __restrict__ k, int64_t ldk, const __half* __restrict__ v,
                                        int64_t ldv, const __half* __restrict__ ki, int64_t ldki,
                                        const int32_t* __restrict__ tok_seq, const int32_t* __restrict__ tok_pos,
                                        QsaPaging pg, __half* k_cache, __half* v_cache, __half* ki_cache, int kv_heads,
                                        int dim, int idx_dim, int32_t* status) {
  const int t = blockIdx.x;
  const int64_t row = phys_token(pg, tok_seq[t], tok_pos[t], status);
  if (row < 0) return;
  const int kvw = kv_heads * dim;
  for (int e = threadIdx.x; e < kvw; e += kThreads) {
    k_cache[row * kvw + e] = k[int64_t(t) * ldk + e];
    v_cache[row * kvw + e] = v[int64_t(t) * ldv + e];
  }
  for (int e = threadIdx.x; e < idx_dim; e += kThreads) ki_cache[row * idx_dim + e] = ki[int64_t(t) * ldki + e];
}

// For each token that completes an indexer block (position p with (p+1) % c == 0), the pooled block key
// RoPE(ZC-RMSNorm(fp16(mean of the block's c raw keys)), position c*j), FP16, into the pooled cache. One warp per
// token. The reference rounds the mean and the normalised key to the model dtype; so does this kernel.
__global__ void qsa_pool_kernel(const int32_t* __restrict__ tok_seq, const int32_t* __restrict__ tok_pos, int tokens,
                                QsaPaging pg, const __half* __restrict__ ki_cache, __half* pooled,
                                const __half* __restrict__ w, int idx_dim, int block, int rotary_dims, float theta,
                                float eps, int32_t* status) {
  __shared__ float buf[kWarps][kQsaMaxIdxDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= tokens) return;
  const int p = tok_pos[t], seq = tok_seq[t];
  if (p < 0 || (p + 1) % block != 0) return;
  const int start = p + 1 - block;
  int64_t rows[kQsaMaxBlock];
  for (int r = 0; r < block; ++r) {
    rows[r] = phys_token(pg, seq, start + r, status);
    if (rows[r] < 0) return;
  }
  float ss = 0.f;
  for (int d = lane; d < idx_dim; d += 32) {
    float m = 0.f;
    for (int r = 0; r < block; ++r) m += to_f(ki_cache[rows[r] * idx_dim + d]);
    m = to_f(to_h(m / float(block)));
    buf[warp][d] = m;
    ss += m * m;
  }
  const float rs = rsqrtf(warp_sum(ss) / float(idx_dim) + eps);
  __syncwarp();
  for (int d = lane; d < idx_dim; d += 32) buf[warp][d] = to_f(to_h(buf[warp][d] * rs * (1.f + to_f(w[d]))));
  __syncwarp();
  const int64_t prow = rows[0];
  const int64_t page = prow / pg.page_size, off = prow % pg.page_size;
  __half* out = pooled + (page * (pg.page_size / block) + off / block) * idx_dim;
  const int half_r = rotary_dims / 2;
  for (int d = lane; d < idx_dim; d += 32) {
    float val = buf[warp][d];
    if (d < rotary_dims) {
      const int i = d < half_r ? d : d - half_r;
      float c, s;
      rope_cos_sin(i, rotary_dims, theta, start, &c, &s);
      val = d < half_r ? buf[warp][d] * c - buf[warp][d + half_r] * s : buf[warp][d] * c + buf[warp][d - half_r] * s;
    }
    out[d] = to_h(val);
  }
}

// scores[t, j] = sum_h relu(qi[t, h] · key_j) / sqrt(Di) for the complete blocks j < (p+1)/c visible to token t.
// Block = (qpb consecutive query tokens, a tile of kt block keys): the key tile of each sequence among the
// block's queries is loaded once into shared memory (a prefill chunk's queries share it) and every thread computes
// one key's scores for a subset of the queries, all heads.
__global__ void __launch_bounds__(kThreads)
    qsa_block_scores_kernel(const __half* __restrict__ qi, int64_t ldq, const int32_t* __restrict__ tok_seq,
                            const int32_t* __restrict__ tok_pos, int tokens, QsaPaging pg,
                            const __half* __restrict__ pooled, int idx_heads, int idx_dim, int block, int kt, int qpb,
                            float* __restrict__ scores, int64_t lds, int32_t* status) {
  extern __shared__ float smem[];
  __shared__ int q_seq[kThreads], q_nb[kThreads];
  float* qs = smem;                                                          // [qpb][heads][Di]
  __half2* ks = reinterpret_cast<__half2*>(qs + qpb * idx_heads * idx_dim);  // [kt][Di/2 + 1]
  const int kld = idx_dim / 2 + 1;
  const int t0 = blockIdx.x * qpb, nq = min(qpb, tokens - t0);
  const int j0 = blockIdx.y * kt;
  for (int q = threadIdx.x; q < qpb; q += kThreads) {
    const int p = q < nq ? tok_pos[t0 + q] : -1;
    q_seq[q] = q < nq ? tok_seq[t0 + q] : -1;
    q_nb[q] = p < 0 ? 0 : (p + 1) / block;
  }
  for (int e = threadIdx.x; e < nq * idx_heads * idx_dim; e += kThreads) {
    const int q = e / (idx_heads * idx_dim), r = e % (idx_heads * idx_dim);
    qs[e] = to_f(qi[int64_t(t0 + q) * ldq + r]);
  }
  __syncthreads();
  const float inv = rsqrtf(float(idx_dim));
  const int j = threadIdx.x % kt, qg = threadIdx.x / kt, groups = kThreads / kt;
  uint32_t done = 0;  // queries whose sequence's tile was handled (qpb <= 32)
  for (;;) {
    int first = -1;
    for (int q = 0; q < nq; ++q)
      if (!(done >> q & 1u)) {
        first = q;
        break;
      }
    if (first < 0) break;
    const int seq = q_seq[first];
    int jmax = 0;
    for (int q = 0; q < nq; ++q)
      if (q_seq[q] == seq) {
        jmax = max(jmax, q_nb[q]);
        done |= 1u << q;
      }
    const int j1 = min(jmax, j0 + kt);
    if (j1 <= j0) continue;
    __syncthreads();  // the previous tile's readers are done
    for (int e = threadIdx.x; e < (j1 - j0) * (idx_dim / 2); e += kThreads) {
      const int r = e / (idx_dim / 2), c = e % (idx_dim / 2);
      const int64_t row = phys_token(pg, seq, (j0 + r) * block, c == 0 ? status : nullptr);
      __half2 v = __floats2half2_rn(0.f, 0.f);
      if (row >= 0) {
        const int64_t page = row / pg.page_size, off = row % pg.page_size;
        v = reinterpret_cast<const __half2*>(pooled + (page * (pg.page_size / block) + off / block) * idx_dim)[c];
      }
      ks[r * kld + c] = v;
    }
    __syncthreads();
    if (j0 + j < j1) {
      for (int q = qg; q < nq; q += groups) {
        if (q_seq[q] != seq || j0 + j >= q_nb[q]) continue;
        float acc = 0.f;
        for (int h = 0; h < idx_heads; ++h) {
          const float* qv = qs + (q * idx_heads + h) * idx_dim;
          float dot = 0.f;
          for (int c = 0; c < idx_dim / 2; ++c) {
            const float2 kv = __half22float2(ks[j * kld + c]);
            dot += qv[2 * c] * kv.x + qv[2 * c + 1] * kv.y;
          }
          acc += fmaxf(dot, 0.f);
        }
        scores[int64_t(t0 + q) * lds + j0 + j] = acc * inv;
      }
    }
  }
}

// Exclusive prefix sum over the block (kThreads threads); *total gets the block's sum. Uses `sh` (kWarps + 1 ints).
__device__ __forceinline__ int block_exclusive_scan(int v, int* total, int* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = sh[w];
      sh[w] = run;
      run += c;
    }
    sh[kWarps] = run;
  }
  __syncthreads();
  *total = sh[kWarps];
  return sh[warp] + x - v;
}

// Per query token: the top min(top_blocks, nb) blocks by (higher score, then lower block index), expanded to their
// tokens in increasing position, then the tail tokens c*nb .. p. selected[t, 0 .. counts[t]) are logical positions.
__global__ void qsa_select_kernel(const float* __restrict__ scores, int64_t lds, const int32_t* __restrict__ tok_pos,
                                  int block, int top_blocks, int32_t* __restrict__ selected, int64_t ld_sel,
                                  int32_t* __restrict__ counts) {
  __shared__ int hist[256];
  __shared__ int sh[kWarps + 1];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  const int t = blockIdx.x;
  const int p = tok_pos[t];
  const int nb = p < 0 ? 0 : (p + 1) / block;
  const int k = min(top_blocks, nb);
  int32_t* out = selected + int64_t(t) * ld_sel;
  const float* sc = scores + int64_t(t) * lds;
  if (k == nb) {  // every complete block is selected: all positions 0..p
    for (int i = threadIdx.x; i <= p; i += kThreads) out[i] = i;
    if (threadIdx.x == 0) counts[t] = p + 1;
    return;
  }
  // Radix select of the k-th largest order key, 8 bits per pass.
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int j0 = 0; j0 < nb; j0 += kThreads) {  // one shared atomic per distinct digit of a warp
      const int j = j0 + threadIdx.x;
      const uint32_t key = j < nb ? float_order_key(sc[j]) : 0u;
      const bool in = j < nb && (key & mask) == prefix;
      const unsigned active = __ballot_sync(0xffffffffu, in);
      if (in) {
        const uint32_t digit = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(active, digit);
        if (int(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, b = 255;
      for (; b > 0; --b) {
        if (cum + hist[b] >= remaining) break;
        cum += hist[b];
      }
      s_prefix = prefix | (uint32_t(b) << shift);
      s_remaining = remaining - cum;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t tau = prefix;  // key of the k-th largest; take `remaining` of the keys equal to it, lowest first
  int eq_base = 0, sel_base = 0;
  for (int j0 = 0; j0 < nb; j0 += kThreads) {
    const int j = j0 + threadIdx.x;
    const uint32_t key = j < nb ? float_order_key(sc[j]) : 0u;
    const bool gt = j < nb && key > tau, eq = j < nb && key == tau;
    int eq_total, sel_total;
    const int eq_rank = block_exclusive_scan(eq ? 1 : 0, &eq_total, sh);
    const bool sel = gt || (eq && eq_base + eq_rank < remaining);
    const int rank = block_exclusive_scan(sel ? 1 : 0, &sel_total, sh);
    if (sel)
      for (int r = 0; r < block; ++r) out[int64_t(sel_base + rank) * block + r] = j * block + r;
    eq_base += eq_total;
    sel_base += sel_total;
  }
  const int tail = p + 1 - nb * block;
  for (int i = threadIdx.x; i < tail; i += kThreads) out[int64_t(k) * block + i] = nb * block + i;
  if (threadIdx.x == 0) counts[t] = k * block + tail;
}

// Sparse attention over the selected tokens. Block = (query token, KV head g, split of the selected list); the
// group's G = heads/kv_heads query heads share each K/V row read. Online softmax over tiles of kTile tokens.
// splits == 1: writes o * sigmoid(gate) as T; otherwise (m, l, acc[dim]) partials for qsa_combine_kernel.
// T: the type of q, the caches, the gate and the output (FP16, or FP32 for the ops interface).
template <class T>
__global__ void __launch_bounds__(kThreads)
    qsa_attention_kernel(const T* __restrict__ q, int64_t ldq, const int32_t* __restrict__ tok_seq,
                         const int32_t* __restrict__ tok_pos, const int32_t* __restrict__ selected, int64_t ld_sel,
                         const int32_t* __restrict__ counts, QsaPaging pg, const T* __restrict__ k_cache,
                         const T* __restrict__ v_cache, int heads, int kv_heads, int dim, int splits, int split_len,
                         const T* __restrict__ gate, int64_t ld_gate, int64_t gate_hs, float* __restrict__ partial,
                         T* __restrict__ out, int64_t ldo, int32_t* status) {
  __shared__ float qs[kQsaMaxGroup * kQsaMaxDim];
  __shared__ float s[kQsaMaxGroup][kTile];
  __shared__ int64_t rows[kTile];
  __shared__ float m_s[kQsaMaxGroup], l_s[kQsaMaxGroup], corr_s[kQsaMaxGroup];
  const int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int G = heads / kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int seq = tok_seq[t], p = tok_pos[t];
  const int cnt = counts[t];
  const int begin = split * split_len, end = min(cnt, begin + split_len);
  if (split == splits - 1 && g == 0 && threadIdx.x == 0 && cnt > splits * split_len) flag(status, kQsaCountOverflow);
  const float scale = rsqrtf(float(dim));
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int e = threadIdx.x; e < G * dim; e += kThreads)
    qs[e] = to_f(q[int64_t(t) * ldq + int64_t(g) * G * dim + e]) * scale;
  if (threadIdx.x < G) {
    m_s[threadIdx.x] = neg_inf;
    l_s[threadIdx.x] = 0.f;
  }
  float acc[kQsaMaxGroup];
#pragma unroll
  for (int h = 0; h < kQsaMaxGroup; ++h) acc[h] = 0.f;
  const int dd = threadIdx.x;
  const int64_t kvw = int64_t(kv_heads) * dim;
  __syncthreads();
  for (int tb = begin; tb < end; tb += kTile) {
    const int n = min(kTile, end - tb);
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const int pos = selected[int64_t(t) * ld_sel + tb + i];
      int64_t row = -1;
      if (pos > p)
        flag(status, kQsaBadPosition);  // a selected key after the query: never follow it
      else
        row = phys_token(pg, seq, pos, status);
      rows[i] = row;
    }
    __syncthreads();
    for (int i = warp; i < n; i += kWarps) {
      const int64_t row = rows[i];
      float kreg[kQsaMaxDim / 32];
#pragma unroll
      for (int m = 0; m < kQsaMaxDim / 32; ++m) {
        const int d = lane + 32 * m;
        kreg[m] = (row >= 0 && d < dim) ? to_f(k_cache[row * kvw + int64_t(g) * dim + d]) : 0.f;
      }
      for (int h = 0; h < G; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int m = 0; m < kQsaMaxDim / 32; ++m) {
          const int d = lane + 32 * m;
          if (d < dim) dot += qs[h * dim + d] * kreg[m];
        }
        dot = warp_sum(dot);
        if (lane == 0) s[h][i] = row >= 0 ? dot : neg_inf;
      }
    }
    __syncthreads();
    for (int h = warp; h < G; h += kWarps) {
      float mx = neg_inf;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, s[h][i]);
      mx = warp_max(mx);
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int i = lane; i < n; i += 32) {
        const float e = m_new == neg_inf ? 0.f : expf(s[h][i] - m_new);
        s[h][i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = m_old == neg_inf ? (m_new == neg_inf ? 1.f : 0.f) : expf(m_old - m_new);
        corr_s[h] = corr;
        l_s[h] = l_s[h] * corr + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();
    if (dd < dim) {
      for (int h = 0; h < G; ++h) acc[h] *= corr_s[h];
      for (int i = 0; i < n; ++i) {
        const int64_t row = rows[i];
        const float v = row >= 0 ? to_f(v_cache[row * kvw + int64_t(g) * dim + dd]) : 0.f;
#pragma unroll
        for (int h = 0; h < kQsaMaxGroup; ++h)
          if (h < G) acc[h] += s[h][i] * v;
      }
    }
    __syncthreads();
  }
  if (dd >= dim) return;
  for (int h = 0; h < G; ++h) {
    const int hq = g * G + h;
    if (splits == 1) {
      float o = l_s[h] > 0.f ? acc[h] / l_s[h] : 0.f;
      if (gate) o *= sigmoidf_(to_f(gate[int64_t(t) * ld_gate + int64_t(hq) * gate_hs + dd]));
      out[int64_t(t) * ldo + int64_t(hq) * dim + dd] = from_f<T>(o);
    } else {
      float* pp = partial + ((int64_t(t) * heads + hq) * splits + split) * (dim + 2);
      if (dd == 0) {
        pp[0] = m_s[h];
        pp[1] = l_s[h];
      }
      pp[2 + dd] = acc[h];
    }
  }
}

// Merges the split partials of each (token, head) and applies the output gate.
template <class T>
__global__ void qsa_combine_kernel(const float* __restrict__ partial, int heads, int dim, int splits,
                                   const T* __restrict__ gate, int64_t ld_gate, int64_t gate_hs, T* __restrict__ out,
                                   int64_t ldo) {
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

// Both activation types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_QSA_INSTANTIATE(T)                                                                                          \
  template __global__ void qsa_attention_kernel<T>(                                                                    \
      const T*, int64_t, const int32_t*, const int32_t*, const int32_t*, int64_t, const int32_t*, QsaPaging, const T*, \
      const T*, int, int, int, int, int, const T*, int64_t, int64_t, float*, T*, int64_t, int32_t*);                   \
  template __global__ void qsa_combine_kernel<T>(const float*, int, int, int, const T*, int64_t, int64_t, T*, int64_t);
FN_QSA_INSTANTIATE(__half)
FN_QSA_INSTANTIATE(float)
#undef FN_QSA_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_qsa_cache_append(const __half* k, int64_t ldk, const __half* v, int64_t ldv, const __half* ki,
                                    int64_t ldki, const int32_t* tok_seq, const int32_t* tok_pos, int tokens,
                                    QsaPaging pg, __half* k_cache, __half* v_cache, __half* ki_cache, int kv_heads,
                                    int dim, int idx_dim, int32_t* status, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  qsa_cache_append_kernel<<<tokens, kThreads, 0, stream>>>(k, ldk, v, ldv, ki, ldki, tok_seq, tok_pos, pg, k_cache,
                                                           v_cache, ki_cache, kv_heads, dim, idx_dim, status);
  return cudaGetLastError();
}

cudaError_t launch_qsa_pool_blocks(const int32_t* tok_seq, const int32_t* tok_pos, int tokens, QsaPaging pg,
                                   const __half* ki_cache, __half* pooled_cache, const __half* k_norm_w, int idx_dim,
                                   int block, int rotary_dims, float theta, float eps, int32_t* status,
                                   cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  qsa_pool_kernel<<<(tokens + kWarps - 1) / kWarps, kThreads, 0, stream>>>(
      tok_seq, tok_pos, tokens, pg, ki_cache, pooled_cache, k_norm_w, idx_dim, block, rotary_dims, theta, eps, status);
  return cudaGetLastError();
}

cudaError_t launch_qsa_block_scores(const __half* qi, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                    int tokens, QsaPaging pg, const __half* pooled_cache, int idx_heads, int idx_dim,
                                    int block, int max_blocks, float* scores, int64_t lds, int32_t* status,
                                    cudaStream_t stream) {
  if (tokens == 0 || max_blocks == 0) return cudaSuccess;
  const int kt = idx_dim <= 128 ? 64 : 32;                                              // keys per tile
  const int fit = 4096 / (idx_heads * idx_dim), qpb = fit < 1 ? 1 : fit > 8 ? 8 : fit;  // queries per block
  const size_t smem = sizeof(float) * qpb * idx_heads * idx_dim + sizeof(__half2) * kt * (idx_dim / 2 + 1);
  dim3 grid((tokens + qpb - 1) / qpb, (max_blocks + kt - 1) / kt);
  qsa_block_scores_kernel<<<grid, kThreads, smem, stream>>>(qi, ldq, tok_seq, tok_pos, tokens, pg, pooled_cache,
                                                            idx_heads, idx_dim, block, kt, qpb, scores, lds, status);
  return cudaGetLastError();
}

cudaError_t launch_qsa_select(const float* scores, int64_t lds, const int32_t* tok_pos, int tokens, int block,
                              int top_blocks, int32_t* selected, int64_t ld_sel, int32_t* counts, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  qsa_select_kernel<<<tokens, kThreads, 0, stream>>>(scores, lds, tok_pos, block, top_blocks, selected, ld_sel, counts);
  return cudaGetLastError();
}

namespace {
template <class T>
cudaError_t qsa_attention_launch(const T* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const T* k_cache, const T* v_cache, int heads, int kv_heads, int dim,
                                 int splits, int split_len, const T* gate, int64_t ld_gate, int64_t gate_head_stride,
                                 float* partial, T* out, int64_t ldo, int32_t* status, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  dim3 grid(tokens, kv_heads, splits);
  qsa_attention_kernel<T><<<grid, kThreads, 0, stream>>>(q, ldq, tok_seq, tok_pos, selected, ld_sel, counts, pg,
                                                         k_cache, v_cache, heads, kv_heads, dim, splits, split_len,
                                                         gate, ld_gate, gate_head_stride, partial, out, ldo, status);
  if (splits > 1)
    qsa_combine_kernel<T><<<tokens * heads, kThreads, 0, stream>>>(partial, heads, dim, splits, gate, ld_gate,
                                                                   gate_head_stride, out, ldo);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_qsa_attention(const __half* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const __half* k_cache, const __half* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const __half* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, __half* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream) {
  return qsa_attention_launch(q, ldq, tok_seq, tok_pos, selected, ld_sel, counts, tokens, pg, k_cache, v_cache, heads,
                              kv_heads, dim, splits, split_len, gate, ld_gate, gate_head_stride, partial, out, ldo,
                              status, stream);
}
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream) {
  return qsa_attention_launch(q, ldq, tok_seq, tok_pos, selected, ld_sel, counts, tokens, pg, k_cache, v_cache, heads,
                              kv_heads, dim, splits, split_len, gate, ld_gate, gate_head_stride, partial, out, ldo,
                              status, stream);
}
#endif

}  // namespace flashnext::cuda::detail
