#include "model/qwen4_exp/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "loader/quant.h"

namespace flashnext {

namespace {

/// The ops-level description of a quantized weight (borrowing the mapped checkpoint's memory and `q`).
QuantMatrix quant_matrix(const QuantizedWeight& q) {
  auto arr = [](const TensorView* v) { return v ? HostArray{v->data, v->dtype, v->shape} : HostArray{}; };
  QuantMatrix m;
  FN_CHECK(q.format != QuantFormat::None, "internal: '{}' listed as quantized without a format", q.name);
  m.format = q.format;
  m.name = q.name;
  m.rows = q.rows;
  m.cols = q.cols;
  m.group = q.group;
  m.block_rows = q.block_rows;
  m.block_cols = q.block_cols;
  m.gptq_v2 = q.gptq_v2;
  m.data = arr(q.data);
  m.scale = arr(q.scale);
  m.global_scale = arr(q.global_scale);
  m.zero_point = arr(q.zero_point);
  const QuantizedWeight* qp = &q;
  m.dequantize = [qp] { return dequantize(*qp); };
  return m;
}

}  // namespace

std::optional<QuantExperts> quantized_experts(const QuantScheme& scheme, const std::string& prefix, int64_t E,
                                              int64_t I, int64_t H) {
  QuantExperts qe;
  qe.name = prefix + ".experts";
  qe.experts = E;
  qe.hidden = H;
  qe.inter = I;
  std::optional<QuantFormat> format;
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    std::vector<QuantMatrix>& dst = proj[0] == 'g' ? qe.gate : proj[0] == 'u' ? qe.up : qe.down;
    for (int64_t e = 0; e < E; ++e) {
      const QuantizedWeight* q = scheme.find(fmt::format("{}.experts.{}.{}.weight", prefix, e, proj));
      if (!q || (format && *format != q->format)) return std::nullopt;
      format = q->format;
      dst.push_back(quant_matrix(*q));
    }
  }
  if (!format) return std::nullopt;
  return qe;
}

namespace {

struct Loader {
  const WeightManifest& manifest;
  const QuantScheme& quant;
  Ops& ops;
  const std::function<void(int64_t, int64_t)>& progress;
  int64_t total = 0;
  mutable int64_t done = 0;

  /// Counts `bytes` of checkpoint data as consumed.
  void consumed(size_t bytes) const {
    done = std::min(total, done + int64_t(bytes));
    if (progress) progress(done, total);
  }
  /// The checkpoint bytes behind a quantized weight (codes and companions).
  static size_t quant_bytes(const QuantizedWeight& q) {
    size_t n = 0;
    for (const TensorView* v : {q.data, q.scale, q.global_scale, q.zero_point})
      if (v) n += v->nbytes;
    return n;
  }

  /// The logical tensor `name` as a backend weight, optionally reshaped (same element count). A quantized weight
  /// is dequantized exactly to float32 first (loader/quant.h).
  Tensor get(const std::string& name, Shape shape = {}) const {
    if (const QuantizedWeight* q = quant.find(name)) {
      if (shape.empty()) shape = {q->rows, q->cols};
      FN_CHECK(shape_numel(shape) == q->rows * q->cols, "{}: quantized weight '{}' [{}, {}] cannot be used as [{}]",
               q->data->file, name, q->rows, q->cols, fmt::join(shape, ", "));
      const std::vector<float> w = dequantize(*q);
      Tensor t = ops.load_weight(w.data(), DType::F32, shape);
      consumed(quant_bytes(*q));
      return t;
    }
    const TensorView& v = manifest.get(name);
    if (v.dtype != DType::BF16 && v.dtype != DType::F16 && v.dtype != DType::F32) {
      fail("{}: tensor '{}' is {}: only BF16, F16 and F32 weights can be run so far", v.file, v.name,
           dtype_name(v.dtype));
    }
    if (shape.empty()) shape = v.shape;
    FN_CHECK(shape_numel(shape) == v.numel(), "{}: tensor '{}' {} cannot be used as [{}]", v.file, v.name,
             v.shape_str(), fmt::join(shape, ", "));
    try {
      Tensor t = ops.load_weight(v.data, v.dtype, shape);
      consumed(v.nbytes);
      return t;
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", v.file, v.name, e.what());  // the backend's reason, with the tensor's name
    }
  }
  Tensor get_if(const std::string& name) const { return manifest.find(name) ? get(name) : Tensor(); }

