// PLE (hashed n-gram embedding) kernels: MODEL.md "PLE"; reference Qwen4ExpTextNGramEmbedding and
// Qwen4ExpTextPLELayer. The table may live in device memory or in pinned host memory that the gather reads
// directly over the host link (UVA). FP8 rows are decoded in software (SM70 has no FP8 instructions).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/ple_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;

// OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN) to float.
__device__ __forceinline__ float fp8e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  if (exp == 0xfu && man == 0x7u) return __int_as_float(0x7fc00000);
  float mag;
  if (exp == 0)
    mag = float(man) * 0.001953125f;  // subnormal: man * 2^-9
  else
    mag = __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// One warp per (token, head): out[t, h*row_dim ..] = decode(table[rows[t, h]]). TO: the output type (FP16, or
// FP32 for the ops interface).
template <class TO>
__global__ void ple_gather_kernel(const void* const* __restrict__ shards, int num_shards, int64_t rows_per_shard,
                                  int64_t total_rows, int table_type, float scale, int row_dim,
                                  const int64_t* __restrict__ rows, int tokens, int heads, TO* __restrict__ out,
                                  int32_t* status) {
  const int64_t item = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= int64_t(tokens) * heads) return;
  const int64_t row = rows[item];
  TO* o = out + item * row_dim;
  const int64_t shard = row >= 0 ? row / rows_per_shard : -1;
  if (row < 0 || row >= total_rows || shard >= num_shards) {
    if (lane == 0 && status) atomicOr(status, 1);
    for (int d = lane; d < row_dim; d += 32) o[d] = from_f<TO>(0.f);
    return;
  }
  const int64_t local = row - shard * rows_per_shard;
  if (table_type == kPleF8E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(shards[shard]) + local * row_dim;
    for (int d = lane; d < row_dim; d += 32) o[d] = from_f<TO>(fp8e4m3_to_float(src[d]) * scale);
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(shards[shard]) + local * row_dim;
    for (int d = lane; d < row_dim; d += 32) {
      const uint16_t bits = src[d];
      const float v =
          table_type == kPleBF16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
      o[d] = from_f<TO>(v * scale);
    }
  }
}

// One block per token. kn = groupnorm_key(key), qn = groupnorm_query(x) (ZC, groups of H, FP16-rounded like the
// reference's bf16 tensors), s_b = (kn_b · qn_b)/sqrt(H), s_b = sign(s_b) sqrt(max(|s_b|, 1e-6)),
// p[b*H + i] = sigmoid(s_b) * value[i]  (FP16), pn = groupnorm_conv(p) (FP16).
__global__ void ple_gate_kernel(const __half* __restrict__ key, const __half* __restrict__ value,
                                const __half* __restrict__ x, const __half* __restrict__ w_key,
                                const __half* __restrict__ w_query, const __half* __restrict__ w_conv, int streams,
                                int hidden, float eps, __half* __restrict__ p, __half* __restrict__ pn) {
  __shared__ float scratch[32];
  __shared__ float gate[kPleMaxStreams];
  const int64_t t = blockIdx.x, W = int64_t(streams) * hidden;
  const __half* kr = key + t * W;
  const __half* xr = x + t * W;
  const __half* vr = value + t * hidden;
  for (int b = 0; b < streams; ++b) {
    float sk = 0.f, sq = 0.f;
    for (int i = threadIdx.x; i < hidden; i += kThreads) {
      const float kv = to_f(kr[int64_t(b) * hidden + i]), xv = to_f(xr[int64_t(b) * hidden + i]);
      sk += kv * kv;
      sq += xv * xv;
    }
    const float rk = rsqrtf(block_sum(sk, scratch) / float(hidden) + eps);
    const float rq = rsqrtf(block_sum(sq, scratch) / float(hidden) + eps);
    float dot = 0.f;
    for (int i = threadIdx.x; i < hidden; i += kThreads) {
      const int64_t c = int64_t(b) * hidden + i;
      const float kn = to_f(to_h(to_f(kr[c]) * rk * (1.f + to_f(w_key[c]))));
      const float qn = to_f(to_h(to_f(xr[c]) * rq * (1.f + to_f(w_query[c]))));
      dot += kn * qn;
    }
    dot = block_sum(dot, scratch) * rsqrtf(float(hidden));
    if (threadIdx.x == 0) {
      const float sgn = float((dot > 0.f) - (dot < 0.f));
      gate[b] = sigmoidf_(sgn * sqrtf(fmaxf(fabsf(dot), 1e-6f)));
    }
  }
  __syncthreads();
  for (int b = 0; b < streams; ++b) {
    const float g = gate[b];
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += kThreads) {
      const __half ph = to_h(g * to_f(vr[i]));
      p[t * W + int64_t(b) * hidden + i] = ph;
      ss += to_f(ph) * to_f(ph);
    }
    const float r = rsqrtf(block_sum(ss, scratch) / float(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += kThreads) {
      const int64_t c = int64_t(b) * hidden + i;
      pn[t * W + c] = to_h(to_f(p[t * W + c]) * r * (1.f + to_f(w_conv[c])));
    }
  }
}

