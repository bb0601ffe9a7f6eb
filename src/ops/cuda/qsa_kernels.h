// Launchers for the QSA kernels (qsa_kernels.cu). No argument checks here: call through qsa.h.
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
cudaError_t launch_qsa_cache_append(const __half* k, int64_t ldk, const __half* v, int64_t ldv, const __half* ki,
                                    int64_t ldki, const int32_t* tok_seq, const int32_t* tok_pos, int tokens,
                                    QsaPaging pg, __half* k_cache, __half* v_cache, __half* ki_cache, int kv_heads,
                                    int dim, int idx_dim, int32_t* status, cudaStream_t stream);
cudaError_t launch_qsa_pool_blocks(const int32_t* tok_seq, const int32_t* tok_pos, int tokens, QsaPaging pg,
                                   const __half* ki_cache, __half* pooled_cache, const __half* k_norm_w, int idx_dim,
                                   int block, int rotary_dims, float theta, float eps, int32_t* status,
                                   cudaStream_t stream);
cudaError_t launch_qsa_block_scores(const __half* qi, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                    int tokens, QsaPaging pg, const __half* pooled_cache, int idx_heads, int idx_dim,
                                    int block, int max_blocks, float* scores, int64_t lds, int32_t* status,
                                    cudaStream_t stream);
cudaError_t launch_qsa_select(const float* scores, int64_t lds, const int32_t* tok_pos, int tokens, int block,
                              int top_blocks, int32_t* selected, int64_t ld_sel, int32_t* counts, cudaStream_t stream);
cudaError_t launch_qsa_attention(const __half* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const __half* k_cache, const __half* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const __half* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, __half* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream);
// FP32 variant (q, caches, gate and output float32: the ops interface's tensors); same kernels.
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
