#include "model/qwen4_exp/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "core/error.h"
#include "loader/quant.h"
#include "loader/tensor_plan.h"

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
  m.bits = q.bits;
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
  const TpPlan* plan = nullptr;  ///< null: the whole model
  int rank = 0;
  std::string cfg_source;
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

  /// This rank's part of a row-major array `data` of `full` shape and `esize`-byte elements (`sp` Rows or
  /// Columns), copied into `out`.
  static void slice(const uint8_t* data, size_t esize, const Shape& full, const TensorSplit& sp,
                    std::vector<uint8_t>& out) {
    const int64_t n = shape_numel(full);
    if (sp.split == Split::Rows) {
      const size_t row = size_t(full[0] ? n / full[0] : 0) * esize;
      for (const IndexRange& r : sp.ranges)
        out.insert(out.end(), data + size_t(r.begin) * row, data + size_t(r.end) * row);
      return;
    }
    const int64_t cols = full.back(), outer = cols ? n / cols : 0;
    for (int64_t o = 0; o < outer; ++o)
      for (const IndexRange& r : sp.ranges) {
        const uint8_t* p = data + (size_t(o * cols + r.begin)) * esize;
        out.insert(out.end(), p, p + size_t(r.size()) * esize);
      }
  }

  /// This rank's part of the logical tensor `name` in host memory: checkpoint bytes used in place (a whole tensor,
  /// or one range of rows) or copied into `owned` (column slices, several row ranges, dequantized weights).
  struct Part {
    const void* data = nullptr;  ///< null: the rank holds nothing of it
    DType dtype = DType::F32;
    Shape shape;
    std::vector<uint8_t> owned;
  };
  Part part(const std::string& name) const {
    Part p;
    if (const QuantizedWeight* q = quant.find(name)) {
      const Shape full{q->rows, q->cols};
      const TensorSplit sp = split(name, full);
      if (sp.split == Split::None) return p;
      const std::vector<float> w = dequantize(*q);
      const auto* bytes = reinterpret_cast<const uint8_t*>(w.data());
      if (sp.split == Split::Rows || sp.split == Split::Columns) {
        slice(bytes, 4, full, sp, p.owned);
      } else {
        p.owned.assign(bytes, bytes + w.size() * 4);
      }
      p.data = p.owned.data();
      p.shape = sp.shape(full);
      consumed(size_t(double(quant_bytes(*q)) * double(shape_numel(p.shape)) / double(shape_numel(full))));
      return p;
    }
    const TensorView& v = manifest.get(name);
    if (v.dtype != DType::BF16 && v.dtype != DType::F16 && v.dtype != DType::F32) {
      fail("{}: tensor '{}' is {}: only BF16, F16 and F32 weights can be run so far", v.file, v.name,
           dtype_name(v.dtype));
    }
    const TensorSplit sp = split(name, v.shape);
    if (sp.split == Split::None) return p;
    p.dtype = v.dtype;
    p.shape = sp.shape(v.shape);
    if (sp.split == Split::Rows && sp.ranges.size() == 1) {  // one row range: in place
      p.data = v.data + size_t(sp.ranges[0].begin) * (v.nbytes / size_t(std::max<int64_t>(v.shape[0], 1)));
    } else if (sp.split == Split::Rows || sp.split == Split::Columns) {
      slice(v.data, dtype_size(v.dtype), v.shape, sp, p.owned);
      p.data = p.owned.data();
    } else {
      p.data = v.data;
    }
    consumed(size_t(shape_numel(p.shape)) * dtype_size(v.dtype));
    return p;
  }

  /// The rank's part of logical tensor `name` as a backend weight, optionally reshaped (same element count; shapes
  /// are the rank's, from its rank_config), or an undefined tensor when the rank holds none of it. A quantized
  /// weight is dequantized exactly to float32 first (loader/quant.h).
  Tensor get(const std::string& name, Shape shape = {}) const {
    Part p = part(name);
    if (!p.data) return Tensor();
    if (shape.empty()) shape = p.shape;
    FN_CHECK(shape_numel(shape) == shape_numel(p.shape), "{}: tensor '{}' [{}] cannot be used as [{}]",
             manifest.find(name) ? manifest.get(name).file : cfg_source, name, fmt::join(p.shape, ", "),
             fmt::join(shape, ", "));
    try {
      return ops.load_weight(p.data, p.dtype, shape);
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", manifest.find(name) ? manifest.get(name).file : cfg_source, name,
           e.what());  // the backend's reason, with the tensor's name
    }
  }
  /// The rank's part of the linear weight `name`: for a weight held as 8-bit codes (w8_linear_holds: W8A8 INT8 and
  /// FP8 releases) the codes and float32 scales (Ops::load_w8_linear; the CUDA backend keeps them, one byte a weight),
  /// otherwise get(name). A column slice that cuts an FP8 block of several per row (a rank's inputs not starting at
  /// a block edge) takes get()'s exact float32 path instead.
  Tensor get_linear(const std::string& name) const {
    FN_CHECK(w8_linear_weight_name(name), "internal: '{}' is not in loader/quant.h w8_linear_weight_name", name);
    const QuantizedWeight* q = quant.find(name);
    if (!q || !w8_linear_holds(q->format)) return get(name);
    const int64_t N = q->rows, K = q->cols;
    const TensorSplit sp = split(name, {N, K});
    if (sp.split == Split::None) return Tensor();
    W8Linear w;
    w.code = q->format == QuantFormat::CtInt8 ? DType::I8 : DType::F8_E4M3;
    std::vector<float> scales = w8_linear_scales(*q, &w.group);
    const int64_t G = (K + w.group - 1) / w.group;  // scale columns of the whole matrix
    const uint8_t* codes = q->data->data;
    auto slice_scales = [&](const TensorSplit& s) {  // the scales [N, G] as `s` cuts them
      std::vector<uint8_t> part;
      slice(reinterpret_cast<const uint8_t*>(scales.data()), 4, {N, G}, s, part);
      w.scales.resize(part.size() / 4);
      std::memcpy(w.scales.data(), part.data(), part.size());
    };
    if (sp.split == Split::Rows) {
      slice(codes, 1, {N, K}, sp, w.codes);
      slice_scales(sp);
    } else if (sp.split == Split::Columns) {
      TensorSplit groups{Split::Columns, {}};
      for (size_t i = 0; i < sp.ranges.size(); ++i) {
        const IndexRange& r = sp.ranges[i];
        const bool last = i + 1 == sp.ranges.size();
        if (w.group < K && (r.begin % w.group != 0 || (r.end % w.group != 0 && !(last && r.end == K))))
          return get(name);  // the slice cuts a block: exact float32 weights instead
        groups.ranges.push_back({r.begin / w.group, (r.end + w.group - 1) / w.group});
      }
      slice(codes, 1, {N, K}, sp, w.codes);
      if (w.group < K) {
        slice_scales(groups);
      } else {
        w.scales = std::move(scales);
      }
    } else {
      w.codes.assign(codes, codes + N * K);
      w.scales = std::move(scales);
    }
    const Shape shape = sp.shape({N, K});
    w.rows = shape[0];
    w.cols = shape[1];
    if (w.group >= K) w.group = w.cols;  // one scale a row: the rank's row
    consumed(size_t(double(quant_bytes(*q)) * double(shape_numel(shape)) / double(N * K)));
    try {
      return ops.load_w8_linear(w);
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", q->data->file, name, e.what());
    }
  }
  /// get() with one zero row appended (the rank's vocabulary rows of embed_tokens under tensor parallelism).
  Tensor get_with_zero_row(const std::string& name) const {
    Part p = part(name);
    const size_t row = size_t(shape_numel(p.shape) / p.shape[0]) * dtype_size(p.dtype);
    std::vector<uint8_t> padded(static_cast<const uint8_t*>(p.data),
                                static_cast<const uint8_t*>(p.data) + row * size_t(p.shape[0]));
    padded.resize(padded.size() + row, 0);  // zero bits are 0.0 in F32, BF16 and F16
    Shape shape = p.shape;
    shape[0] += 1;
    return ops.load_weight(padded.data(), p.dtype, shape);
  }
  TensorSplit split(const std::string& name, const Shape& full) const {
    return plan ? plan->split(rank, name, full) : TensorSplit{};
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
  /// Under tensor parallelism (I is then the rank's slice of the intermediate) the quantized experts go to the
  /// backend whole with the rank's slice marked (QuantExperts::inter_begin), so that it packs only that.
  void experts(const std::string& p, int64_t E, int64_t I, int64_t H, MoeWeights& moe) const {
    const IndexRange slice = plan ? plan->rank(rank).moe_inter : IndexRange{0, I};
    const int64_t full = plan ? plan->config().moe_intermediate_size : I;
    if (std::optional<QuantExperts> qe = quantized_experts(quant, p, E, full, H)) {
      qe->inter_begin = slice.begin;
      qe->inter = slice.size();
      qe->full_inter = full;
      RoutedExperts r = ops.load_quantized_experts(*qe);
      for (const auto* ms : {&qe->gate, &qe->up, &qe->down})
        for (const QuantMatrix& m : *ms)
          for (const HostArray* a : {&m.data, &m.scale, &m.global_scale, &m.zero_point})
            if (a->defined())
              consumed(size_t(double(shape_numel(a->shape)) * double(dtype_size(a->dtype)) * double(slice.size()) /
                              double(full)));
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

namespace {

/// The logical name of an mtp tensor: the checkpoint name without a leading "model." (vLLM-style exports).
std::string mtp_logical(const std::string& name) {
  return name.starts_with("model.mtp.") ? name.substr(6) : name;
}

}  // namespace

bool has_mtp_tensors(const WeightManifest& manifest) {
  for (const ManifestEntry& e : manifest.extra())
    if (e.component == Component::Mtp) return true;
  return false;
}

MtpWeights load_mtp_weights(const ModelConfig& cfg, const WeightManifest& manifest, Ops& ops, const TpPlan* plan,
                            int rank) {
  if (plan && plan->world() == 1) plan = nullptr;
  std::map<std::string, const TensorView*> views;
  for (const ManifestEntry& e : manifest.extra())
    if (e.component == Component::Mtp) views[mtp_logical(e.name)] = &e.view;
  FN_CHECK(cfg.mtp_num_hidden_layers >= 1,
           "{}: the config has mtp_num_hidden_layers = {}: no MTP layer to load ({} mtp.* tensors in the checkpoint)",
           cfg.source, cfg.mtp_num_hidden_layers, views.size());
  FN_CHECK(cfg.mtp_num_hidden_layers == 1, "{}: mtp_num_hidden_layers = {}: only one MTP layer is implemented",
           cfg.source, cfg.mtp_num_hidden_layers);
  FN_CHECK(!views.empty(), "{}: the config has mtp_num_hidden_layers = {} but the checkpoint holds no mtp.* tensors",
           cfg.source, cfg.mtp_num_hidden_layers);
  // Every expected tensor present, float, of the expected shape (ARTIFACTS.md 2.5).
  for (const ExpectedTensor& e : expected_mtp_tensors(cfg)) {
    auto it = views.find(e.name);
    FN_CHECK(it != views.end(), "{}: MTP tensor '{}' {} is missing from the checkpoint", cfg.source, e.name,
             fmt::format("[{}]", fmt::join(e.shape, ", ")));
    const TensorView& v = *it->second;
    FN_CHECK(v.dtype == DType::BF16 || v.dtype == DType::F16 || v.dtype == DType::F32,
             "{}: MTP tensor '{}' is {}: the MTP layer must be BF16, F16 or F32 (quantized releases keep it BF16)",
             v.file, v.name, dtype_name(v.dtype));
    FN_CHECK(v.shape == e.shape, "{}: MTP tensor '{}' has shape {}, expected [{}] from the config {}", v.file, v.name,
             v.shape_str(), fmt::join(e.shape, ", "), cfg.source);
  }
  // The rank's part of an mtp.* tensor (the whole of it without a plan); undefined where the rank holds none.
  auto get = [&](const std::string& name) {
    const TensorView& v = *views.at(name);
    const TensorSplit sp = plan ? plan->split(rank, name, v.shape) : TensorSplit{};
    if (sp.split == Split::None) return Tensor();
    if (sp.split == Split::Replicated) return ops.load_weight(v.data, v.dtype, Shape(v.shape));
    std::vector<uint8_t> part;
    Loader::slice(v.data, dtype_size(v.dtype), v.shape, sp, part);
    return ops.load_weight(part.data(), v.dtype, sp.shape(v.shape));
  };
  auto hc = [&](const std::string& p, bool inject) {
    HcWeights w{get(p + ".hc_norm.weight"), get(p + ".input_mix_weight_down.weight"),
                get(p + ".input_mix_weight_up.weight"), Tensor()};
    if (inject) w.inject = get(p + ".block_inject_weight.weight");
    return w;
  };
  MtpWeights m;
  m.pre_fc_norm_embedding = get("mtp.pre_fc_norm_embedding.weight");
  m.pre_fc_norm_hidden = get("mtp.pre_fc_norm_hidden.weight");
  m.fc_embedding = get("mtp.fc_embedding.weight");
  m.fc_hidden = get("mtp.fc_hidden.weight");
  m.mixer = hc("mtp.hyper_connection_mixer", false);
  const std::string p = "mtp.layers.0";
  LayerWeights& lw = m.layer;
  lw.kind = LayerKind::QSA;
  lw.attn_hc = hc(p + ".attn_hyper_connection", true);
  lw.mlp_hc = hc(p + ".mlp_hyper_connection", true);
  QsaLayerWeights& q = lw.qsa;
  const std::string a = p + ".self_attn";
  q.q_proj = get(a + ".q_proj.weight");
  q.k_proj = get(a + ".k_proj.weight");
  q.v_proj = get(a + ".v_proj.weight");
  q.o_proj = get(a + ".o_proj.weight");
  if (cfg.attention_bias) {
    q.q_bias = get(a + ".q_proj.bias");
    q.k_bias = get(a + ".k_proj.bias");
    q.v_bias = get(a + ".v_proj.bias");
    q.o_bias = get(a + ".o_proj.bias");
  }
  q.q_norm = get(a + ".q_norm.weight");
  q.k_norm = get(a + ".k_norm.weight");
  const int64_t qi_rows = cfg.indexer_n_heads * cfg.indexer_head_dim;
  if (const Tensor qk = get(a + ".indexer.index_qk_proj.weight"); qk.defined()) {  // undefined: the rank sits it out
    q.index_q_proj = qk.rows(0, qi_rows);
    q.index_k_proj = qk.rows(qi_rows, qi_rows + cfg.indexer_head_dim);
  }
  q.index_q_norm = get(a + ".indexer.q_layernorm.weight");
  q.index_k_norm = get(a + ".indexer.k_layernorm.weight");
  const std::string mp = p + ".mlp";
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  // The rank's columns of every expert's intermediate (all of them without a plan).
  const IndexRange inter = plan ? plan->rank(rank).moe_inter : IndexRange{0, I};
  const int64_t Ir = inter.size();
  lw.moe.router = get(mp + ".gate.weight");
  {  // fused gate_up [E, 2I, H]: rows 0..I-1 of each expert are gate_proj, I..2I-1 up_proj (as the manifest slices)
    const TensorView& v = *views.at(mp + ".experts.gate_up_proj");
    const size_t es = dtype_size(v.dtype), row = size_t(H) * es, part = size_t(Ir) * row;
    std::vector<uint8_t> gate(size_t(E) * part), up(size_t(E) * part);
    for (int64_t e = 0; e < E; ++e) {
      const uint8_t* expert = v.data + size_t(e) * 2 * size_t(I) * row;
      std::memcpy(gate.data() + size_t(e) * part, expert + size_t(inter.begin) * row, part);
      std::memcpy(up.data() + size_t(e) * part, expert + size_t(I + inter.begin) * row, part);
    }
    lw.moe.gate = ops.load_weight(gate.data(), v.dtype, {E, Ir, H});
    lw.moe.up = ops.load_weight(up.data(), v.dtype, {E, Ir, H});
  }
  {  // fused down [E, H, I]: the rank's columns
    const TensorView& v = *views.at(mp + ".experts.down_proj");
    std::vector<uint8_t> down;
    Loader::slice(v.data, dtype_size(v.dtype), v.shape, TensorSplit{Split::Columns, {inter}}, down);
    lw.moe.down = ops.load_weight(down.data(), v.dtype, {E, H, Ir});
  }
  lw.moe.shared_gate_proj = get(mp + ".shared_expert.gate_proj.weight");
  lw.moe.shared_up_proj = get(mp + ".shared_expert.up_proj.weight");
  lw.moe.shared_down_proj = get(mp + ".shared_expert.down_proj.weight");
  lw.moe.shared_expert_gate = get(mp + ".shared_expert_gate.weight");
  return m;
}

ModelWeights load_weights(const ModelConfig& cfg, const WeightManifest& manifest,
                          std::shared_ptr<const Checkpoint> checkpoint, Ops& ops,
                          const std::function<void(int64_t, int64_t)>& progress, const TpPlan* plan, int rank) {
  const QuantScheme quant = QuantScheme::build(read_quant_config(checkpoint->dir()), cfg, manifest);
  const bool tp = plan && plan->world() > 1;
  Loader ld{manifest, quant, ops, progress, tp ? plan : nullptr, rank, cfg.source};
  for (const auto& [name, e] : manifest.entries()) {
    if (e.component == Component::Mtp || e.component == Component::Vision) continue;
    const int64_t n = e.view.numel();
    ld.total += !tp ? int64_t(e.view.nbytes)
                : e.component == Component::PleTable
                    ? int64_t(e.view.nbytes) / plan->world()
                    : int64_t(double(e.view.nbytes) * double(ld.split(name, e.view.shape).numel(e.view.shape)) /
                              double(std::max<int64_t>(n, 1)));
  }
  // The rank's geometry (its heads and intermediate widths): the shapes its weights are loaded in.
  const ModelConfig rc = tp ? plan->rank_config(rank) : cfg;
  ModelWeights w;
  const int64_t H = cfg.hidden_size, W = cfg.hc_width();
  const bool untied = manifest.find("lm_head.weight") || quant.find("lm_head.weight");
  if (tp) {
    w.embed_tokens = ld.get_with_zero_row("embed_tokens.weight");
    w.lm_head = untied ? ld.get("lm_head.weight") : w.embed_tokens.rows(0, w.embed_tokens.dim(0) - 1);
  } else {
    w.embed_tokens = ld.get("embed_tokens.weight");
    w.lm_head = untied ? ld.get("lm_head.weight") : w.embed_tokens;
  }
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
      g.in_proj_qkv = ld.get_linear(a + ".in_proj_qkv.weight");
      g.in_proj_z = ld.get_linear(a + ".in_proj_z.weight");
      g.in_proj_b = ld.get_linear(a + ".in_proj_b.weight");
      g.in_proj_a = ld.get_linear(a + ".in_proj_a.weight");
      g.conv1d = ld.get(a + ".conv1d.weight", {rc.gdn_conv_dim(), cfg.linear_conv_kernel_dim});
      g.norm = ld.get(a + ".norm.weight");
      g.out_proj = ld.get_linear(a + ".out_proj.weight");
      g.rule = GdnWeights{ld.get(a + ".A_log"), ld.get(a + ".dt_bias")};
    } else {
      const std::string a = p + ".self_attn";
      QsaLayerWeights& q = lw.qsa;
      q.q_proj = ld.get_linear(a + ".q_proj.weight");
      q.k_proj = ld.get_linear(a + ".k_proj.weight");
      q.v_proj = ld.get_linear(a + ".v_proj.weight");
      q.o_proj = ld.get_linear(a + ".o_proj.weight");
      q.q_bias = ld.get_if(a + ".q_proj.bias");
      q.k_bias = ld.get_if(a + ".k_proj.bias");
      q.v_bias = ld.get_if(a + ".v_proj.bias");
      q.o_bias = ld.get_if(a + ".o_proj.bias");
      q.q_norm = ld.get(a + ".q_norm.weight");
      q.k_norm = ld.get(a + ".k_norm.weight");
      const int64_t qi_rows = cfg.indexer_n_heads * cfg.indexer_head_dim;
      if (Tensor qk = ld.get_linear(a + ".indexer.index_qk_proj.weight");
          qk.defined()) {  // undefined: the rank sits QSA out
        q.index_q_proj = qk.rows(0, qi_rows);
        q.index_k_proj = qk.rows(qi_rows, qi_rows + cfg.indexer_head_dim);
      }
      q.index_q_norm = ld.get(a + ".indexer.q_layernorm.weight");
      q.index_k_norm = ld.get(a + ".indexer.k_layernorm.weight");
    }
    const std::string m = p + ".mlp";
    const int64_t E = cfg.num_experts, I = rc.moe_intermediate_size;
    lw.moe.router = ld.get(m + ".gate.weight");
    ld.experts(m, E, I, H, lw.moe);
    lw.moe.shared_gate_proj = ld.get_linear(m + ".shared_expert.gate_proj.weight");
    lw.moe.shared_up_proj = ld.get_linear(m + ".shared_expert.up_proj.weight");
    lw.moe.shared_down_proj = ld.get_linear(m + ".shared_expert.down_proj.weight");
    lw.moe.shared_expert_gate = ld.get(m + ".shared_expert_gate.weight");
    if (const int m_idx = cfg.ple_index_of_layer(l); m_idx >= 0) {
      const std::string e = p + ".ple";
      PleLayerWeights pw;
      pw.hash = ngram_hash_params(cfg, m_idx);
      pw.table.head_dim = cfg.ple_head_dim();
      const std::vector<const ManifestEntry*> shards = manifest.ple_table_shards(int(l));
      int64_t table_rows = 0;
      for (const ManifestEntry* s : shards) {
        const TensorView& v = s->view;
        FN_CHECK(v.shape.size() == 2 && v.shape[1] == pw.table.head_dim, "{}: PLE shard '{}' {} must have {} columns",
                 v.file, s->source, v.shape_str(), pw.table.head_dim);
        table_rows += v.shape[0];
      }
      FN_CHECK(table_rows == pw.hash.rows, "{}: PLE table of layer {} has {} rows, the hash needs {}", cfg.source, l,
               table_rows, pw.hash.rows);
      // The rank's rows (all of them without tensor parallelism), cut out of the shards they fall in, in place.
      pw.rows_held = tp ? plan->ple_rows(rank, table_rows) : IndexRange{0, table_rows};
      const ManifestEntry* scale = manifest.find(e + ".ple_embedding.ngram_embedding.weight_scale");
      DType table_dtype = DType::BF16, scales_dtype = DType::F16;
      int64_t at = 0;
      for (size_t k = 0; k < shards.size(); ++k) {
        const TensorView& v = shards[k]->view;
        const ManifestEntry* group_scales = manifest.ple_table_shard_scales(int(l), int64_t(k));
        const int64_t b = std::max(at, pw.rows_held.begin), t = std::min(at + v.shape[0], pw.rows_held.end);
        table_dtype = v.dtype;
        if (b < t) {
          try {
            // FP8 table: the shards stay FP8 (no float copy); the gather converts rows and multiplies by the scale.
            if (scale) pw.table.scale = ple_table_scale(v, scale->view);
            const size_t row_bytes = size_t(v.shape[1]) * dtype_size(v.dtype);
            pw.table.shards.push_back(
                ops.map_host_table(v.data + size_t(b - at) * row_bytes, v.dtype, {t - b, v.shape[1]}, checkpoint));
            ld.consumed(size_t(t - b) * row_bytes);
            if (group_scales) {  // int8 table: the shards stay I8, the gather multiplies by each row's group scales
              const TensorView& sv = group_scales->view;
              pw.table.group = ple_int8_group(v, sv);
              scales_dtype = sv.dtype;
              const size_t scale_row_bytes = size_t(sv.shape[1]) * dtype_size(sv.dtype);
              pw.table.group_scales.push_back(ops.map_host_table(sv.data + size_t(b - at) * scale_row_bytes, sv.dtype,
                                                                 {t - b, sv.shape[1]}, checkpoint));
              ld.consumed(size_t(t - b) * scale_row_bytes);
            }
          } catch (const Error& e) {
            fail("{}: PLE shard '{}': {}", v.file, shards[k]->source, e.what());
          }
          pw.table.rows += t - b;
        }
        at += v.shape[0];
      }
      if (pw.rows_held.size() < table_rows) {  // the zero row that the rows of other ranks read
        auto zero = std::make_shared<std::vector<uint8_t>>(size_t(pw.table.head_dim) * dtype_size(table_dtype), 0);
        pw.table.shards.push_back(ops.map_host_table(zero->data(), table_dtype, {1, pw.table.head_dim}, zero));
        if (pw.table.group > 0) {  // its scales: zeros as well
          const int64_t groups = pw.table.head_dim / pw.table.group;
          auto zs = std::make_shared<std::vector<uint8_t>>(size_t(groups) * dtype_size(scales_dtype), 0);
          pw.table.group_scales.push_back(ops.map_host_table(zs->data(), scales_dtype, {1, groups}, zs));
        }
        pw.table.rows += 1;
      }
      pw.key_proj = ld.get_linear(e + ".key_proj.weight");
      pw.value_proj = ld.get_linear(e + ".value_proj.weight");
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
