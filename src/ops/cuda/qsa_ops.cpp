// The CUDA backend's QSA attention ops: q/k preparation, the indexer's block selection over the paged raw keys (pooled
// key cache, torch-exact top-k on the GPU: no host round trip), and sparse attention over the paged K/V pools.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/contract/qsa.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/norm_kernels.h"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda {

namespace {

/// How the attention kernel splits each query's selection (a flash-decoding style split when there are few
/// (token, kv head) pairs to fill the GPU with): `splits` parts of `split_len` selected positions, partial results
/// in `partial_floats` floats of scratch (0 for one split).
struct QsaAttentionPlan {
  int splits = 1;
  int split_len = 0;
  int64_t partial_floats = 0;
};

/// Scratch the tile-union attention takes at most (its blocks' position words and union lists): 256 MiB, launches
/// of fewer groups beyond (a chunk of 8K queries at a 128K context would take twice that in one).
constexpr int64_t kQsaUnionScratchBytes = int64_t(256) << 20;

/// Rows of one sequence in a step from which the indexer's scores are tiled (32 rows a block share their keys).
constexpr int64_t kIndexerTiledMinRows = 32;

QsaAttentionPlan qsa_attention_plan(int tokens, int heads, int kv_heads, int head_dim, int max_selected) {
  constexpr int kTargetBlocks = 264;  // about two blocks per multiprocessor on the GPUs we target
  // Splits of whole tiles: a decode query's 2,051 selected positions are 65 splits of one tile (130 blocks for the
  // released 2 KV heads; splits of two tiles left half of an H100's SMs idle).
  constexpr int kTile = detail::kQsaAttentionTile;
  static_assert(kTargetBlocks <= detail::kQsaMaxSplits, "qsa_attention_plan: more splits than the combine takes");
  QsaAttentionPlan p;
  const int64_t pairs = std::max<int64_t>(1, int64_t(tokens) * kv_heads);
  const int max_splits = (max_selected + kTile - 1) / kTile;
  p.splits = int(std::clamp<int64_t>((kTargetBlocks + pairs - 1) / pairs, 1, max_splits));
  p.split_len = ((max_selected + p.splits - 1) / p.splits + kTile - 1) / kTile * kTile;
  p.splits = (max_selected + p.split_len - 1) / p.split_len;
  p.partial_floats = p.splits > 1 ? int64_t(tokens) * heads * p.splits * (head_dim + 2) : 0;
  return p;
}

}  // namespace

void CudaOps::qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                                   double eps, const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                                   const Tensor& gate) {
  const char* op = "qsa_prepare_qk_batch";
  const auto [T, D, nh, nkv] = contract::qsa_prepare_qk_batch(spec(), qg, k, q_norm, k_norm, rope, batch, q, gate);
  if (T == 0) return;
  // One launch: q, the gate (the second half of each head's q_proj output) and k in place.
  FN_CUDA_CHECK(detail::launch_qsa_prepare_qk(dp<const float>(qg), dp<float>(q), dp<float>(gate), dp<float>(k),
                                              dp<__half>(q_norm), dp<__half>(k_norm), dp<int32_t>(batch.positions),
                                              to_int(T, op, "tokens"), int(nh), int(nkv), int(D), int(rope.rotary_dim),
                                              float(rope.theta), float(eps), stream()),
                op);
}

