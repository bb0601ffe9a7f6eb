#include "model/qwen4_exp/model.h"

#include "core/error.h"
#include "loader/manifest.h"
#include "loader/safetensors.h"
#include "model/qwen4_exp/gated_delta_net.h"
#include "model/qwen4_exp/hyper_connection.h"
#include "model/qwen4_exp/moe.h"
#include "model/qwen4_exp/ple.h"
#include "model/qwen4_exp/qsa.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = load_config(dir);
  m->ops_ = options.ops ? options.ops : make_cpu_ops(options.threads);
  auto checkpoint = std::make_shared<const Checkpoint>(dir);
  const WeightManifest manifest = WeightManifest::build(m->config_, *checkpoint);
  m->weights_ = std::make_unique<ModelWeights>(load_weights(m->config_, manifest, checkpoint, *m->ops_));
  return m;
}

SequenceState Model::new_sequence() const {
  const ModelConfig& c = config_;
  SequenceState s;
  s.layers.resize(size_t(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerState& ls = s.layers[size_t(l)];
    if (c.layer_types[size_t(l)] == LayerKind::GatedDeltaNet) {
      ls.conv = ops_->zeros({c.linear_conv_kernel_dim - 1, c.gdn_conv_dim()});
      ls.recurrent = ops_->zeros({c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim});
    }
    if (c.ple_index_of_layer(l) >= 0) {
      ls.ple_history.assign(size_t(c.ngram_size - 1), c.ple_boundary_token());
      ls.ple_conv = ops_->zeros({c.ple_conv_state_len(), c.hc_width()});
    }
  }
  return s;
}

SequenceState Model::clone_sequence(const SequenceState& seq) const {
  auto copy = [&](const Tensor& t, int64_t rows) {
    if (!t.defined()) return Tensor();
    Tensor out = ops_->empty(t.shape(), t.dtype());
    ops_->copy_rows(t, 0, out, 0, rows);
    return out;
  };
  SequenceState s;
  s.length = seq.length;
  for (const LayerState& ls : seq.layers) {
    LayerState n;
    n.capacity = ls.capacity;
    n.k_cache = copy(ls.k_cache, seq.length);
    n.v_cache = copy(ls.v_cache, seq.length);
    n.index_keys = copy(ls.index_keys, seq.length);
    n.conv = copy(ls.conv, ls.conv.defined() ? ls.conv.dim(0) : 0);
    n.recurrent = copy(ls.recurrent, ls.recurrent.defined() ? ls.recurrent.dim(0) : 0);
    n.ple_history = ls.ple_history;
    n.ple_conv = copy(ls.ple_conv, ls.ple_conv.defined() ? ls.ple_conv.dim(0) : 0);
    s.layers.push_back(std::move(n));
  }
  return s;
}

void Model::check_ids(const SequenceState& seq, std::span<const int32_t> ids) const {
  if (ids.empty()) fail("forward: empty input: at least one token id is required");
  FN_CHECK(int64_t(seq.layers.size()) == config_.num_hidden_layers,
           "forward: the sequence state has {} layers, the model {}: use Model::new_sequence()", seq.layers.size(),
           config_.num_hidden_layers);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      fail("forward: token id {} at index {} is outside the vocabulary [0, {})", ids[i], i, config_.vocab_size);
    }
  }
  if (seq.length + int64_t(ids.size()) > config_.max_position_embeddings) {
    fail("forward: the sequence would reach {} tokens ({} already + {} new), more than max_position_embeddings = {}",
         seq.length + int64_t(ids.size()), seq.length, ids.size(), config_.max_position_embeddings);
  }
}

Tensor Model::forward_tensor(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode,
                             const HiddenHook& hook) {
  check_ids(seq, ids);
  Ops& ops = *ops_;
  const ModelConfig& c = config_;
  const ModelWeights& w = *weights_;
  const int64_t T = int64_t(ids.size()), H = c.hidden_size, L = c.num_hidden_layers, pos0 = seq.length;
  const double eps = c.rms_norm_eps;

  // x0 = embed_tokens[ids], replicated into the S hyper-connection streams.
  Tensor X = ops.empty({T, c.hc_width()});
  ops.embedding(w.embed_tokens, ops.upload(ids.data(), DType::I32, {T}), X);
  if (hook) hook(0, X);

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    LayerState& st = seq.layers[size_t(l)];
    if (lw.ple) ple_add(ops, c, *lw.ple, st, ids, X);
    HcRead r = gated_residual_read(ops, X, lw.attn_hc, H, eps);
    Tensor out = lw.kind == LayerKind::GatedDeltaNet ? gated_delta_net(ops, c, lw.gdn, st, r.u)
                                                     : qsa_attention(ops, c, lw.qsa, st, r.u, pos0);
    inject(ops, X, out, r.inj);
    r = gated_residual_read(ops, X, lw.mlp_hc, H, eps);
    inject(ops, X, moe_block(ops, c, lw.moe, r.u), r.inj);
    if (hook && l + 1 < L) hook(int(l + 1), X);
  }
  seq.length += T;

  Tensor h = hyper_connection_mixer(ops, X, w.mixer, H, eps);
  if (hook) hook(int(L), h);
  if (mode == LogitsMode::Last) h = h.rows(T - 1, T);
  Tensor logits = ops.empty({h.dim(0), c.vocab_size});
  ops.linear(h, w.lm_head, logits);
  return logits;
}

std::vector<float> Model::forward(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode,
                                  const HiddenHook& hook) {
  return download(forward_tensor(seq, ids, mode, hook));
}

std::vector<float> Model::download(const Tensor& t) const {
  FN_CHECK(t.dtype() == DType::F32, "Model::download: tensor {} is not F32", t.str());
  std::vector<float> out(size_t(t.numel()));
  ops_->download(t, out.data());
  return out;
}

}  // namespace flashnext
