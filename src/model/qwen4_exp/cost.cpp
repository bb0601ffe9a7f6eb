#include "model/qwen4_exp/cost.h"

#include <algorithm>
#include <cmath>

#include "loader/sharding.h"
#include "model/qwen4_exp/model.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

namespace {

double bytes(const Tensor& t) {  // an 8-bit weight's float32 scales included
  return t.defined() ? double(t.nbytes()) + (t.has_scales() ? double(t.scales().nbytes()) : 0.0) : 0.0;
}
double elems(const Tensor& t) {
  return t.defined() ? double(t.numel()) : 0.0;
}

/// Bytes and multiply-adds per token of the linear weights in `ts`.
struct Dense {
  double bytes = 0, params = 0;
  void add(const Tensor& t) {
    bytes += flashnext::bytes(t);
    params += elems(t);
  }
  void add(const HcWeights& h) {
    for (const Tensor* t : {&h.norm, &h.down, &h.up, &h.inject}) add(*t);
  }
};

}  // namespace

StepCost step_cost(const Model& model, std::span<const StepWork> work, int64_t logit_rows, double experts_hit) {
  // Under tensor parallelism: what rank 0 (GPU 0) moves and computes: its weights (Model::weights) and its geometry
  // (its GDN / QSA heads and expert widths, TpPlan::rank_config); the indexer and the PLE conv state are replicated.
  const int tp = model.tp();
  const ModelConfig c = tp > 1 ? TpPlan::make(model.config(), tp).rank_config(0) : model.config();
  const ModelWeights& w = model.weights();
  StepCost cost;
  int64_t T = 0;
  for (const StepWork& s : work) T += s.tokens;
  const double E = double(c.num_experts), k = double(c.num_experts_per_tok);
  cost.experts_hit = experts_hit > 0 ? experts_hit : E * (1.0 - std::pow(1.0 - k / E, double(T)));

  // Weights: every dense weight once; lm_head for logit_rows rows; embedding rows of the step's tokens.
  Dense dense;
  dense.add(w.mixer);
  double expert_flops = 0;  // multiply-adds per token of the routed experts (top_k of them)
  for (const LayerWeights& lw : w.layers) {
    dense.add(lw.attn_hc);
    dense.add(lw.mlp_hc);
    if (lw.kind == LayerKind::GatedDeltaNet) {
      const GdnLayerWeights& g = lw.gdn;
      for (const Tensor* t : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a, &g.conv1d, &g.norm,
                              &g.out_proj, &g.rule.A_log, &g.rule.dt_bias})
        dense.add(*t);
    } else {
      const QsaLayerWeights& q = lw.qsa;
      for (const Tensor* t : {&q.q_proj, &q.k_proj, &q.v_proj, &q.o_proj, &q.q_bias, &q.k_bias, &q.v_bias,
                              &q.o_bias, &q.q_norm, &q.k_norm, &q.index_q_proj, &q.index_k_proj, &q.index_q_norm,
                              &q.index_k_norm})
        dense.add(*t);
    }
    const MoeWeights& m = lw.moe;
    for (const Tensor* t : {&m.router, &m.shared_gate_proj, &m.shared_up_proj, &m.shared_down_proj,
                            &m.shared_expert_gate})
      dense.add(*t);
    const double per_expert_bytes =
        m.packed ? double(m.packed->device_bytes()) / E : (bytes(m.gate) + bytes(m.up) + bytes(m.down)) / E;
    cost.weight_bytes += cost.experts_hit * per_expert_bytes;
    expert_flops += k * 3.0 * double(c.moe_intermediate_size) * double(c.hidden_size);
    if (lw.ple) {
      const PleLayerWeights& p = *lw.ple;
      for (const Tensor* t : {&p.key_proj, &p.value_proj, &p.norm_key, &p.norm_query, &p.norm_conv, &p.conv1d})
        dense.add(*t);
      // Under tensor parallelism each rank gathers the rows of its share of the table: 1/tp of them on average.
      // An int8 table also reads each row's group scales.
      const double row_bytes = p.table.shards.empty()
                                   ? 0.0
                                   : double(p.table.head_dim) * double(dtype_size(p.table.shards[0].dtype())) +
                                         (p.table.group > 0 && !p.table.group_scales.empty()
                                              ? double(p.table.head_dim / p.table.group) *
                                                    double(dtype_size(p.table.group_scales[0].dtype()))
                                              : 0.0);
      cost.host_bytes += double(T) * double(p.hash.heads()) * row_bytes / double(tp);
    }
  }
  const double embed_row = w.embed_tokens.defined() ? bytes(w.embed_tokens) / double(c.vocab_size) : 0.0;
  cost.weight_bytes += dense.bytes + bytes(w.lm_head) + double(T) * embed_row;
  cost.flops += 2.0 * double(T) * (dense.params + expert_flops) + 2.0 * double(logit_rows) * elems(w.lm_head);

  // Caches and attention: per QSA layer and query at position p, the selected tokens (top blocks + tail).
  const int64_t cb = c.indexer_compress_ratio, budget_blocks = c.indexer_budget / std::max<int64_t>(cb, 1);
  const double nh = double(c.num_attention_heads), nkv = double(c.num_key_value_heads), D = double(c.head_dim);
  const double ni = double(c.indexer_n_heads), Di = double(c.indexer_head_dim);
  const double cache_elem = 4.0;  // the KV and indexer-key caches are float32 (state.h)
  const int64_t qsa_layers = c.num_layers_of(LayerKind::QSA), gdn_layers = c.num_layers_of(LayerKind::GatedDeltaNet);
  double selected = 0, blocks = 0, pooled_bytes = 0;
  for (const StepWork& s : work) {
    for (int64_t p = s.context; p < s.context + s.tokens; ++p) {
      const int64_t nb = (p + 1) / cb;
      selected += double(std::min(nb, budget_blocks) * cb + (p + 1 - nb * cb));
      blocks += double(nb);
    }
    pooled_bytes += double((s.context + s.tokens) / cb) * Di * cache_elem;
  }
  cost.flops += double(qsa_layers) * (4.0 * nh * D * selected + 2.0 * ni * Di * blocks);
  cost.cache_bytes += double(qsa_layers) * (selected * 2.0 * nkv * D * cache_elem + pooled_bytes);
  const double nv = double(c.linear_num_value_heads), dk = double(c.linear_key_head_dim),
               dv = double(c.linear_value_head_dim);
  cost.flops += double(gdn_layers) * double(T) * nv * (7.0 * dk * dv + 4.0 * 64.0 * dk);
  const double seqs = double(work.size());
  const double gdn_state = nv * dk * dv * 4.0 + double(c.linear_conv_kernel_dim - 1) * double(c.gdn_conv_dim()) * 4.0;
  cost.cache_bytes += 2.0 * seqs * double(gdn_layers) * gdn_state;
  int64_t ple_layers = 0;
  for (const LayerWeights& lw : w.layers) ple_layers += lw.ple ? 1 : 0;
  cost.cache_bytes += 2.0 * seqs * double(ple_layers) * double(c.ple_conv_state_len()) * double(c.hc_width()) * 4.0;
  return cost;
}

}  // namespace flashnext
