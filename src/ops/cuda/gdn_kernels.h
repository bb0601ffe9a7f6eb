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
constexpr int kGdnChunk = 64;     // tokens per chunk in the chunked prefill (the reference's chunk size)

/// Head geometry as the kernels take it (ops.h GdnDims in 32-bit form).
struct GdnHeads {
  int nk, nv, dk, dv;
};

#ifndef __CUDACC_RTC__  // host launchers
/// The recurrence for one decode token per sequence (token s in slot slots[s]).
cudaError_t launch_gdn_recurrent_step(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                      const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                      int batch, GdnHeads dims, float* out, int64_t ld_out, cudaStream_t stream);

/// The chunked form over the rows cu_seqlens[s] .. cu_seqlens[s+1] of every sequence s (`rows` in all), state in
/// slot slots[s] read and written. Three launches per pass of `heads_per_pass` value heads (gdn_kernels.cu: chunk
/// preparation, the state walk, the outputs) with their intermediates in `scratch`, which holds
/// gdn_chunked_scratch_floats(num_seqs, rows, dims, heads_per_pass) floats. Needs dk <= kGdnMaxDk, dk % 4 == 0.
cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu_seqlens, int num_seqs, int64_t rows, GdnHeads dims,
                                       int heads_per_pass, float* scratch, float* out, int64_t ld_out,
                                       cudaStream_t stream);
/// Value heads per pass of launch_gdn_chunked_prefill so that its scratch stays within max_scratch_floats (at least
/// one head), and the scratch that takes.
int gdn_chunked_heads_per_pass(int num_seqs, int64_t rows, GdnHeads dims, int64_t max_scratch_floats);
int64_t gdn_chunked_scratch_floats(int num_seqs, int64_t rows, GdnHeads dims, int heads_per_pass);
#endif

}  // namespace flashnext::cuda::detail
