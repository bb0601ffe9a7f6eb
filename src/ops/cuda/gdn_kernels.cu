// Gated DeltaNet kernels (MODEL.md "Gated DeltaNet (linear attention) layer"; reference Qwen4ExpTextGatedDeltaNet,
// causal_conv1d_fn / causal_conv1d_update, torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule).
// The gated delta rule: the recurrence (decode) and the chunked form (prefill), FP32 activations and arithmetic,
// FP32 recurrent state [slot, nv, dk, dv] (the kernels are templated on the activation type; the ops interface
// instantiates FP32). The causal conv of the ops interface is in cuda_ops_kernels.cu. Only SM70 instructions
// (CUDA cores, shuffles, shared memory).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gdn_kernels.h"

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

// Recurrent step. Block = (sequence, value head, slice of 32 value columns); thread (warp w, lane l) owns column
// j = 32*slice + l and key rows i = w, w+8, ... of the state S [dk, dv].
template <class T>
__global__ void __launch_bounds__(kThreads)
    gdn_recurrent_kernel(const T* __restrict__ qkv, int64_t ld_qkv, const T* __restrict__ a, const T* __restrict__ bb,
                         int64_t ld_ab, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                         float* __restrict__ state, const int32_t* __restrict__ slots, GdnHeads d, T* __restrict__ out,
                         int64_t ld_out) {
  __shared__ float qs[kGdnMaxDk], ks[kGdnMaxDk];
  __shared__ float part[kThreads / 32][32];
  __shared__ float scratch[32];
  constexpr int kRows = kGdnMaxDk / (kThreads / 32);
  const int slices = (d.dv + 31) / 32;
  const int bidx = blockIdx.x / (d.nv * slices);
  const int head = (blockIdx.x / slices) % d.nv;
  const int slice = blockIdx.x % slices;
  const int kh = head / (d.nv / d.nk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* row = qkv + int64_t(bidx) * ld_qkv;
  float sq = 0.f, sk = 0.f;
  for (int i = threadIdx.x; i < d.dk; i += kThreads) {
    const float q = to_f(row[int64_t(kh) * d.dk + i]), k = to_f(row[int64_t(d.nk + kh) * d.dk + i]);
    qs[i] = q;
    ks[i] = k;
    sq += q * q;
    sk += k * k;
  }
  sq = block_sum(sq, scratch);
  sk = block_sum(sk, scratch);
  const float rq = rsqrtf(sq + 1e-6f) * rsqrtf(float(d.dk)), rk = rsqrtf(sk + 1e-6f);
  float beta, g;
  gdn_gates(a + int64_t(bidx) * ld_ab + head, bb + int64_t(bidx) * ld_ab + head, a_log, dt_bias, head, &beta, &g);
  const float decay = expf(g);
  const int j = slice * 32 + lane;
  const bool col = j < d.dv;
  float* S = state + (int64_t(slots[bidx]) * d.nv + head) * d.dk * d.dv;
  float s[kRows];
  float kv = 0.f;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = warp + m * (kThreads / 32);
    s[m] = (col && i < d.dk) ? S[int64_t(i) * d.dv + j] * decay : 0.f;
    if (i < d.dk) kv += s[m] * ks[i] * rk;
  }
  part[warp][lane] = kv;
  __syncthreads();
  kv = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) kv += part[w][lane];
  const float v = col ? to_f(row[int64_t(2 * d.nk * d.dk) + int64_t(head) * d.dv + j]) : 0.f;
  const float delta = beta * (v - kv);
  float o = 0.f;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = warp + m * (kThreads / 32);
    if (i < d.dk) {
      s[m] += ks[i] * rk * delta;
      o += s[m] * qs[i] * rq;
      if (col) S[int64_t(i) * d.dv + j] = s[m];
    }
  }
  __syncthreads();
  part[warp][lane] = o;
  __syncthreads();
  if (warp == 0 && col) {
    o = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) o += part[w][lane];
    out[int64_t(bidx) * ld_out + int64_t(head) * d.dv + j] = from_f<T>(o);
  }
}

