// The router's softmax top-k of one token as a warp computes it (MODEL.md "MoE block"; reference
// Qwen4ExpTextTopKRouter): shared by the top-k kernel (moe_kernels.cu) and the decode router that computes its logits
// in the same launch (cuda_ops_kernels.cu). SM70 instructions only.
#pragma once

#include "ops/cuda/cuda_stdint.h"
#include "ops/cuda/device_math.cuh"

namespace flashnext::cuda::detail {

/// One warp (all 32 lanes call it): p = softmax(row[0 .. experts)) in FP32, the top_k experts by (higher p, then lower
/// index), their probabilities optionally renormalised to sum 1 (`norm`), into ids[0 .. top_k) and
/// weights[0 .. top_k). kPer logits per lane: experts <= 32 kPer and top_k <= 32; the picks and sums are the same
/// for any kPer that holds the experts. The row is read through L2 (__ldcg), so it may have been written by other
/// blocks of the same launch (after an acquire).
template <int kPer>
__device__ __forceinline__ void router_topk_warp(const float* row, int experts, int top_k, bool norm,
                                                 int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  float v[kPer];
  float mx = -__int_as_float(0x7f800000);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? __ldcg(row + e) : -__int_as_float(0x7f800000);
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
    ids[lane] = my_id;
    weights[lane] = norm ? my_w / picked_sum : my_w;
  }
}

}  // namespace flashnext::cuda::detail
