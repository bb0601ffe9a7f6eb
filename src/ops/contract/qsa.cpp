// Contracts of the QSA attention ops (qsa.h).
#include "ops/contract/qsa.h"

namespace flashnext::contract {

namespace {
void rotary(const RopeParams& rope, int64_t dim, const char* op, const char* what) {
  FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= dim,
           "{}: rotary_dim {} invalid for {} {}", op, rope.rotary_dim, what, dim);
}
}  // namespace

PrepareQkDims qsa_prepare_qk(const Backend& b, const char* op, const Tensor& qg, const Tensor& k, const Tensor& q_norm,
                             const Tensor& k_norm, const RopeParams& rope, const Tensor& q, const Tensor& gate) {
  activation(b, qg, 2, op, "q_proj output");
  activation(b, k, 2, op, "k");
  weight(b, q_norm, 1, op, "q_norm");
  weight(b, k_norm, 1, op, "k_norm");
  activation(b, q, 2, op, "q");
  activation(b, gate, 2, op, "gate");
  const int64_t T = qg.dim(0), D = q_norm.dim(0);
  FN_CHECK(D > 0 && k_norm.dim(0) == D && qg.dim(1) % (2 * D) == 0 && k.dim(0) == T && k.dim(1) % D == 0 &&
               q.dim(0) == T && q.dim(1) * 2 == qg.dim(1) && gate.shape() == q.shape(),
           "{}: q_proj output {}, k {}, q {}, gate {} do not fit head_dim {}", op, qg.str(), k.str(), q.str(),
           gate.str(), D);
  rotary(rope, D, op, "head_dim");
  return {T, D, q.dim(1) / D, k.dim(1) / D};
}

PrepareQkDims qsa_prepare_qk_batch(const Backend& b, const Tensor& qg, const Tensor& k, const Tensor& q_norm,
                                   const Tensor& k_norm, const RopeParams& rope, const StepBatch& batch,
                                   const Tensor& q, const Tensor& gate) {
  const char* op = "qsa_prepare_qk_batch";
  step_rows(qg, batch, op, "q_proj output");
  return qsa_prepare_qk(b, op, qg, k, q_norm, k_norm, rope, q, gate);
}

IndexerDims qsa_indexer_select_batch(const Backend& b, const Tensor& qi, const Tensor& index_key_pool,
                                     const Tensor& pooled_key_pool, const Tensor& q_layernorm,
                                     const Tensor& k_layernorm, const RopeParams& rope, int64_t budget, int64_t block,
                                     const StepBatch& batch, const Tensor& selected) {
  const char* op = "qsa_indexer_select_batch";
  activation(b, qi, 2, op, "index queries");
  activation(b, index_key_pool, 2, op, "index key pool");
  activation(b, pooled_key_pool, 2, op, "pooled key pool");
  weight(b, q_layernorm, 1, op, "q_layernorm");
  weight(b, k_layernorm, 1, op, "k_layernorm");
  tensor(b, selected, DType::I32, 2, op, "selected");
  const int64_t T = qi.dim(0), Di = index_key_pool.dim(1), R = index_key_pool.dim(0), page = batch.block_size;
  FN_CHECK(block > 0 && budget > 0 && budget % block == 0, "{}: budget {} must be a positive multiple of block {}", op,
           budget, block);
  FN_CHECK(
      T == batch.num_tokens && Di > 0 && qi.dim(1) % Di == 0 && q_layernorm.dim(0) == Di && k_layernorm.dim(0) == Di &&
          selected.dim(0) == T && selected.dim(1) == budget + block - 1 && page > 0 && page % block == 0 &&
          R % page == 0 && pooled_key_pool.dim(0) == R / block && pooled_key_pool.dim(1) == Di,
      "{}: index queries {}, key pool {}, pooled pool {}, selected {} do not fit a step of {} tokens (blocks of "
      "{} positions, indexer block {}, budget {})",
      op, qi.str(), index_key_pool.str(), pooled_key_pool.str(), selected.str(), batch.num_tokens, page, block, budget);
  rotary(rope, Di, op, "indexer_head_dim");
  block_ids(R, batch, op, "the index key pool");
  return {T, Di, qi.dim(1) / Di, budget / block, selected.dim(1)};
}

AttentionDims sparse_attention(const Backend& b, const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& selected, const Tensor& gate, const Tensor& out) {
  activation(b, q, 3, op, "q");
  activation(b, k, 3, op, "k cache");
  activation(b, v, 3, op, "v cache");
  tensor(b, selected, DType::I32, 2, op, "selected");
  activation(b, gate, 3, op, "gate");
  activation(b, out, 3, op, "out");
  const int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), nkv = k.dim(1);
  FN_CHECK(v.shape() == k.shape() && k.dim(2) == D && nkv > 0 && nh % nkv == 0 && selected.dim(0) == T &&
               gate.shape() == q.shape() && out.shape() == q.shape() && selected.dim(1) > 0,
           "{}: q {}, caches {} / {}, selected {}, gate {}, out {} do not fit", op, q.str(), k.str(), v.str(),
           selected.str(), gate.str(), out.str());
  return {T, nh, nkv, D, selected.dim(1)};
}

AttentionDims sparse_attention_batch(const Backend& b, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                     const Tensor& selected, const Tensor& gate, const StepBatch& batch,
                                     const Tensor& out) {
  const char* op = "sparse_attention_batch";
  const AttentionDims d = sparse_attention(b, op, q, k_pool, v_pool, selected, gate, out);
  step_rows(q, batch, op, "q");
  block_ids(k_pool.dim(0), batch, op, "the K/V pool");
  return d;
}

}  // namespace flashnext::contract
