#include "ops/cuda/qsa.h"

#include <algorithm>
#include <string>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda {

namespace {

detail::QsaPaging paging(const QsaCache& c) {
  return {c.block_table, c.table_ld, c.num_pages, c.page_size};
}

void check_cache(const char* op, const QsaCache& c) {
  FN_CHECK(c.block_table && c.table_ld > 0 && c.num_pages > 0, "{}: cache has no block table or pages", op);
  FN_CHECK(c.block >= 1 && c.block <= detail::kQsaMaxBlock, "{}: indexer block {} is outside 1..{}", op, c.block,
           detail::kQsaMaxBlock);
  FN_CHECK(c.page_size > 0 && c.page_size % c.block == 0,
           "{}: page size {} must be a positive multiple of the block {}", op, c.page_size, c.block);
  FN_CHECK(c.kv_heads >= 1 && c.head_dim >= 1 && c.head_dim <= detail::kQsaMaxDim,
           "{}: kv_heads {} / head_dim {} (at most {})", op, c.kv_heads, c.head_dim, detail::kQsaMaxDim);
  FN_CHECK(c.index_dim >= 1 && c.index_dim <= detail::kQsaMaxIdxDim, "{}: indexer dim {} is outside 1..{}", op,
           c.index_dim, detail::kQsaMaxIdxDim);
}

void check_batch(const char* op, const QsaBatch& b) {
  FN_CHECK(b.tokens >= 0 && b.max_context >= 0, "{}: bad batch ({} tokens, context {})", op, b.tokens, b.max_context);
  FN_CHECK(b.tokens == 0 || (b.tok_seq && b.tok_pos), "{}: batch without token sequences/positions", op);
}

}  // namespace

void qsa_cache_append(const QsaCache& c, const QsaBatch& b, const __half* k, int64_t ldk, const __half* v, int64_t ldv,
                      const __half* ki, int64_t ldki, const __half* k_norm_w, int rotary_dims, float theta, float eps,
                      int32_t* status, cudaStream_t stream) {
  check_cache("qsa_cache_append", c);
  check_batch("qsa_cache_append", b);
  FN_CHECK(c.k && c.v && c.index_keys && c.pooled_keys && k && v && ki && k_norm_w, "qsa_cache_append: null pointer");
  const int64_t kvw = int64_t(c.kv_heads) * c.head_dim;
  FN_CHECK(ldk >= kvw && ldv >= kvw && ldki >= c.index_dim, "qsa_cache_append: row strides below the widths");
  FN_CHECK(rotary_dims >= 0 && rotary_dims % 2 == 0 && rotary_dims <= c.index_dim,
           "qsa_cache_append: rotary dims {} must be even and at most the indexer dim {}", rotary_dims, c.index_dim);
  FN_CUDA_CHECK(
      detail::launch_qsa_cache_append(k, ldk, v, ldv, ki, ldki, b.tok_seq, b.tok_pos, b.tokens, paging(c), c.k, c.v,
                                      c.index_keys, c.kv_heads, c.head_dim, c.index_dim, status, stream),
      "qsa_cache_append");
  FN_CUDA_CHECK(detail::launch_qsa_pool_blocks(b.tok_seq, b.tok_pos, b.tokens, paging(c), c.index_keys, c.pooled_keys,
                                               k_norm_w, c.index_dim, c.block, rotary_dims, theta, eps, status, stream),
                "qsa_cache_append pooled keys");
}

int64_t qsa_scores_floats(const QsaCache& c, const QsaBatch& b) {
  return std::max<int64_t>(1, int64_t(b.tokens) * (b.max_context / std::max(c.block, 1)));
}

void qsa_select_from_scores(const float* scores, int64_t lds, const int32_t* tok_pos, int tokens, int block,
                            int top_blocks, int32_t* selected, int64_t ld_sel, int32_t* counts, cudaStream_t stream) {
  FN_CHECK(block >= 1 && top_blocks >= 1 && tokens >= 0, "qsa_select: bad block {} / top blocks {} / tokens {}", block,
           top_blocks, tokens);
  FN_CHECK(ld_sel >= int64_t(top_blocks) * block + block - 1,
           "qsa_select: selected row stride {} below the budget {} + block - 1", ld_sel, int64_t(top_blocks) * block);
  FN_CHECK(tokens == 0 || (scores && tok_pos && selected && counts), "qsa_select: null pointer");
  FN_CUDA_CHECK(
      detail::launch_qsa_select(scores, lds, tok_pos, tokens, block, top_blocks, selected, ld_sel, counts, stream),
      "qsa_select");
}

