// Launchers of the gated delta rule kernels (gdn_kernels.cu). No argument checks here: gdn_ops.cpp checks the
// tensors (ops/contract/gdn.h) and the limits below.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kGdnMaxDk = 128;    // key head dim (smem-sized in the chunked kernel)
constexpr int kGdnChunk = 32;     // tokens per chunk in the chunked prefill

/// Head geometry as the kernels take it (ops.h GdnDims in 32-bit form).
struct GdnHeads {
  int nk, nv, dk, dv;
};

#ifndef __CUDACC_RTC__  // host launchers
/// The recurrence for one decode token per sequence (token s in slot slots[s]); the chunked form over the rows
/// cu_seqlens[s] .. of every sequence s, state in slot slots[s] read and written.
cudaError_t launch_gdn_recurrent_step(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                      const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                      int batch, GdnHeads dims, float* out, int64_t ld_out, cudaStream_t stream);
cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu_seqlens, int num_seqs, GdnHeads dims, float* out,
                                       int64_t ld_out, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