// Chunked prefill (WY form, chunks of kGdnChunk tokens), equal to the recurrence. Block = (sequence, value head,
// slice of 32 value columns); the block walks its sequence's chunks in order with the state slice S [dk, 32] in
// shared memory. Per chunk with cumulative log-decay G (all exponents below are <= 0):
//   A[r,c] = beta_r (k_r·k_c) e^{G_r-G_c} (c<r);  U = (I+A)^-1 (beta v);  W = (I+A)^-1 (beta k e^{G})
//   v_new = U - W S;  o_r = e^{G_r} q_r S + sum_{c<=r} (q_r·k_c) e^{G_r-G_c} v_new_c
//   S = e^{G_L} S + sum_c e^{G_L-G_c} k_c ⊗ v_new_c
struct ChunkSmem {
  static constexpr int C = kGdnChunk;
  int ld;  // padded row length of Kc/Qc/Wc (dk + 1: conflict-free column reads)
  float *K, *Q, *W, *S, *A, *M, *U, *G, *beta, *eG, *eL;
  __device__ ChunkSmem(float* base, int dk) {
    ld = dk + 1;
    K = base;
    Q = K + C * ld;
    W = Q + C * ld;
    S = W + C * ld;
    A = S + dk * 32;
    M = A + C * (C + 1);
    U = M + C * (C + 1);
    G = U + C * 32;
    beta = G + C;
    eG = beta + C;
    eL = eG + C;
  }
  static size_t bytes(int dk) {
    return sizeof(float) * (size_t(3) * C * (dk + 1) + dk * 32 + 2 * C * (C + 1) + C * 32 + 4 * C);
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    gdn_chunked_kernel(const T* __restrict__ qkv, int64_t ld_qkv, const T* __restrict__ a, const T* __restrict__ bb,
                       int64_t ld_ab, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                       float* __restrict__ state, const int32_t* __restrict__ slots, const int32_t* __restrict__ cu,
                       GdnHeads d, T* __restrict__ out, int64_t ld_out) {
  extern __shared__ float smem_raw[];
  constexpr int C = kGdnChunk;
  ChunkSmem sm(smem_raw, d.dk);
  const int slices = (d.dv + 31) / 32;
  const int seq = blockIdx.x / (d.nv * slices);
  const int head = (blockIdx.x / slices) % d.nv;
  const int slice = blockIdx.x % slices;
  const int kh = head / (d.nv / d.nk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kThreads / 32;
  const int j0 = slice * 32;
  const int start = cu[seq], end = cu[seq + 1];
  float* Sg = state + (int64_t(slots[seq]) * d.nv + head) * d.dk * d.dv;
  for (int e = threadIdx.x; e < d.dk * 32; e += kThreads) {
    const int i = e / 32, jj = e % 32;
    sm.S[e] = (j0 + jj < d.dv) ? Sg[int64_t(i) * d.dv + j0 + jj] : 0.f;
  }
  const float qscale = rsqrtf(float(d.dk));
  for (int c0 = start; c0 < end; c0 += C) {
    const int L = min(C, end - c0);
    // (a) load and l2-normalise q, k; v * beta; gates. One warp per row.
    for (int r = warp; r < C; r += kWarps) {
      const int64_t t = c0 + r;
      float sq = 0.f, sk = 0.f;
      if (r < L) {
        const T* row = qkv + t * ld_qkv;
        for (int i = lane; i < d.dk; i += 32) {
          const float q = to_f(row[int64_t(kh) * d.dk + i]), k = to_f(row[int64_t(d.nk + kh) * d.dk + i]);
          sm.Q[r * sm.ld + i] = q;
          sm.K[r * sm.ld + i] = k;
          sq += q * q;
          sk += k * k;
        }
      }
      sq = warp_sum(sq);
      sk = warp_sum(sk);
      float beta = 0.f, g = 0.f;
      if (r < L) gdn_gates(a + t * ld_ab + head, bb + t * ld_ab + head, a_log, dt_bias, head, &beta, &g);
      const float rq = rsqrtf(sq + 1e-6f) * qscale, rk = rsqrtf(sk + 1e-6f);
      for (int i = lane; i < d.dk; i += 32) {
        sm.Q[r * sm.ld + i] = r < L ? sm.Q[r * sm.ld + i] * rq : 0.f;
        sm.K[r * sm.ld + i] = r < L ? sm.K[r * sm.ld + i] * rk : 0.f;
      }
      const int j = j0 + lane;
      sm.U[r * 32 + lane] = (r < L && j < d.dv)
                                ? beta * to_f(qkv[t * ld_qkv + int64_t(2 * d.nk * d.dk) + int64_t(head) * d.dv + j])
                                : 0.f;
      if (lane == 0) {
        sm.beta[r] = beta;
        sm.G[r] = g;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int r = 1; r < C; ++r) sm.G[r] += sm.G[r - 1];
    __syncthreads();
    if (threadIdx.x < C) {  // e^{G_r} and e^{G_L - G_r} (zero past the chunk's end)
      sm.eG[threadIdx.x] = expf(sm.G[threadIdx.x]);
      sm.eL[threadIdx.x] = threadIdx.x < L ? expf(sm.G[L - 1] - sm.G[threadIdx.x]) : 0.f;
    }
    __syncthreads();
    // (c) A (strictly lower), M (lower incl. diagonal), W right-hand side.
    for (int p = threadIdx.x; p < C * C; p += kThreads) {
      const int r = p / C, c = p % C;
      float kk = 0.f, qk = 0.f;
      if (c <= r && r < L) {
        for (int i = 0; i < d.dk; ++i) {
          const float kc = sm.K[c * sm.ld + i];
          kk += sm.K[r * sm.ld + i] * kc;
          qk += sm.Q[r * sm.ld + i] * kc;
        }
      }
      const float dec = (c <= r && r < L) ? expf(sm.G[r] - sm.G[c]) : 0.f;
      sm.A[r * (C + 1) + c] = c < r ? sm.beta[r] * kk * dec : 0.f;
      sm.M[r * (C + 1) + c] = qk * dec;
    }
    for (int e = threadIdx.x; e < C * d.dk; e += kThreads) {
      const int r = e / d.dk, i = e % d.dk;
      sm.W[r * sm.ld + i] = sm.K[r * sm.ld + i] * sm.beta[r] * sm.eG[r];
    }
    __syncthreads();
    // (d) forward substitution with (I + A): each thread owns one column of [W | U].
    for (int col = threadIdx.x; col < d.dk + 32; col += kThreads) {
      float* X = col < d.dk ? sm.W + col : sm.U + (col - d.dk);
      const int ldx = col < d.dk ? sm.ld : 32;
      for (int r = 1; r < L; ++r) {
        float acc = X[r * ldx];
        for (int c = 0; c < r; ++c) acc -= sm.A[r * (C + 1) + c] * X[c * ldx];
        X[r * ldx] = acc;
      }
    }
    __syncthreads();
    // (e) v_new = U - W S  (in U).
    for (int r = warp; r < L; r += kWarps) {
      float acc = sm.U[r * 32 + lane];
      for (int i = 0; i < d.dk; ++i) acc -= sm.W[r * sm.ld + i] * sm.S[i * 32 + lane];
      sm.U[r * 32 + lane] = acc;
    }
    __syncthreads();
    // (f) outputs.
    for (int r = warp; r < L; r += kWarps) {
      float acc = 0.f;
      for (int i = 0; i < d.dk; ++i) acc += sm.Q[r * sm.ld + i] * sm.S[i * 32 + lane];
      acc *= sm.eG[r];
      for (int c = 0; c <= r; ++c) acc += sm.M[r * (C + 1) + c] * sm.U[c * 32 + lane];
      if (j0 + lane < d.dv) out[int64_t(c0 + r) * ld_out + int64_t(head) * d.dv + j0 + lane] = from_f<T>(acc);
    }
    __syncthreads();
    // (g) state update.
    const float el = sm.eG[L - 1];
    for (int i = warp; i < d.dk; i += kWarps) {
      float acc = sm.S[i * 32 + lane] * el;
      for (int c = 0; c < L; ++c) acc += sm.K[c * sm.ld + i] * sm.eL[c] * sm.U[c * 32 + lane];
      sm.S[i * 32 + lane] = acc;
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < d.dk * 32; e += kThreads) {
    const int i = e / 32, jj = e % 32;
    if (j0 + jj < d.dv) Sg[int64_t(i) * d.dv + j0 + jj] = sm.S[e];
  }
}

// Both activation types are compiled in every build (NVRTC included, for the SM70 check).
#define FN_GDN_INSTANTIATE(T)                                                                                       \
  template __global__ void gdn_recurrent_kernel<T>(const T*, int64_t, const T*, const T*, int64_t, const float*,    \
                                                   const float*, float*, const int32_t*, GdnHeads, T*, int64_t);     \
  template __global__ void gdn_chunked_kernel<T>(const T*, int64_t, const T*, const T*, int64_t, const float*,      \
                                                 const float*, float*, const int32_t*, const int32_t*, GdnHeads, T*, \
                                                 int64_t);
FN_GDN_INSTANTIATE(float)
#undef FN_GDN_INSTANTIATE

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)

namespace {
template <class T>
cudaError_t gdn_recurrent_launch(const T* qkv, int64_t ld_qkv, const T* a, const T* b, int64_t ld_ab,
                                 const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                 int batch, GdnHeads dims, T* out, int64_t ld_out, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const unsigned blocks = unsigned(batch) * dims.nv * ((dims.dv + 31) / 32);
  gdn_recurrent_kernel<T>
      <<<blocks, kThreads, 0, stream>>>(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, dims, out, ld_out);
  return cudaGetLastError();
}

template <class T>
cudaError_t gdn_chunked_launch(const T* qkv, int64_t ld_qkv, const T* a, const T* b, int64_t ld_ab, const float* a_log,
                               const float* dt_bias, float* state, const int32_t* slots, const int32_t* cu,
                               int num_seqs, GdnHeads dims, T* out, int64_t ld_out, cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  const size_t smem = ChunkSmem::bytes(dims.dk);
  cudaError_t err = cudaFuncSetAttribute(gdn_chunked_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const unsigned blocks = unsigned(num_seqs) * dims.nv * ((dims.dv + 31) / 32);
  gdn_chunked_kernel<T><<<blocks, kThreads, smem, stream>>>(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, cu,
                                                            dims, out, ld_out);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_gdn_recurrent_step(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                      const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                      int batch, GdnHeads dims, float* out, int64_t ld_out, cudaStream_t stream) {
  return gdn_recurrent_launch(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, batch, dims, out, ld_out, stream);
}

cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu, int num_seqs, GdnHeads dims, float* out, int64_t ld_out,
                                       cudaStream_t stream) {
  return gdn_chunked_launch(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, cu, num_seqs, dims, out, ld_out,
                            stream);
}
#endif

}  // namespace flashnext::cuda::detail