__device__ __forceinline__ int seq_of(const int32_t* cu, int n, int t) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// x[t, c] += p[t, c] + silu(sum_k w[c, k] * pn[t - (K-1-k)*dil, c]), inputs before the sequence start from its
// state [slot, tail, C] (tail = (K-1)*dil inputs, oldest first). Reads only the old state.
__global__ void ple_conv_kernel(__half* __restrict__ x, const __half* __restrict__ p, const __half* __restrict__ pn,
                                const int32_t* __restrict__ cu, int num_seqs, int total,
                                const __half* __restrict__ state, const int32_t* __restrict__ slots,
                                const __half* __restrict__ w, int channels, int K, int dil) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(total) * channels) return;
  const int t = int(idx / channels), c = int(idx % channels);
  const int s = seq_of(cu, num_seqs, t);
  const int start = cu[s], tail = (K - 1) * dil;
  const __half* st = state + int64_t(slots[s]) * tail * channels;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    const int src = t - (K - 1 - k) * dil;
    const float v =
        src >= start ? to_f(pn[int64_t(src) * channels + c]) : to_f(st[int64_t(tail + (src - start)) * channels + c]);
    acc += to_f(w[int64_t(c) * K + k]) * v;
  }
  x[idx] = to_h(to_f(x[idx]) + to_f(p[idx]) + siluf_(acc));
}

// New conv state of each sequence: its last (K-1)*dil conv inputs.
__global__ void ple_conv_state_kernel(const __half* __restrict__ pn, const int32_t* __restrict__ cu, int num_seqs,
                                      __half* state, const int32_t* __restrict__ slots, int channels, int tail) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= int64_t(num_seqs) * channels) return;
  const int s = int(idx / channels), c = int(idx % channels);
  const int start = cu[s], end = cu[s + 1];
  __half* st = state + int64_t(slots[s]) * tail * channels;
  __half nw[kPleMaxConvTail];
  for (int j = 0; j < tail; ++j) {
    const int src = end - tail + j;
    nw[j] = src >= start ? pn[int64_t(src) * channels + c] : st[int64_t(tail + (src - start)) * channels + c];
  }
  for (int j = 0; j < tail; ++j) st[int64_t(j) * channels + c] = nw[j];
}

// Both output types are compiled in every build (NVRTC included, for the SM70 check).
template __global__ void ple_gather_kernel<__half>(const void* const*, int, int64_t, int64_t, int, float, int,
                                                   const int64_t*, int, int, __half*, int32_t*);
template __global__ void ple_gather_kernel<float>(const void* const*, int, int64_t, int64_t, int, float, int,
                                                  const int64_t*, int, int, float*, int32_t*);

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, int row_dim, const int64_t* rows, int tokens, int heads,
                              __half* out, int32_t* status, cudaStream_t stream) {
  const int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  ple_gather_kernel<__half><<<unsigned((items * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      shards, num_shards, rows_per_shard, total_rows, table_type, scale, row_dim, rows, tokens, heads, out, status);
  return cudaGetLastError();
}

cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, int row_dim, const int64_t* rows, int tokens, int heads,
                              float* out, int32_t* status, cudaStream_t stream) {
  const int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  ple_gather_kernel<float><<<unsigned((items * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      shards, num_shards, rows_per_shard, total_rows, table_type, scale, row_dim, rows, tokens, heads, out, status);
  return cudaGetLastError();
}

cudaError_t launch_ple_gate(const __half* key, const __half* value, const __half* x, const __half* w_key,
                            const __half* w_query, const __half* w_conv, int tokens, int streams, int hidden, float eps,
                            __half* p, __half* pn, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  ple_gate_kernel<<<tokens, kThreads, 0, stream>>>(key, value, x, w_key, w_query, w_conv, streams, hidden, eps, p, pn);
  return cudaGetLastError();
}

cudaError_t launch_ple_conv(__half* x, const __half* p, const __half* pn, const int32_t* cu_seqlens, int num_seqs,
                            int total_tokens, __half* state, const int32_t* slots, const __half* w, int channels,
                            int kernel, int dilation, cudaStream_t stream) {
  if (total_tokens == 0 || num_seqs == 0) return cudaSuccess;
  const int64_t n = int64_t(total_tokens) * channels;
  ple_conv_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, p, pn, cu_seqlens, num_seqs, total_tokens, state, slots, w, channels, kernel, dilation);
  const int tail = (kernel - 1) * dilation;
  if (tail > 0) {
    const int64_t m = int64_t(num_seqs) * channels;
    ple_conv_state_kernel<<<unsigned((m + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        pn, cu_seqlens, num_seqs, state, slots, channels, tail);
  }
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
