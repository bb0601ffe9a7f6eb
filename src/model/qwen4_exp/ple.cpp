#include "model/qwen4_exp/ple.h"

#include <vector>

namespace flashnext {

void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerState& state,
             std::span<const int32_t> ids, const Tensor& X) {
  const int64_t T = int64_t(ids.size()), H = cfg.hidden_size, heads = w.hash.heads();
  // Row ids of every (token, head) from the n-gram hash, on the host; then advance the token history.
  const std::vector<int64_t> ids64(ids.begin(), ids.end());
  std::vector<int64_t> rows(size_t(T * heads));
  w.hash.rows_for(state.ple_history, ids64, rows.data());
  std::vector<int64_t> window = state.ple_history;
  window.insert(window.end(), ids64.begin(), ids64.end());
  state.ple_history.assign(window.end() - w.hash.context_len(), window.end());
  // e = concatenated table rows; kn = grouped ZC-RMSNorm(key_proj e); v = value_proj e.
  Tensor e = ops.empty({T, heads * w.table.head_dim});
  ops.ple_gather(w.table, ops.upload(rows.data(), DType::I64, {T, heads}), e);
  Tensor kn = ops.empty({T, cfg.hc_width()}), v = ops.empty({T, H});
  ops.linear(e, w.key_proj, kn);
  ops.zc_rms_norm(kn, w.norm_key, H, cfg.rms_norm_eps, kn);
  ops.linear(e, w.value_proj, v);
  // P = per-stream sigmoid gate of (kn_b . qn_b) times v; X += P + silu(dilated conv(norm_conv(P))).
  Tensor P = ops.empty({T, cfg.hc_width()});
  ops.ple_gate(kn, v, X, w.norm_query, cfg.rms_norm_eps, P);
  ops.ple_conv_add(P, w.norm_conv, H, w.conv1d, cfg.ngram_size, cfg.rms_norm_eps, state.ple_conv, X);
}

}  // namespace flashnext
