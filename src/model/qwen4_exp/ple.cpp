#include "model/qwen4_exp/ple.h"

#include <vector>

namespace flashnext {

std::vector<int64_t> ple_hash_rows(const PleLayerWeights& w, std::span<const BatchItem> items, int64_t layer,
                                   std::vector<std::vector<int64_t>>& next_history) {
  int64_t T = 0;
  for (const BatchItem& it : items) T += int64_t(it.ids.size());
  const int64_t heads = w.hash.heads();
  std::vector<int64_t> rows(size_t(T * heads));
  int64_t at = 0;
  next_history.clear();
  for (const BatchItem& it : items) {
    const std::vector<int64_t>& history = it.seq->ple_history[size_t(layer)];
    const std::vector<int64_t> ids64(it.ids.begin(), it.ids.end());
    w.hash.rows_for(history, ids64, rows.data() + at * heads);
    at += int64_t(ids64.size());
    next_history.push_back(ple_next_history(w, history, it.ids));
  }
  return rows;
}

std::vector<int64_t> ple_next_history(const PleLayerWeights& w, const std::vector<int64_t>& history,
                                      std::span<const int32_t> ids) {
  std::vector<int64_t> window = history;
  window.insert(window.end(), ids.begin(), ids.end());
  return {window.end() - w.hash.context_len(), window.end()};
}

std::vector<int64_t> ple_local_rows(const PleLayerWeights& w, std::span<const int64_t> rows) {
  if (w.rows_held.size() >= w.hash.rows) return {rows.begin(), rows.end()};
  const int64_t zero_row = w.rows_held.size();
  std::vector<int64_t> local;
  local.reserve(rows.size());
  for (const int64_t r : rows)
    local.push_back(r >= w.rows_held.begin && r < w.rows_held.end ? r - w.rows_held.begin : zero_row);
  return local;
}

Tensor ple_fetch(Ops& ops, const PleLayerWeights& w, const Tensor& rows) {
  // e = concatenated table rows, gathered while the layers before this one run.
  Tensor e = ops.empty({rows.dim(0), w.hash.heads() * w.table.head_dim});
  ops.ple_gather_start(w.table, rows, e);
  return e;
}

void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache, const Tensor& e,
             const StepBatch& batch, const Tensor& X, Communicator& comm, std::span<const KeepRows> keep) {
  const int64_t T = batch.num_tokens, H = cfg.hidden_size;
  ops.ple_gather_wait(e);
  comm.all_reduce_sum(e);  // tensor parallelism: every rank gathered the rows it holds
  // kn = grouped ZC-RMSNorm(key_proj e); v = value_proj e.
  Tensor kn = ops.empty({T, cfg.hc_width()}), v = ops.empty({T, H});
  const Tensor weights[] = {w.key_proj, w.value_proj}, outputs[] = {kn, v};
  ops.linear_group(e, weights, outputs);
  ops.zc_rms_norm(kn, w.norm_key, H, cfg.rms_norm_eps, kn);
  // P = per-stream sigmoid gate of (kn_b . qn_b) times v; X += P + silu(dilated conv(norm_conv(P))) per sequence.
  Tensor P = ops.empty({T, cfg.hc_width()});
  ops.ple_gate(kn, v, X, w.norm_query, cfg.rms_norm_eps, P);
  for (const KeepRows& k : keep) ops.copy_rows(P, k.first, k.into->ple, 0, k.n);
  ops.ple_conv_add_batch(P, w.norm_conv, H, w.conv1d, cfg.ngram_size, cfg.rms_norm_eps, cache.ple_conv, batch, X);
}

void ple_replay(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache, const StepBatch& batch,
                const StateInputs::Layer& kept) {
  ops.profile_phase("ple");
  const int64_t n = batch.num_tokens;
  Tensor X = ops.empty({n, cfg.hc_width()});  // receives P + conv, dropped
  ops.fill_zero(X);
  ops.ple_conv_add_batch(kept.ple.rows(0, n), w.norm_conv, cfg.hidden_size, w.conv1d, cfg.ngram_size, cfg.rms_norm_eps,
                         cache.ple_conv, batch, X);
}

}  // namespace flashnext