  HcWeights hc(const std::string& p, bool inject) const {
    HcWeights w{get(p + ".hc_norm.weight"), get(p + ".input_mix_weight_down.weight"),
                get(p + ".input_mix_weight_up.weight"), Tensor()};
    if (inject) w.inject = get(p + ".block_inject_weight.weight");
    return w;
  }

  /// The routed experts of MoE block `p` (`p.experts.E.{gate,up,down}_proj.weight`). When all 3E matrices are
  /// quantized in one format they go to the backend as checkpoint tensors (`Ops::load_quantized_experts`: the CPU
  /// dequantizes them exactly, the CUDA backend repacks NVFP4 / int4 for its W4A16 kernels); otherwise each is
  /// loaded as a weight (quantized ones dequantized) and stacked.
  void experts(const std::string& p, int64_t E, int64_t I, int64_t H, MoeWeights& moe) const {
    if (std::optional<QuantExperts> qe = quantized_experts(quant, p, E, I, H)) {
      RoutedExperts r = ops.load_quantized_experts(*qe);
      for (const auto* ms : {&qe->gate, &qe->up, &qe->down})
        for (const QuantMatrix& m : *ms)
          for (const HostArray* a : {&m.data, &m.scale, &m.global_scale, &m.zero_point})
            if (a->defined()) consumed(size_t(shape_numel(a->shape)) * dtype_size(a->dtype));
      moe.gate = std::move(r.gate);
      moe.up = std::move(r.up);
      moe.down = std::move(r.down);
      moe.packed = std::move(r.packed);
      return;
    }
    moe.gate = stacked(p, "gate_proj", E, I, H);
    moe.up = stacked(p, "up_proj", E, I, H);
    moe.down = stacked(p, "down_proj", E, H, I);
  }

  /// Per-expert [rows, cols] tensors `experts.E.<proj>.weight` stacked into [E, rows, cols] (in the backend's weight
  /// dtype, that of the first expert).
  Tensor stacked(const std::string& p, const char* proj, int64_t E, int64_t rows, int64_t cols) const {
    Tensor out;
    for (int64_t e = 0; e < E; ++e) {
      Tensor one = get(fmt::format("{}.experts.{}.{}.weight", p, e, proj), {1, rows, cols});
      if (e == 0) out = ops.empty({E, rows, cols}, one.dtype());
      ops.copy_rows(one, 0, out, e, 1);
    }
    return out;
  }
};

}  // namespace

