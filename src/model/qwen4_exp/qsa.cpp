#include "model/qwen4_exp/qsa.h"

#include <algorithm>
#include <cmath>

namespace flashnext {

void qsa_reserve(Ops& ops, const ModelConfig& cfg, LayerState& state, int64_t rows, int64_t keep) {
  if (rows <= state.capacity) return;
  const int64_t cap = std::min(cfg.max_position_embeddings, std::max({rows, int64_t(64), 2 * state.capacity}));
  const int64_t nkv = cfg.num_key_value_heads, D = cfg.head_dim;
  Tensor k = ops.empty({cap, nkv, D}), v = ops.empty({cap, nkv, D}), ik = ops.empty({cap, cfg.indexer_head_dim});
  if (keep > 0) {
    ops.copy_rows(state.k_cache, 0, k, 0, keep);
    ops.copy_rows(state.v_cache, 0, v, 0, keep);
    ops.copy_rows(state.index_keys, 0, ik, 0, keep);
  }
  state.k_cache = k;
  state.v_cache = v;
  state.index_keys = ik;
  state.capacity = cap;
}

Tensor qsa_attention(Ops& ops, const ModelConfig& cfg, const QsaLayerWeights& w, LayerState& state, const Tensor& u,
                     int64_t pos0) {
  const int64_t T = u.dim(0), nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, D = cfg.head_dim;
  const int64_t Di = cfg.indexer_head_dim, c = cfg.indexer_compress_ratio, end = pos0 + T;
  const RopeParams rope{cfg.rotary_dim(), cfg.rope.theta};
  // q_proj -> per head [query | gate]; q, k: per-head ZC-RMSNorm then partial RoPE; v as projected.
  Tensor qg = ops.empty({T, nh * 2 * D}), k = ops.empty({T, nkv * D}), v = ops.empty({T, nkv * D});
  ops.linear(u, w.q_proj, qg, w.q_bias);
  ops.linear(u, w.k_proj, k, w.k_bias);
  ops.linear(u, w.v_proj, v, w.v_bias);
  Tensor q = ops.empty({T, nh * D}), gate = ops.empty({T, nh * D});
  ops.qsa_prepare_qk(qg, k, w.q_norm, w.k_norm, cfg.rms_norm_eps, rope, pos0, q, gate);
  // Indexer projections: queries [T, ni*Di]; raw keys [T, Di] are cached as they are.
  Tensor qi = ops.empty({T, cfg.indexer_n_heads * Di}), ki = ops.empty({T, Di});
  ops.linear(u, w.index_q_proj, qi);
  ops.linear(u, w.index_k_proj, ki);
  // Append this chunk to the caches (row = logical position).
  qsa_reserve(ops, cfg, state, end, pos0);
  ops.copy_rows(k.view({T, nkv, D}), 0, state.k_cache, pos0, T);
  ops.copy_rows(v.view({T, nkv, D}), 0, state.v_cache, pos0, T);
  ops.copy_rows(ki, 0, state.index_keys, pos0, T);
  // Token selection: top blocks by indexer score plus the incomplete tail block.
  Tensor selected = ops.empty({T, cfg.indexer_budget + c - 1}, DType::I32);
  ops.qsa_indexer_select(qi, state.index_keys.rows(0, end), w.index_q_norm, w.index_k_norm, cfg.rms_norm_eps, rope,
                         pos0, cfg.indexer_budget, c, selected);
  // Softmax attention over the selected tokens only, gated by sigmoid(gate); then o_proj.
  Tensor o = ops.empty({T, nh, D});
  ops.sparse_attention(q.view({T, nh, D}), state.k_cache.rows(0, end), state.v_cache.rows(0, end), selected,
                       gate.view({T, nh, D}), 1.0 / std::sqrt(double(D)), o);
  Tensor out = ops.empty({T, cfg.hidden_size});
  ops.linear(o.view({T, nh * D}), w.o_proj, out, w.o_bias);
  return out;
}

}  // namespace flashnext
