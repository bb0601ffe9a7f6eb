// Hyper-connections (gated residual read and inject) on the GPU: MODEL.md "Hyper-connection (gated residual) read"
// and "Decoder layer"; reference class Qwen4ExpTextGatedResidual. FP16 activations and weights, FP32 statistics.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "ops/cuda/blas.h"
#include "ops/cuda/buffer.h"

namespace flashnext::cuda {

/// Weights of one hyper-connection instance (device pointers, FP16, checkpoint layouts):
/// norm_w = hc_norm.weight [S*H]; w_down = input_mix_weight_down.weight [rank, S*H];
/// w_up = input_mix_weight_up.weight [S*H, rank]; w_inject = block_inject_weight.weight [S, S*H], or nullptr for
/// the final hyper_connection_mixer (which returns only u).
struct HcWeights {
  const __half* norm_w = nullptr;
  const __half* w_down = nullptr;
  const __half* w_up = nullptr;
  const __half* w_inject = nullptr;
  int streams = 0;  // S (hc_count), 1..8
  int hidden = 0;   // H
  int rank = 0;     // hc_lowrank
  float eps = 1e-6f;
};

/// Scratch for hc_read, sized for up to `max_tokens` tokens: N [T, S*H] FP16, W_down·N [T, rank] FP32,
/// silu(...) [T, rank] FP16, W_up·a [T, S*H] FP16.
class HcWorkspace {
 public:
  HcWorkspace(int max_tokens, int streams, int hidden, int rank);
  int max_tokens() const { return max_tokens_; }
  __half* normed() const { return n_.get(); }

 private:
  friend void hc_read(Blas&, const HcWeights&, __half*, int, const __half*, const float*, __half*, float*, HcWorkspace&,
                      cudaStream_t);
  int max_tokens_, streams_, hidden_, rank_;
  DeviceArray<__half> n_;
  DeviceArray<float> down_;
  DeviceArray<__half> act_;
  DeviceArray<__half> up_;
};

/// Gated residual read of the wide residual X [T, S*H] (in place only if a pending inject is given):
///   if y_prev: X = X + w_prev ⊗ y_prev first (the previous block's inject, fused; y_prev [T, H], w_prev [T, S]),
///   N = grouped ZC-RMSNorm(X) (groups of H), m = sigmoid(W_up · silu((W_down · N) / S)),
///   u = mean_b (m_b ⊙ N_b) -> u_out [T, H],
///   w = 2 * sigmoid((W_inject · N) / S) -> inject_out [T, S] FP32 (skipped when weights.w_inject is null).
/// Throws Error for bad sizes (T above the workspace's max, S outside 1..8, missing outputs).
void hc_read(Blas& blas, const HcWeights& weights, __half* x, int tokens, const __half* y_prev, const float* w_prev,
             __half* u_out, float* inject_out, HcWorkspace& ws, cudaStream_t stream);

/// Inject: X [T, S*H] += w [T, S] (per stream b) ⊗ y [T, H]; the residual update after a mixer or MoE block.
void hc_inject(__half* x, const __half* y, const float* w, int tokens, int streams, int hidden, cudaStream_t stream);

}  // namespace flashnext::cuda
