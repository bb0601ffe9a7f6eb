// Contracts of the QSA attention ops of ops/ops.h: qsa_prepare_qk_batch, qsa_indexer_select_batch,
// sparse_attention_batch, and the one-sequence forms the CPU oracle computes them with.
#pragma once

#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// q/k preparation: qg [T, nh*2D], k [T, nkv*D], q_norm / k_norm [D] weights, q and gate [T, nh*D]; rotary_dim
/// even, in (0, D].
struct PrepareQkDims {
  int64_t tokens, head_dim, heads, kv_heads;
};
PrepareQkDims qsa_prepare_qk(const Backend& b, const char* op, const Tensor& qg, const Tensor& k, const Tensor& q_norm,
                             const Tensor& k_norm, const RopeParams& rope, const Tensor& q, const Tensor& gate);
/// The same over a step's rows.
PrepareQkDims qsa_prepare_qk_batch(const Backend& b, const Tensor& qg, const Tensor& k, const Tensor& q_norm,
                                   const Tensor& k_norm, const RopeParams& rope, const StepBatch& batch,
                                   const Tensor& q, const Tensor& gate);

/// qsa_indexer_select_batch: qi [T, ni*Di], index_key_pool [R, Di] F32 with R a multiple of batch.block_size,
/// pooled_key_pool [R / block, Di] F32, q_layernorm / k_layernorm [Di] weights, selected [T, budget + block - 1]
/// I32; budget a positive multiple of block, block_size a multiple of block, rotary_dim even in (0, Di], every
/// block id of the step inside the pool.
struct IndexerDims {
  int64_t tokens, head_dim, heads, max_blocks, width;
};
IndexerDims qsa_indexer_select_batch(const Backend& b, const Tensor& qi, const Tensor& index_key_pool,
                                     const Tensor& pooled_key_pool, const Tensor& q_layernorm,
                                     const Tensor& k_layernorm, const RopeParams& rope, int64_t budget, int64_t block,
                                     const StepBatch& batch, const Tensor& selected);

/// Sparse attention: q, gate, out [T, nh, D], k / v caches [rows, nkv, D] F32 (nh a multiple of nkv), selected
/// [T, n_sel] I32 with n_sel > 0.
struct AttentionDims {
  int64_t tokens, heads, kv_heads, head_dim, selected;
};
AttentionDims sparse_attention(const Backend& b, const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& selected, const Tensor& gate, const Tensor& out);
/// The same over a step's rows, with k_pool / v_pool made of blocks the step's block ids address.
AttentionDims sparse_attention_batch(const Backend& b, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                     const Tensor& selected, const Tensor& gate, const StepBatch& batch,
                                     const Tensor& out);

}  // namespace flashnext::contract
