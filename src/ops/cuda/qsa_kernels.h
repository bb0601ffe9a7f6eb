// Launcher of the QSA sparse-attention kernel (qsa_kernels.cu) and the paging it reads. No argument checks here:
// qsa_ops.cpp checks the tensors (through ops/contract/qsa.h) and the kernel limits below.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kQsaMaxGroup = 16;    // query heads per KV head
constexpr int kQsaMaxDim = 256;     // attention head dim
constexpr int kQsaMaxIdxHeads = 8;  // indexer query heads
constexpr int kQsaMaxIdxDim = 256;  // indexer head dim
constexpr int kQsaMaxBlock = 16;    // tokens per indexer block (compress ratio)

/// Error bits a QSA kernel ORs into the status word when it meets an index it must not follow.
enum QsaError : int32_t { kQsaBadPage = 1, kQsaBadPosition = 2, kQsaCountOverflow = 4 };

/// Paged-cache geometry shared by the kernels: block_table [num_seqs, table_ld] int32 of physical page ids,
/// num_pages pages of page_size tokens.
struct QsaPaging {
  const int32_t* block_table;
  int64_t table_ld;
  int32_t num_pages;
  int32_t page_size;
};

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
