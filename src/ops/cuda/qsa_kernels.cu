// QSA sparse attention (gated attention over the indexer-selected tokens): MODEL.md "QSA attention layer";
// reference Qwen4ExpTextAttention. Paged caches, logical positions everywhere, FP32 scores and softmax (the
// indexer's kernels are in cuda_ops_kernels.cu). Every cache index
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

// The float32 activations of the ops interface (compiled by NVRTC too, for the SM70 check).
#define FN_QSA_INSTANTIATE(T)                                                                                          \
  template __global__ void qsa_attention_kernel<T>(                                                                    \
      const T*, int64_t, const int32_t*, const int32_t*, const int32_t*, int64_t, const int32_t*, QsaPaging, const T*, \
      const T*, int, int, int, int, int, const T*, int64_t, int64_t, float*, T*, int64_t, int32_t*);                   \
  template __global__ void qsa_combine_kernel<T>(const float*, int, int, int, const T*, int64_t, int64_t, T*, int64_t);
FN_QSA_INSTANTIATE(float)
#undef FN_QSA_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
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