void qsa_index_select(const QsaCache& c, const QsaBatch& b, const __half* qi, int64_t ldq, int index_heads,
                      int top_blocks, float* scores, int32_t* selected, int64_t ld_sel, int32_t* counts,
                      int32_t* status, cudaStream_t stream) {
  check_cache("qsa_index_select", c);
  check_batch("qsa_index_select", b);
  FN_CHECK(index_heads >= 1 && index_heads <= detail::kQsaMaxIdxHeads, "qsa_index_select: {} indexer heads (1..{})",
           index_heads, detail::kQsaMaxIdxHeads);
  FN_CHECK(c.index_dim % 2 == 0, "qsa_index_select: indexer dim {} must be even", c.index_dim);
  FN_CHECK(ldq >= int64_t(index_heads) * c.index_dim, "qsa_index_select: query row stride {} below {}", ldq,
           index_heads * c.index_dim);
  FN_CHECK(c.pooled_keys && qi && scores, "qsa_index_select: null pointer");
  const int max_blocks = b.max_context / c.block;
  const int64_t lds = std::max(1, max_blocks);
  FN_CUDA_CHECK(
      detail::launch_qsa_block_scores(qi, ldq, b.tok_seq, b.tok_pos, b.tokens, paging(c), c.pooled_keys, index_heads,
                                      c.index_dim, c.block, max_blocks, scores, lds, status, stream),
      "qsa_index_select scores");
  qsa_select_from_scores(scores, lds, b.tok_pos, b.tokens, c.block, top_blocks, selected, ld_sel, counts, stream);
}

QsaAttentionPlan qsa_attention_plan(int tokens, int heads, int kv_heads, int head_dim, int max_selected) {
  FN_CHECK(tokens >= 0 && kv_heads >= 1 && heads >= kv_heads && max_selected >= 1,
           "qsa_attention_plan: bad sizes tokens={} heads={} kv_heads={} max_selected={}", tokens, heads, kv_heads,
           max_selected);
  constexpr int kTargetBlocks = 264;  // about two blocks per multiprocessor on the GPUs we target
  constexpr int kTile = 64;
  QsaAttentionPlan p;
  const int64_t pairs = std::max<int64_t>(1, int64_t(tokens) * kv_heads);
  const int max_splits = (max_selected + kTile - 1) / kTile;
  p.splits = int(std::clamp<int64_t>((kTargetBlocks + pairs - 1) / pairs, 1, max_splits));
  p.split_len = ((max_selected + p.splits - 1) / p.splits + kTile - 1) / kTile * kTile;
  p.splits = (max_selected + p.split_len - 1) / p.split_len;
  p.partial_floats = p.splits > 1 ? int64_t(tokens) * heads * p.splits * (head_dim + 2) : 0;
  return p;
}

void qsa_sparse_attention(const QsaCache& c, const QsaBatch& b, const __half* q, int64_t ldq, int heads,
                          const int32_t* selected, int64_t ld_sel, const int32_t* counts, const QsaAttentionPlan& plan,
                          const __half* gate, int64_t ld_gate, int64_t gate_head_stride, float* partial, __half* out,
                          int64_t ldo, int32_t* status, cudaStream_t stream) {
  check_cache("qsa_sparse_attention", c);
  check_batch("qsa_sparse_attention", b);
  FN_CHECK(heads % c.kv_heads == 0 && heads / c.kv_heads <= detail::kQsaMaxGroup,
           "qsa_sparse_attention: {} query heads over {} KV heads (at most {} per KV head)", heads, c.kv_heads,
           detail::kQsaMaxGroup);
  const int64_t width = int64_t(heads) * c.head_dim;
  FN_CHECK(ldq >= width && ldo >= width, "qsa_sparse_attention: row strides {} / {} below {}", ldq, ldo, width);
  FN_CHECK(plan.splits >= 1 && plan.split_len >= 1, "qsa_sparse_attention: empty plan");
  FN_CHECK(plan.splits == 1 || partial, "qsa_sparse_attention: {} splits need the partial scratch", plan.splits);
  FN_CHECK(c.k && c.v && q && selected && counts && out, "qsa_sparse_attention: null pointer");
  FN_CUDA_CHECK(
      detail::launch_qsa_attention(q, ldq, b.tok_seq, b.tok_pos, selected, ld_sel, counts, b.tokens, paging(c), c.k,
                                   c.v, heads, c.kv_heads, c.head_dim, plan.splits, plan.split_len, gate, ld_gate,
                                   gate_head_stride, partial, out, ldo, status, stream),
      "qsa_sparse_attention");
}

void qsa_check_status(const int32_t* status, cudaStream_t stream) {
  FN_CUDA_CHECK(cudaStreamSynchronize(stream), "qsa_check_status");
  int32_t v = 0;
  FN_CUDA_CHECK(cudaMemcpy(&v, status, sizeof v, cudaMemcpyDeviceToHost), "qsa_check_status");
  if (v == 0) return;
  std::string what;
  if (v & detail::kQsaBadPage) what += "a page id outside the cache or a position beyond the block table; ";
  if (v & detail::kQsaBadPosition) what += "a negative position or a selected position after its query; ";
  if (v & detail::kQsaCountOverflow) what += "more selected tokens than the attention plan's max_selected; ";
  fail("QSA kernels met invalid cache indices (status {:#x}): {}those entries were skipped", v, what);
}

}  // namespace flashnext::cuda
