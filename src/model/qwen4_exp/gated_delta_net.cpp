#include "model/qwen4_exp/gated_delta_net.h"

namespace flashnext {

GdnDims gdn_dims(const ModelConfig& cfg) {
  return GdnDims{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                 cfg.linear_value_head_dim};
}

Tensor gated_delta_net(Ops& ops, const ModelConfig& cfg, const GdnLayerWeights& w, LayerCache& cache,
                       const StepBatch& batch, const Tensor& u, std::span<const KeepRows> keep) {
  const int64_t T = u.dim(0);
  const GdnDims dims = gdn_dims(cfg);
  const int64_t nv = dims.num_v_heads, value_dim = nv * dims.v_head_dim;
  // Projections: qkv (q | k | v), output gate z, beta logits b, decay input a.
  ops.profile_phase("gdn_proj");
  Tensor qkv = ops.empty({T, dims.conv_dim()}), z = ops.empty({T, value_dim});
  Tensor b = ops.empty({T, nv}), a = ops.empty({T, nv});
  const Tensor weights[] = {w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a}, outputs[] = {qkv, z, b, a};
  ops.linear_group(u, weights, outputs);
  for (const KeepRows& k : keep) {  // before the conv, which works in place
    ops.copy_rows(qkv, k.first, k.into->qkv, 0, k.n);
    ops.copy_rows(a, k.first, k.into->a, 0, k.n);
    ops.copy_rows(b, k.first, k.into->b, 0, k.n);
  }
  // silu(causal depthwise conv1d(qkv)) continuing the conv tail, the gated delta rule over each sequence's tokens
  // continuing its recurrent state (the recurrence for a decode token, the chunked form for a prefill chunk), then
  // the gated RMSNorm per value head.
  ops.profile_phase("gdn_rule");
  Tensor o = ops.empty({T, value_dim});
  const GdnOutputNorm norm{z, w.norm, cfg.rms_norm_eps,
                           cfg.output_gate_type == "sigmoid" ? GateAct::Sigmoid : GateAct::Silu};
  ops.gdn_mix_batch(qkv, w.conv1d, cache.conv, a, b, w.rule, dims, cache.recurrent, batch, norm, o);
  ops.profile_phase("gdn_proj");
  Tensor out = ops.empty({T, cfg.hidden_size});
  ops.linear(o, w.out_proj, out);
  return out;
}

void gated_delta_net_replay(Ops& ops, const ModelConfig& cfg, const GdnLayerWeights& w, LayerCache& cache,
                            const StepBatch& batch, const StateInputs::Layer& kept) {
  ops.profile_phase("gdn_rule");
  const int64_t n = batch.num_tokens;
  const GdnDims dims = gdn_dims(cfg);
  Tensor qkv = ops.empty({n, dims.conv_dim()}), o = ops.empty({n, dims.num_v_heads * dims.v_head_dim});
  ops.copy_rows(kept.qkv, 0, qkv, 0, n);
  ops.gdn_mix_batch(qkv, w.conv1d, cache.conv, kept.a.rows(0, n), kept.b.rows(0, n), w.rule, dims, cache.recurrent,
                    batch, GdnOutputNorm{}, o);
}

}  // namespace flashnext
