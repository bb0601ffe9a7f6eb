// Launchers for the normalisation kernels (norm_kernels.cu). No argument checks here: call through norm.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_zc_rmsnorm(const __half* x, int64_t ldx, __half* y, int64_t ldy, const __half* w, int w_len,
                              int rows, int width, int group, float eps, cudaStream_t stream);

cudaError_t launch_head_norm_rope(const __half* x, int64_t x_token_stride, int64_t x_head_stride, __half* y,
                                  int64_t y_token_stride, int64_t y_head_stride, const __half* w, const int32_t* pos,
                                  int tokens, int heads, int dim, int rotary_dims, float theta, float eps,
                                  cudaStream_t stream);

cudaError_t launch_gated_rmsnorm(const __half* x, int64_t ldx, const __half* z, int64_t ldz, __half* y, int64_t ldy,
                                 const __half* w, int tokens, int heads, int dim, float eps, cudaStream_t stream);

// FP32-activation variants (the ops interface's float32 tensors; FP16 weights); same kernels. The FP32 gated
// RMSNorm also takes the gate activation: silu_gate true = silu(z), false = sigmoid(z).
cudaError_t launch_zc_rmsnorm(const float* x, int64_t ldx, float* y, int64_t ldy, const __half* w, int w_len, int rows,
                              int width, int group, float eps, cudaStream_t stream);
cudaError_t launch_head_norm_rope(const float* x, int64_t x_token_stride, int64_t x_head_stride, float* y,
                                  int64_t y_token_stride, int64_t y_head_stride, const __half* w, const int32_t* pos,
                                  int tokens, int heads, int dim, int rotary_dims, float theta, float eps,
                                  cudaStream_t stream);
cudaError_t launch_gated_rmsnorm(const float* x, int64_t ldx, const float* z, int64_t ldz, float* y, int64_t ldy,
                                 const __half* w, int tokens, int heads, int dim, float eps, bool silu_gate,
                                 cudaStream_t stream);
/// QSA q/k preparation in one launch (ops.h qsa_prepare_qk_batch): for every token t (position pos[t]) and query
/// head h of qg [T, nh, 2 * dim] (per head: query dim, gate dim), q[t, h] = RoPE(ZC-RMSNorm(query; q_norm)) and
/// gate[t, h] = the gate half; k [T, nkv, dim] in place, RoPE(ZC-RMSNorm(k; k_norm)). Contiguous rows; the same
/// arithmetic as launch_head_norm_rope.
cudaError_t launch_qsa_prepare_qk(const float* qg, float* q, float* gate, float* k, const __half* q_norm,
                                  const __half* k_norm, const int32_t* pos, int tokens, int nh, int nkv, int dim,
                                  int rotary_dims, float theta, float eps, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
