// QSA layer kernels on the GPU: paged KV + indexer caches, the indexer's block selection and sparse attention
// that reads only the selected tokens. MODEL.md "QSA attention layer" / "Indexer"; reference
// Qwen4ExpTextQSAIndexer and Qwen4ExpTextAttention. No dense T x T mask exists anywhere: each query carries the
// list of logical positions it may attend to (at most budget + block - 1).
//
// Paged caches (device memory; page ids from a block table, logical positions everywhere):
//   k, v          [num_pages, page_size, kv_heads, head_dim] FP16 (after k_norm and RoPE);
//   index_keys    [num_pages, page_size, index_dim] FP16: raw indexer keys (no norm, no rope);
//   pooled_keys   [num_pages, page_size / block, index_dim] FP16: per complete block j of `block` tokens,
//                 RoPE(ZC-RMSNorm(mean of its raw keys), position block*j) — an exact cache of the reference's
//                 per-query recomputation, written when the block's last token is appended;
//   block_table   [num_seqs, table_ld] int32: logical page -> physical page.
// A batch is a list of tokens (prefill chunks and decode tokens of several sequences mixed) with, per token, its
// sequence index (row of the block table) and logical position.
//
// Index errors found on the device (a page id outside the cache, a position beyond the block table, a selected
// position after its query) are never followed: the kernel skips that entry and ORs a bit into the device status
// word (int32, zeroed by the caller); qsa_check_status() turns it into an Error.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashnext::cuda {

struct QsaCache {
  __half* k = nullptr;
  __half* v = nullptr;
  __half* index_keys = nullptr;
  __half* pooled_keys = nullptr;
  const int32_t* block_table = nullptr;
  int64_t table_ld = 0;  // entries per block-table row (max pages per sequence)
  int num_pages = 0;
  int page_size = 0;  // tokens per page, a multiple of `block`
  int kv_heads = 0;   // nkv (per TP rank), head_dim <= 256, heads per KV head <= 16
  int head_dim = 0;
  int index_dim = 0;  // Di <= 256
  int block = 0;      // indexer_compress_ratio c <= 16
};

struct QsaBatch {
  const int32_t* tok_seq = nullptr;  // device [tokens]: block-table row of each token
  const int32_t* tok_pos = nullptr;  // device [tokens]: logical position of each token
  int tokens = 0;
  int max_context = 0;  // host: 1 + the largest position in the batch (sizes scratch and grids)
};

/// Appends each token's K, V (rows of kv_heads*head_dim with strides ldk, ldv) and raw indexer key (row stride
/// ldki) at its position, then writes the pooled key of every block that a token of the batch completes
/// (k_norm_w = indexer k_layernorm.weight [index_dim], ZC; RoPE on the first rotary_dims at theta). A sequence's
/// earlier positions must already be in the cache (chunked prefill and decode append in order).
void qsa_cache_append(const QsaCache& cache, const QsaBatch& batch, const __half* k, int64_t ldk, const __half* v,
                      int64_t ldv, const __half* ki, int64_t ldki, const __half* k_norm_w, int rotary_dims, float theta,
                      float eps, int32_t* status, cudaStream_t stream);

/// Floats of block-score scratch qsa_index_select needs: tokens * ceil(max_context / block)... exactly
/// tokens * (max_context / block) (complete blocks only; at least 1).
int64_t qsa_scores_floats(const QsaCache& cache, const QsaBatch& batch);

/// Indexer selection for each token at position p: scores of the nb = (p+1)/block complete blocks,
/// score_j = sum_h relu(qi_h · pooled_j) / sqrt(Di) (qi [tokens, index_heads*Di] after q_layernorm and RoPE, row
/// stride ldq; FP32 scores), the top min(top_blocks, nb) blocks by (higher score, then lower block index), their
/// tokens plus the tail tokens block*nb .. p. selected[t, 0..counts[t]) receives the logical positions in
/// increasing order; ld_sel >= top_blocks*block + block - 1. `scores` is scratch of qsa_scores_floats() floats.
void qsa_index_select(const QsaCache& cache, const QsaBatch& batch, const __half* qi, int64_t ldq, int index_heads,
                      int top_blocks, float* scores, int32_t* selected, int64_t ld_sel, int32_t* counts,
                      int32_t* status, cudaStream_t stream);

/// The selection step alone, from given block scores [tokens, lds] (FP32): used by qsa_index_select, public for
/// tests of the tie rule.
void qsa_select_from_scores(const float* scores, int64_t lds, const int32_t* tok_pos, int tokens, int block,
                            int top_blocks, int32_t* selected, int64_t ld_sel, int32_t* counts, cudaStream_t stream);

/// How sparse attention splits each query's selected list (split-K): more splits when few (token, KV head) pairs
/// exist (decode), one split when the batch alone fills the GPU (prefill).
struct QsaAttentionPlan {
  int splits = 1;
  int split_len = 0;
  int64_t partial_floats = 0;  // scratch the split path needs (0 for one split)
};
QsaAttentionPlan qsa_attention_plan(int tokens, int heads, int kv_heads, int head_dim, int max_selected);

/// o = softmax over the selected positions of (q · k / sqrt(D)) v, per query head (GQA: head h reads KV head
/// h / (heads/kv_heads)), then o * sigmoid(gate) when gate is given (element (t, h, d) at
/// gate[t*ld_gate + h*gate_head_stride + d]: the q_proj output's gate half), written FP16 to out [tokens, heads*D].
/// q: [tokens, heads*D] after q_norm and RoPE, row stride ldq. max_selected: host bound on counts[].
/// `partial` holds plan.partial_floats floats (may be null when plan.splits == 1).
void qsa_sparse_attention(const QsaCache& cache, const QsaBatch& batch, const __half* q, int64_t ldq, int heads,
                          const int32_t* selected, int64_t ld_sel, const int32_t* counts, const QsaAttentionPlan& plan,
                          const __half* gate, int64_t ld_gate, int64_t gate_head_stride, float* partial, __half* out,
                          int64_t ldo, int32_t* status, cudaStream_t stream);

/// Waits for `stream` and throws Error naming the index errors recorded in the device status word, if any.
void qsa_check_status(const int32_t* status, cudaStream_t stream);

}  // namespace flashnext::cuda
