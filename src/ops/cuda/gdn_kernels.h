// Launchers for the Gated DeltaNet kernels (gdn_kernels.cu). No argument checks here: call through gdn.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kGdnMaxKernel = 8;  // causal conv kernel width K
constexpr int kGdnMaxDk = 128;    // key head dim (smem-sized in the chunked kernel)
constexpr int kGdnChunk = 32;     // tokens per chunk in the chunked prefill

/// Head geometry as the kernels take it (ops.h GdnDims in 32-bit form).
struct GdnHeads {
  int nk, nv, dk, dv;
};

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_gdn_conv_prefill(const __half* x, int64_t ldx, const int32_t* cu_seqlens, int num_seqs,
                                    int total_tokens, __half* conv_state, const int32_t* slots, const __half* w,
                                    __half* y, int64_t ldy, int channels, int kernel, cudaStream_t stream);
cudaError_t launch_gdn_conv_update(const __half* x, int64_t ldx, int batch, __half* conv_state, const int32_t* slots,
                                   const __half* w, __half* y, int64_t ldy, int channels, int kernel,
                                   cudaStream_t stream);

cudaError_t launch_gdn_recurrent_step(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b,
                                      int64_t ld_ab, const float* a_log, const float* dt_bias, float* state,
                                      const int32_t* slots, int batch, GdnHeads dims, __half* out, int64_t ld_out,
                                      cudaStream_t stream);
cudaError_t launch_gdn_chunked_prefill(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b,
                                       int64_t ld_ab, const float* a_log, const float* dt_bias, float* state,
                                       const int32_t* slots, const int32_t* cu_seqlens, int num_seqs, GdnHeads dims,
                                       __half* out, int64_t ld_out, cudaStream_t stream);

// FP32-activation variants of the recurrence (the ops interface's float32 tensors); same kernels.
cudaError_t launch_gdn_recurrent_step(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                      const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                      int batch, GdnHeads dims, float* out, int64_t ld_out, cudaStream_t stream);
cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu_seqlens, int num_seqs, GdnHeads dims, float* out,
                                       int64_t ld_out, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
