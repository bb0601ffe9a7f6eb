// Token sampling on the GPU: greedy, temperature, top-k, top-p, min-p (applied in that order, as transformers'
// logits warpers do), one block per row. Probability masses are fixed-point integers (p / p_max * 2^40), so the
// sums that decide top-p and the sampled token do not depend on the order of floating-point additions: a seed and
// offset always give the same token. Ties at a top-k or top-p boundary keep every tied token.
#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/sampling_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kMassScale = 1099511627776.0;  // 2^40

__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t warp_incl_scan_u64(uint64_t x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive prefix sum of v over the block (thread order); *total gets the sum. sh: kWarps + 1 entries.
__device__ __forceinline__ uint64_t block_excl_scan_u64(uint64_t v, uint64_t* total, uint64_t* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t incl = warp_incl_scan_u64(v);
  __syncthreads();
  if (lane == 31) sh[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint64_t w = lane < kWarps ? sh[lane] : 0;
    const uint64_t wi = warp_incl_scan_u64(w);
    if (lane < kWarps) sh[lane] = wi - w;
    if (lane == kWarps - 1) sh[kWarps] = wi;
  }
  __syncthreads();
  *total = sh[kWarps];
  return sh[warp] + incl - v;
}

__device__ __forceinline__ uint64_t mass_of(float logit, float m, float inv_t) {
  return uint64_t(double(expf((logit - m) * inv_t)) * kMassScale);
}

// Radix select, 8 bits per pass from the top, over the tokens whose order key is >= floor_key: the largest key K
// such that the tokens with keys >= K weigh at least `want` (weight 1 per token for top-k, its mass for top-p).
// Histograms are per warp (counts) or per warp pair (masses) in `hist` (32 KB) so that atomics rarely collide.
template <bool MASS>
__device__ uint32_t radix_select(const float* l, int vocab, uint32_t floor_key, float m, float inv_t,
                                 unsigned long long want, unsigned long long* hist, uint32_t* s_prefix,
                                 unsigned long long* s_remaining) {
  constexpr int kSubs = MASS ? kWarps / 2 : kWarps;
  uint32_t* h32 = reinterpret_cast<uint32_t*>(hist);
  const int warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long remaining = want;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kWarps / 2 * 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = l[i];
      const uint32_t key = float_order_key(v);
      if (key >= floor_key && (key & mask) == prefix) {
        const uint32_t d = (key >> shift) & 255u;
        if (MASS)
          atomicAdd(&hist[(warp >> 1) * 256 + d], (unsigned long long)mass_of(v, m, inv_t));
        else
          atomicAdd(&h32[warp * 256 + d], 1u);
      }
    }
    __syncthreads();
    unsigned long long tot = 0;
    if (threadIdx.x < 256)
      for (int sb = 0; sb < kSubs; ++sb) tot += MASS ? hist[sb * 256 + threadIdx.x] : h32[sb * 256 + threadIdx.x];
    __syncthreads();
    if (threadIdx.x < 256) hist[threadIdx.x] = tot;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long cum = 0;
      int b = 255;
      for (; b > 0; --b) {
        if (cum + hist[b] >= remaining) break;
        cum += hist[b];
      }
      *s_prefix = prefix | (uint32_t(b) << shift);
      *s_remaining = remaining > cum ? remaining - cum : 1ull;
    }
    __syncthreads();
    prefix = *s_prefix;
    remaining = *s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int64_t ld, int vocab, const TokenSamplingRow* __restrict__ params,
                  int32_t* __restrict__ tokens) {
  pdl_begin();
  __shared__ unsigned long long hist[kWarps / 2 * 256];  // 32 KB of histograms
  __shared__ uint64_t ush[kWarps + 1];
  __shared__ float fsh[32];
  __shared__ uint32_t s_prefix;
  __shared__ unsigned long long s_remaining;
  __shared__ int s_token;
  const int row = blockIdx.x;
  const float* l = logits + int64_t(row) * ld;
  const TokenSamplingRow sp = params[row];
  // Max and its lowest index (greedy).
  float mx = -__int_as_float(0x7f800000);
  int arg = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = l[i];
    if (v > mx) {
      mx = v;
      arg = i;
    }
  }
  const float m = block_max(mx, fsh);
  int cand = mx == m ? arg : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
  if (threadIdx.x == 0) s_token = 0x7fffffff;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicMin(&s_token, cand);
  __syncthreads();
  const int greedy = s_token;
  if (!(sp.temperature > 0.f)) {
    if (threadIdx.x == 0) tokens[row] = greedy;
    return;
  }
  const float inv_t = 1.f / sp.temperature;
  // Top-k: keys >= the k-th largest key.
  uint32_t tau = 0;
  if (sp.top_k > 0 && sp.top_k < vocab)
    tau = radix_select<false>(l, vocab, 0u, m, inv_t, (unsigned long long)sp.top_k, hist, &s_prefix, &s_remaining);
  // Top-p over the top-k survivors: the largest key whose kept mass reaches ceil(top_p * Z_k).
  if (sp.top_p < 1.f) {
    uint64_t z = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = l[i];
      if (float_order_key(v) >= tau) z += mass_of(v, m, inv_t);
    }
    uint64_t zk;
    block_excl_scan_u64(z, &zk, ush);
    const double target = ceil(double(fmaxf(sp.top_p, 0.f)) * double(zk));
    const unsigned long long want = target < 1.0 ? 1ull : (unsigned long long)target;
    tau = max(tau, radix_select<true>(l, vocab, tau, m, inv_t, want, hist, &s_prefix, &s_remaining));
  }
  // Kept set: key >= tau and (min-p) p / p_max >= min_p. Inverse CDF in token order: each thread owns a contiguous
  // range of tokens; a block scan of the ranges' kept masses finds the range holding the draw, which its owner walks.
  const bool use_min_p = sp.min_p > 0.f;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int b0 = min(vocab, int(threadIdx.x) * chunk), b1 = min(vocab, b0 + chunk);
  uint64_t mine = 0;
  for (int i = b0; i < b1; ++i) {
    const float v = l[i];
    if (float_order_key(v) >= tau && (!use_min_p || expf((v - m) * inv_t) >= sp.min_p)) mine += mass_of(v, m, inv_t);
  }
  uint64_t zk;
  const uint64_t before = block_excl_scan_u64(mine, &zk, ush);
  if (zk == 0) {  // nothing kept (min_p above 1, or a NaN temperature): the greedy token
    if (threadIdx.x == 0) tokens[row] = greedy;
    return;
  }
  const uint64_t bits = splitmix(sp.seed ^ splitmix(sp.offset + 0x632BE59BD9B4E019ull));
  const double u = double(bits >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  uint64_t r = uint64_t(u * double(zk));
  if (r >= zk) r = zk - 1;
  if (mine > 0 && before <= r && r < before + mine) {
    uint64_t acc = before;
    for (int i = b0; i < b1; ++i) {
      const float v = l[i];
      if (!(float_order_key(v) >= tau && (!use_min_p || expf((v - m) * inv_t) >= sp.min_p))) continue;
      acc += mass_of(v, m, inv_t);
      if (r < acc) {
        tokens[row] = i;
        break;
      }
    }
  }
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_sample(const float* logits, int64_t ld, int rows, int vocab, const TokenSamplingRow* params,
                          int32_t* tokens, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  launch(sample_kernel, rows, kThreads, 0, stream, logits, ld, vocab, params, tokens);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