void CudaOps::qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                       const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                       const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                       const Tensor& selected) {
  const char* op = "qsa_indexer_select_batch";
  const auto [T, Di, ni, max_blocks, width] = contract::qsa_indexer_select_batch(
      spec(), qi, index_key_pool, pooled_key_pool, q_layernorm, k_layernorm, rope, budget, block, batch, selected);
  FN_CHECK(Di <= 256 && ni * Di <= 2048,
           "{}: {} indexer heads of {} exceed the kernels' limits (dim <= 256, heads*dim <= 2048)", op, ni, Di);
  if (T == 0) return;
  const int t = to_int(T, op, "tokens");
  to_int(batch.max_context, op, "positions");
  const detail::QsaPagedIndex pi{dp<int32_t>(batch.token_seq),
                                 dp<int32_t>(batch.positions),
                                 dp<int32_t>(batch.block_tables),
                                 batch.max_blocks,
                                 to_int(batch.block_size, op, "block size"),
                                 int(block)};
  // Queries: RoPE(ZC-RMSNorm(qi_h; q_layernorm), p); pooled keys of the blocks this step completes.
  Tensor qn = alloc(qi.shape(), DType::F32, "indexer queries");
  FN_CUDA_CHECK(detail::launch_head_norm_rope(dp<const float>(qi), ni * Di, Di, dp<float>(qn), ni * Di, Di,
                                              dp<__half>(q_layernorm), dp<int32_t>(batch.positions), t, int(ni),
                                              int(Di), int(rope.rotary_dim), float(rope.theta), float(eps), stream()),
                "qsa_indexer_select_batch queries");
  FN_CUDA_CHECK(detail::launch_qsa_pool_blocks_paged_f32(
                    pi, dp<const float>(index_key_pool), t, int(Di), dp<__half>(k_layernorm), int(rope.rotary_dim),
                    float(rope.theta), float(eps), dp<float>(pooled_key_pool), stream()),
                "qsa_indexer_select_batch pooled keys");
  // Queries with at most max_blocks complete blocks take them all. The top-k kernels are left out only while the
  // step's max_context says that no query can need them (not the positions themselves: a recorded decode step,
  // whose max_context is bucketed, keeps its kernels while the positions move; the top-k kernel skips a query that
  // takes every block, and the expansion then takes them all, as without it).
  const int64_t first_topk_position = (max_blocks + 1) * block - 1;
  if (batch.max_context - 1 < first_topk_position) {
    FN_CUDA_CHECK(detail::launch_qsa_expand_selection_paged(pi, nullptr, int(max_blocks), 0, t, dp<int32_t>(selected),
                                                            width, stream()),
                  "qsa_indexer_select_batch expand");
    return;
  }
  // Scores, torch.topk's choice (its tie behaviour decides among the equal zero scores that relu produces:
  // launch_qsa_topk_paged) and the expansion, all on the GPU without a host round trip. Rows in chunks of
  // bounded score memory.
  const int64_t ld = std::max<int64_t>(batch.max_context / block, 1);
  // Scores tiled over runs of rows of one sequence (prefill chunks), a warp per key of one query otherwise (decode).
  const bool tiled_scores = batch.max_rows() >= kIndexerTiledMinRows;
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(1) << 24) / ld);
  for (int64_t t0 = 0; t0 < T; t0 += rows_per_chunk) {
    const int64_t t1 = std::min(T, t0 + rows_per_chunk), n = t1 - t0;
    Tensor sc = alloc({n, ld}, DType::F32, "indexer scores");
    Tensor top = alloc({n, max_blocks}, DType::I32, "indexer top blocks");
    Tensor scratch = alloc({n, ld, 2}, DType::I32, "indexer top-k scratch");  // (score, index) items
    FN_CUDA_CHECK(detail::launch_qsa_block_scores_paged_f32(pi, dp<const float>(qn), int(ni), int(Di),
                                                            dp<const float>(pooled_key_pool), int(t0), int(t1),
                                                            dp<float>(sc), ld, tiled_scores, stream()),
                  "qsa_indexer_select_batch scores");
    FN_CUDA_CHECK(detail::launch_qsa_topk_paged(pi, dp<const float>(sc), ld, int(max_blocks), int(t0), int(t1),
                                                static_cast<topk::Scored*>(scratch.data()), dp<int32_t>(top), stream()),
                  "qsa_indexer_select_batch top-k");
    FN_CUDA_CHECK(detail::launch_qsa_expand_selection_paged(pi, dp<int32_t>(top), int(max_blocks), int(t0), int(t1),
                                                            dp<int32_t>(selected), width, stream()),
                  "qsa_indexer_select_batch expand");
  }
}