ModelWeights load_weights(const ModelConfig& cfg, const WeightManifest& manifest,
                          std::shared_ptr<const Checkpoint> checkpoint, Ops& ops,
                          const std::function<void(int64_t, int64_t)>& progress) {
  const QuantScheme quant = QuantScheme::build(read_quant_config(checkpoint->dir()), cfg, manifest);
  Loader ld{manifest, quant, ops, progress};
  for (const auto& [name, e] : manifest.entries())
    if (e.component != Component::Mtp && e.component != Component::Vision) ld.total += int64_t(e.view.nbytes);
  ModelWeights w;
  const int64_t H = cfg.hidden_size, W = cfg.hc_width();
  w.embed_tokens = ld.get("embed_tokens.weight");
  w.lm_head = manifest.find("lm_head.weight") || quant.find("lm_head.weight") ? ld.get("lm_head.weight")
                                                                              : w.embed_tokens;
  w.mixer = ld.hc("hyper_connection_mixer", false);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("layers.{}", l);
    LayerWeights lw;
    lw.kind = cfg.layer_types[size_t(l)];
    lw.attn_hc = ld.hc(p + ".attn_hyper_connection", true);
    lw.mlp_hc = ld.hc(p + ".mlp_hyper_connection", true);
    if (lw.kind == LayerKind::GatedDeltaNet) {
      const std::string a = p + ".linear_attn";
      GdnLayerWeights& g = lw.gdn;
      g.in_proj_qkv = ld.get(a + ".in_proj_qkv.weight");
      g.in_proj_z = ld.get(a + ".in_proj_z.weight");
      g.in_proj_b = ld.get(a + ".in_proj_b.weight");
      g.in_proj_a = ld.get(a + ".in_proj_a.weight");
      g.conv1d = ld.get(a + ".conv1d.weight", {cfg.gdn_conv_dim(), cfg.linear_conv_kernel_dim});
      g.norm = ld.get(a + ".norm.weight");
      g.out_proj = ld.get(a + ".out_proj.weight");
      g.rule = GdnWeights{ld.get(a + ".A_log"), ld.get(a + ".dt_bias")};
    } else {
      const std::string a = p + ".self_attn";
      QsaLayerWeights& q = lw.qsa;
      q.q_proj = ld.get(a + ".q_proj.weight");
      q.k_proj = ld.get(a + ".k_proj.weight");
      q.v_proj = ld.get(a + ".v_proj.weight");
      q.o_proj = ld.get(a + ".o_proj.weight");
      q.q_bias = ld.get_if(a + ".q_proj.bias");
      q.k_bias = ld.get_if(a + ".k_proj.bias");
      q.v_bias = ld.get_if(a + ".v_proj.bias");
      q.o_bias = ld.get_if(a + ".o_proj.bias");
      q.q_norm = ld.get(a + ".q_norm.weight");
      q.k_norm = ld.get(a + ".k_norm.weight");
      const int64_t qi_rows = cfg.indexer_n_heads * cfg.indexer_head_dim;
      Tensor qk = ld.get(a + ".indexer.index_qk_proj.weight");
      q.index_q_proj = qk.rows(0, qi_rows);
      q.index_k_proj = qk.rows(qi_rows, qi_rows + cfg.indexer_head_dim);
      q.index_q_norm = ld.get(a + ".indexer.q_layernorm.weight");
      q.index_k_norm = ld.get(a + ".indexer.k_layernorm.weight");
    }
    const std::string m = p + ".mlp";
    const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
    lw.moe.router = ld.get(m + ".gate.weight");
    ld.experts(m, E, I, H, lw.moe);
    lw.moe.shared_gate_proj = ld.get(m + ".shared_expert.gate_proj.weight");
    lw.moe.shared_up_proj = ld.get(m + ".shared_expert.up_proj.weight");
    lw.moe.shared_down_proj = ld.get(m + ".shared_expert.down_proj.weight");
    lw.moe.shared_expert_gate = ld.get(m + ".shared_expert_gate.weight");
    if (const int m_idx = cfg.ple_index_of_layer(l); m_idx >= 0) {
      const std::string e = p + ".ple";
      PleLayerWeights pw;
      pw.hash = ngram_hash_params(cfg, m_idx);
      pw.table.head_dim = cfg.ple_head_dim();
      for (const ManifestEntry* s : manifest.ple_table_shards(int(l))) {
        const TensorView& v = s->view;
        FN_CHECK(v.shape.size() == 2 && v.shape[1] == pw.table.head_dim, "{}: PLE shard '{}' {} must have {} columns",
                 v.file, s->source, v.shape_str(), pw.table.head_dim);
        try {
          if (const ManifestEntry* scale = manifest.find(e + ".ple_embedding.ngram_embedding.weight_scale")) {
            // FP8 table: the shards stay FP8 (no float copy); the gather converts rows and multiplies by the scale.
            pw.table.scale = ple_table_scale(v, scale->view);
          }
          pw.table.shards.push_back(ops.map_host_table(v.data, v.dtype, v.shape, checkpoint));
          ld.consumed(v.nbytes);
        } catch (const Error& e) {
          fail("{}: PLE shard '{}': {}", v.file, s->source, e.what());
        }
        pw.table.rows += v.shape[0];
      }
      FN_CHECK(pw.table.rows == pw.hash.rows, "{}: PLE table of layer {} has {} rows, the hash needs {}", cfg.source, l,
               pw.table.rows, pw.hash.rows);
      pw.key_proj = ld.get(e + ".key_proj.weight");
      pw.value_proj = ld.get(e + ".value_proj.weight");
      pw.norm_key = ld.get(e + ".norm_key.weight");
      pw.norm_query = ld.get(e + ".norm_query.weight");
      pw.norm_conv = ld.get(e + ".norm_conv.weight");
      pw.conv1d = ld.get(e + ".conv1d.weight", {W, cfg.ple_conv_kernel_size});
      lw.ple = std::move(pw);
    }
    w.layers.push_back(std::move(lw));
  }
  ld.done = ld.total;  // what had no load of its own (the PLE hash buffers, checked by the manifest) is done too
  if (progress) progress(ld.done, ld.total);
  return w;
}

}  // namespace flashnext
