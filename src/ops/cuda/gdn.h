// Gated DeltaNet (linear attention) kernels on the GPU: MODEL.md "Gated DeltaNet (linear attention) layer".
// Reference: Qwen4ExpTextGatedDeltaNet and its causal_conv1d / gated delta rule functions.
//
// Layouts (all device memory, row-major):
//   conv input/output [T, C] FP16, C = 2*nk*dk + nv*dv in the order q | k | v (in_proj_qkv's output), row stride ld;
//   conv weight conv1d.weight [C, 1, K] viewed [C, K] FP16, no bias;
//   conv state pool [slots, C, K-1] FP16: the last K-1 conv inputs of a sequence, oldest first (zero for a new one);
//   recurrent state pool [slots, nv, dk, dv] FP32 (mamba_ssm_dtype), zero for a new sequence;
//   a, b: in_proj_a / in_proj_b outputs [T, nv] FP16 sharing row stride ld_ab; A_log, dt_bias [nv] FP32;
//   out [T, nv*dv] FP16 (before the gated RMSNorm).
// Batches: prefill takes several sequences packed along T with cu_seqlens [num_seqs+1] (device int32, cu[0] = 0,
// nondecreasing, cu[num_seqs] = T) and one state slot per sequence (device int32 [num_seqs]); decode takes one
// token per sequence. Value head h uses key head h / (nv/nk). Work is enqueued on `stream`; bad sizes throw Error.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashnext::cuda {

/// Head counts and dims of one GDN layer (per tensor-parallel rank): nk key heads, nv value heads (nv % nk == 0),
/// dk <= 128, dv.
struct GdnDims {
  int nk = 0, nv = 0, dk = 0, dv = 0;
  int conv_channels() const { return 2 * nk * dk + nv * dv; }
};

/// Prefill causal depthwise conv: y = silu(conv1d(state ++ x)) per sequence, then each sequence's conv state
/// becomes its last K-1 inputs. `y` must not alias `x`.
void gdn_conv_prefill(const __half* x, int64_t ldx, const int32_t* cu_seqlens, int num_seqs, int total_tokens,
                      __half* conv_state, const int32_t* slots, const __half* w, __half* y, int64_t ldy, int channels,
                      int kernel, cudaStream_t stream);

/// Decode conv update: one token per sequence (x [batch, C]), state shifted in place.
void gdn_conv_update(const __half* x, int64_t ldx, int batch, __half* conv_state, const int32_t* slots, const __half* w,
                     __half* y, int64_t ldy, int channels, int kernel, cudaStream_t stream);

/// Decode step of the gated delta rule for `batch` sequences with one token each: l2-normalises q, k (eps 1e-6),
/// scales q by dk^-0.5, beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), then per value head
/// S = e^g S; S += k ⊗ beta (v - S^T k); o = S^T q. `qkv` is the conv output [batch, C].
void gdn_recurrent_step(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b, int64_t ld_ab,
                        const float* a_log, const float* dt_bias, float* state, const int32_t* slots, int batch,
                        const GdnDims& dims, __half* out, int64_t ld_out, cudaStream_t stream);

/// Chunked prefill of the gated delta rule (chunks of 32 tokens, WY form), equal to running gdn_recurrent_step
/// token by token. Starts from each sequence's state and leaves the final state there (chunked prefill and
/// decode continue from it).
void gdn_chunked_prefill(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b, int64_t ld_ab,
                         const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                         const int32_t* cu_seqlens, int num_seqs, const GdnDims& dims, __half* out, int64_t ld_out,
                         cudaStream_t stream);

}  // namespace flashnext::cuda