/// Valid selections packed to the front with their counts, then one attention launch that maps each selected
/// logical position through the sequence's block table; positions at or beyond the step's longest context are
/// invalid (recorded in the status words). The launch: the tile-union kernel (groups of consecutive queries of a
/// sequence over their selections' union) for steps with a sequence of at least kQsaTileUnionMinRows rows and a full
/// wave of its blocks where it runs (QsaAttentionKernel), else the per-query kernel.
void CudaOps::sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                     const Tensor& selected, const Tensor& gate, double scale, const StepBatch& batch,
                                     const Tensor& out) {
  const char* op = "sparse_attention_batch";
  const auto [T, nh, nkv, D, n_sel] =
      contract::sparse_attention_batch(spec(), q, k_pool, v_pool, selected, gate, batch, out);
  FN_CHECK(D <= detail::kQsaMaxDim && nh / nkv <= detail::kQsaMaxGroup,
           "{}: head_dim {} (at most {}) and {} query heads per KV head (at most {}) exceed the kernel's limits", op, D,
           detail::kQsaMaxDim, nh / nkv, detail::kQsaMaxGroup);
  FN_CHECK(std::fabs(scale * std::sqrt(double(D)) - 1.0) < 1e-6,
           "{}: the CUDA kernel scales scores by 1/sqrt(head_dim) = {}, asked for {}", op, 1.0 / std::sqrt(double(D)),
           scale);
  if (T == 0) return;
  const int t = to_int(T, op, "tokens");
  const int64_t rows = k_pool.dim(0), bs = batch.block_size;
  const detail::QsaPaging pg{dp<int32_t>(batch.block_tables), batch.max_blocks, to_int(rows / bs, op, "blocks"),
                             to_int(bs, op, "block size")};
  Tensor compact = alloc(selected.shape(), DType::I32, "selection");
  Tensor counts = alloc({T}, DType::I32, "selection counts");
  FN_CUDA_CHECK(
      detail::launch_compact_selection(dp<int32_t>(selected), t, int(n_sel), batch.max_context, dp<int32_t>(compact),
                                       dp<int32_t>(counts), status(kStatusSelection), stream()),
      op);
  const detail::QsaUnionPlan up = qsa_union_plan(batch, int(nh), int(nkv), int(D), k_pool, v_pool);
  int64_t groups = 0;
  for (int64_t s = 0; up.qpc > 0 && s < batch.num_seqs; ++s) groups += (batch.rows_of(s) + up.qpc - 1) / up.qpc;
  // Auto: the tile-union kernel for a full wave of its blocks (one an SM); fewer blocks, each over a whole union
  // without the per-query kernel's splits, leave the GPU idle (a short chunk at a long context).
  const bool tile_union =
      up.qpc > 0 && (options_.qsa_attention == QsaAttentionKernel::TileUnion || groups * nkv >= up.multiprocessors);
  if (tile_union) {
    // Scratch of a block: a word per 4 positions of the group's context, and the union (at most the group's
    // selections or the positions); launches of as many groups as kQsaUnionScratchBytes holds.
    const int64_t words_ld = (batch.max_context / 4 + 4) & ~int64_t(3);
    const int64_t list_ld = std::min<int64_t>(up.qpc * n_sel, batch.max_context);
    const int64_t group_batch =
        std::clamp<int64_t>(kQsaUnionScratchBytes / (4 * nkv * (words_ld + 2 * list_ld)), 1, groups);
    Tensor words = alloc({group_batch * nkv, words_ld}, DType::I32, "attention union words");
    Tensor lists = alloc({group_batch * nkv, list_ld, 2}, DType::I32, "attention union lists");
    FN_CUDA_CHECK(
        detail::launch_qsa_union_attention(
            up, dp<const float>(q), nh * D, dp<int32_t>(batch.seq_starts), int(batch.num_seqs),
            to_int(groups, op, "groups"), dp<int32_t>(batch.positions), dp<int32_t>(compact), n_sel,
            dp<int32_t>(counts), pg, dp<const float>(k_pool), dp<const float>(v_pool), int(nh), int(nkv), int(D),
            dp<const float>(gate), nh * D, D, dp<float>(out), nh * D, static_cast<uint32_t*>(words.data()), words_ld,
            static_cast<uint2*>(lists.data()), list_ld, int(group_batch), status(kStatusQsa), stream()),
        op);
    return;
  }
  const QsaAttentionPlan plan = qsa_attention_plan(t, int(nh), int(nkv), int(D), int(n_sel));
  Tensor partial = alloc({std::max<int64_t>(plan.partial_floats, 1)}, DType::F32, "attention partials");
  FN_CUDA_CHECK(
      detail::launch_qsa_attention(dp<const float>(q), nh * D, dp<int32_t>(batch.token_seq),
                                   dp<int32_t>(batch.positions), dp<int32_t>(compact), n_sel, dp<int32_t>(counts), t,
                                   pg, dp<const float>(k_pool), dp<const float>(v_pool), int(nh), int(nkv), int(D),
                                   plan.splits, plan.split_len, dp<const float>(gate), nh * D, D, dp<float>(partial),
                                   dp<float>(out), nh * D, status(kStatusQsa), stream()),
      op);
}

detail::QsaUnionPlan CudaOps::qsa_union_plan(const StepBatch& batch, int heads, int kv_heads, int dim,
                                             const Tensor& k_pool, const Tensor& v_pool) const {
  if (options_.qsa_attention == QsaAttentionKernel::PerQuery) return {};
  if (options_.qsa_attention == QsaAttentionKernel::Auto) {
    if (batch.max_rows() < kQsaTileUnionMinRows) return {};
  }
  // Cache rows as int32 in the union lists; float4 loads of the caches.
  if (k_pool.dim(0) > std::numeric_limits<int32_t>::max() || reinterpret_cast<uintptr_t>(k_pool.data()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(v_pool.data()) % 16 != 0)
    return {};
  return detail::qsa_union_plan(heads, kv_heads, dim);
}

}  // namespace flashnext::cuda
