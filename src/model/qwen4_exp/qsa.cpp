#include "model/qwen4_exp/qsa.h"

#include <algorithm>
#include <cmath>

namespace flashnext {

Tensor qsa_attention(Ops& ops, const ModelConfig& cfg, const QsaLayerWeights& w, LayerCache& cache,
                     const StepBatch& batch, const Tensor& u) {
  const int64_t T = u.dim(0), nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, D = cfg.head_dim;
  const int64_t Di = cfg.indexer_head_dim, c = cfg.indexer_compress_ratio;
  const RopeParams rope{cfg.rotary_dim(), cfg.rope.theta};
  // q_proj -> per head [query | gate]; q, k: per-head ZC-RMSNorm then partial RoPE; v as projected.
  ops.profile_phase("qsa_proj");
  // Indexer projections too: queries [T, ni*Di]; raw keys [T, Di] are cached as they are.
  Tensor qg = ops.empty({T, nh * 2 * D}), k = ops.empty({T, nkv * D}), v = ops.empty({T, nkv * D});
  Tensor qi = ops.empty({T, cfg.indexer_n_heads * Di}), ki = ops.empty({T, Di});
  const Tensor weights[] = {w.q_proj, w.k_proj, w.v_proj, w.index_q_proj, w.index_k_proj};
  const Tensor outputs[] = {qg, k, v, qi, ki}, biases[] = {w.q_bias, w.k_bias, w.v_bias, Tensor(), Tensor()};
  ops.linear_group(u, weights, outputs, biases);
  Tensor q = ops.empty({T, nh * D}), gate = ops.empty({T, nh * D});
  ops.qsa_prepare_qk_batch(qg, k, w.q_norm, w.k_norm, cfg.rms_norm_eps, rope, batch, q, gate);
  // Write the step's tokens into their KV blocks.
  ops.scatter_rows(k.view({T, nkv, D}), batch.slot_mapping, cache.k);
  ops.scatter_rows(v.view({T, nkv, D}), batch.slot_mapping, cache.v);
  ops.scatter_rows(ki, batch.slot_mapping, cache.index_keys);
  // Token selection: top blocks by indexer score plus the incomplete tail block.
  ops.profile_phase("qsa_indexer");
  Tensor selected = ops.empty({T, cfg.indexer_budget + c - 1}, DType::I32);
  ops.qsa_indexer_select_batch(qi, cache.index_keys, cache.pooled_keys, w.index_q_norm, w.index_k_norm,
                               cfg.rms_norm_eps, rope, cfg.indexer_budget, c, batch, selected);
  // Softmax attention over the selected tokens only, gated by sigmoid(gate); then o_proj.
  ops.profile_phase("qsa_attention");
  Tensor o = ops.empty({T, nh, D});
  ops.sparse_attention_batch(q.view({T, nh, D}), cache.k, cache.v, selected, gate.view({T, nh, D}),
                             1.0 / std::sqrt(double(D)), batch, o);
  ops.profile_phase("qsa_proj");
  Tensor out = ops.empty({T, cfg.hidden_size});
  ops.linear(o.view({T, nh * D}), w.o_proj, out, w.o_bias);
  return out;
}

}  // namespace flashnext
