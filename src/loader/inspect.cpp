#include "loader/inspect.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "loader/config.h"
#include "loader/manifest.h"
#include "loader/memory_plan.h"
#include "loader/quant.h"
#include "loader/safetensors.h"
#include "loader/sharding.h"
#include "loader/tensor_plan.h"
#include "ple/ngram_hash.h"

namespace flashnext {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool is_float(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32;
}

json component_object(const ComponentTotals& v) {
  json o = json::object();
  for (int i = 0; i < kNumComponents; ++i) o[component_name(Component(i))] = v[i];
  return o;
}

int64_t language_model_total(const ComponentTotals& v) {
  int64_t n = 0;
  for (int i = 0; i < kNumComponents; ++i) {
    if (Component(i) != Component::Mtp && Component(i) != Component::Vision) n += v[i];
  }
  return n;
}

// The quantization_config of the document (top level, or inside text_config), summarised; null when absent.
json quantization_config_summary(const json& doc) {
  const json* q = nullptr;
  if (auto it = doc.find("quantization_config"); it != doc.end() && it->is_object()) q = &*it;
  if (auto t = doc.find("text_config"); !q && t != doc.end() && t->is_object()) {
    if (auto it = t->find("quantization_config"); it != t->end() && it->is_object()) q = &*it;
  }
  if (!q) return nullptr;
  json out = json::object();
  for (const char* k : {"quant_method", "quant_algo", "format", "activation_scheme", "weight_block_size", "bits",
                        "group_size", "version", "zero_point"}) {
    if (auto it = q->find(k); it != q->end()) out[k] = *it;
  }
  return out;
}

/// A V100's 32 GiB less a reserve for the CUDA context, cuBLAS workspaces and a step's activations.
constexpr int64_t kV100Bytes = int64_t(32) << 30, kV100ReserveBytes = int64_t(2) << 30;
/// Bytes per routed-expert weight held as 4-bit codes with one 8-bit scale per 16 (NVFP4's storage, the size of the
/// quantized releases' experts).
constexpr double kW4BytesPerWeight = 0.5625;

json range_json(const IndexRange& r) {
  return json::array({r.begin, r.end});
}

/// What each rank of a tensor-parallel group holds as the engine holds it (loader/sharding.h TpPlan): dense weights
/// at 2 bytes (the CUDA backend's FP16; routed experts also at 4.5 bits per weight), its share of the PLE table in
/// host memory, and its caches in float32 (as both backends keep them: K/V of its KV heads, the indexer keys plus
/// their pooled block keys, its GDN heads' recurrent and conv states, the replicated PLE conv state) for one
/// sequence at 32K, 128K and 262K tokens; whether that fits a V100-32GB.
json tp_memory_plan(const ModelConfig& cfg, const TpPlan& plan) {
  const int64_t table_bytes =
      torch_dtype_bytes(cfg.ple_embedding_dtype.empty() ? "bfloat16" : cfg.ple_embedding_dtype, cfg.source);
  std::vector<int64_t> ple_rows;  // per PLE layer
  for (size_t m = 0; m < cfg.ple_layer_ids.size(); ++m) ple_rows.push_back(ngram_hash_params(cfg, int(m)).rows);
  const std::vector<ExpectedTensor> tensors = expected_tensors(cfg);
  const int64_t qsa = cfg.num_layers_of(LayerKind::QSA), gdn = cfg.num_layers_of(LayerKind::GatedDeltaNet);
  const int64_t ple_layers = int64_t(cfg.ple_layer_ids.size());
  json ranks = json::array();
  for (int r = 0; r < plan.world(); ++r) {
    const RankShard& s = plan.rank(r);
    const ModelConfig rc = plan.rank_config(r);
    double dense = 0, experts = 0;
    for (const ExpectedTensor& e : tensors) {
      if (e.component == Component::PleTable || e.component == Component::PleHashBuffers) continue;
      const double n = double(plan.split(r, e.name, e.shape).numel(e.shape));
      (e.component == Component::RoutedExperts ? experts : dense) += n;
    }
    if (plan.world() > 1) dense += double(cfg.hidden_size);  // the embedding's zero row
    int64_t table = 0;
    for (int64_t rows : ple_rows) table += plan.ple_rows(r, rows).size() * cfg.ple_head_dim() * table_bytes;
    const bool attn = !s.attn.idle();
    const int64_t kv = attn ? qsa * 2 * rc.num_key_value_heads * cfg.head_dim * 4 : 0;
    const int64_t indexer = attn ? qsa * cfg.indexer_head_dim * 4 * (cfg.indexer_compress_ratio + 1) /
                                       std::max<int64_t>(cfg.indexer_compress_ratio, 1)
                                 : 0;
    const int64_t state = gdn * rc.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4 +
                          gdn * (cfg.linear_conv_kernel_dim - 1) * rc.gdn_conv_dim() * 4 +
                          ple_layers * cfg.ple_conv_state_len() * cfg.hc_width() * 4;
    const int64_t w16 = int64_t(2 * (dense + experts)), w4 = int64_t(2 * dense + kW4BytesPerWeight * experts);
    json contexts = json::array();
    for (int64_t ctx : {int64_t(32768), int64_t(131072), int64_t(262144)}) {
      const int64_t seq = (kv + indexer) * ctx + state;
      contexts.push_back({{"context", ctx},
                          {"sequence_bytes", seq},
                          {"total_bytes", w16 + seq},
                          {"total_bytes_w4_experts", w4 + seq},
                          {"fits_v100_32gb", w16 + seq <= kV100Bytes - kV100ReserveBytes},
                          {"fits_v100_32gb_w4_experts", w4 + seq <= kV100Bytes - kV100ReserveBytes}});
    }
    ranks.push_back({{"rank", r},
                     {"gdn_key_heads", range_json(s.gdn.groups)},
                     {"gdn_value_heads", range_json(s.gdn.heads)},
                     {"qsa_kv_heads", range_json(s.attn.groups)},
                     {"qsa_query_heads", range_json(s.attn.heads)},
                     {"moe_intermediate", range_json(s.moe_inter)},
                     {"shared_intermediate", range_json(s.shared_inter)},
                     {"vocab_rows", range_json(s.vocab)},
                     {"weight_bytes", w16},
                     {"weight_bytes_w4_experts", w4},
                     {"ple_table_bytes_host", table},
                     {"kv_bytes_per_token", kv},
                     {"indexer_bytes_per_token", indexer},
                     {"state_bytes_per_sequence", state},
                     {"contexts", contexts}});
  }
  return {{"tp", plan.world()}, {"v100_usable_bytes", kV100Bytes - kV100ReserveBytes}, {"ranks", ranks}};
}

}  // namespace

json inspect_model(const std::string& path, const InspectOptions& opt) {
  if (opt.tp < 1) fail("inspect: --tp must be >= 1, got {}", opt.tp);
  if (opt.context < 0) fail("inspect: --context must be >= 1, got {}", opt.context);
  if (!fs::exists(path)) fail("{}: no such file or directory (expected a model folder or a config.json)", path);
  const bool folder = fs::is_directory(path);
  const ModelConfig cfg = load_config(path);
  const TpPlan tp_plan = TpPlan::make(cfg, int(opt.tp));  // a degree the heads do not allow is an error
  json doc;
  {
    std::ifstream in(cfg.source);
    doc = json::parse(in);  // load_config has parsed it already
  }

  json r = json::object();
  r["source"] = path;
  r["config"] = cfg.source;
  r["has_weights"] = folder;
  r["model_type"] = cfg.model_type;
  r["architecture"] = cfg.architecture;
  r["dims"] = {
      {"vocab_size", cfg.vocab_size},
      {"hidden_size", cfg.hidden_size},
      {"hc_count", cfg.hc_count},
      {"hc_lowrank", cfg.hc_lowrank},
      {"max_position_embeddings", cfg.max_position_embeddings},
      {"num_attention_heads", cfg.num_attention_heads},
      {"num_key_value_heads", cfg.num_key_value_heads},
      {"head_dim", cfg.head_dim},
      {"rotary_dim", cfg.rotary_dim()},
      {"rope_theta", cfg.rope.theta},
      {"indexer_n_heads", cfg.indexer_n_heads},
      {"indexer_head_dim", cfg.indexer_head_dim},
      {"indexer_budget", cfg.indexer_budget},
      {"indexer_compress_ratio", cfg.indexer_compress_ratio},
      {"linear_num_key_heads", cfg.linear_num_key_heads},
      {"linear_num_value_heads", cfg.linear_num_value_heads},
      {"linear_key_head_dim", cfg.linear_key_head_dim},
      {"linear_value_head_dim", cfg.linear_value_head_dim},
      {"linear_conv_kernel_dim", cfg.linear_conv_kernel_dim},
      {"output_gate_type", cfg.output_gate_type},
      {"num_experts", cfg.num_experts},
      {"num_experts_per_tok", cfg.num_experts_per_tok},
      {"moe_intermediate_size", cfg.moe_intermediate_size},
      {"shared_expert_intermediate_size", cfg.shared_expert_intermediate_size},
      {"norm_topk_prob", cfg.norm_topk_prob},
      {"tie_word_embeddings", cfg.tie_word_embeddings},
      {"mtp_num_hidden_layers", cfg.mtp_num_hidden_layers},
      {"has_vision", cfg.has_vision},
  };

  // Per-layer plan.
  r["num_layers"] = cfg.num_hidden_layers;
  json types = json::array(), layers = json::array(), ple_layers = json::array(), qsa = json::array(),
       gdn = json::array();
  for (int64_t L = 0; L < cfg.num_hidden_layers; ++L) {
    const LayerKind k = cfg.layer_types[size_t(L)];
    const bool ple = cfg.ple_index_of_layer(L) >= 0;
    types.push_back(layer_kind_name(k));
    layers.push_back({{"index", L}, {"type", layer_kind_name(k)}, {"ple", ple}});
    (k == LayerKind::QSA ? qsa : gdn).push_back(L);
    if (ple) ple_layers.push_back(L);
  }
  r["layer_types"] = types;
  r["layers"] = layers;
  r["qsa_layers"] = qsa;
  r["gdn_layers"] = gdn;
  r["ple_layers"] = ple_layers;

  // PLE hash parameters (lists concatenated over PLE layers in order).
  int64_t ple_rows = 0;
  json moduli = json::array(), offsets = json::array(), mults = json::array(), per_layer = json::array();
  for (int i = 0; i < int(cfg.ple_layer_ids.size()); ++i) {
    const NgramHashParams hp = ngram_hash_params(cfg, i);
    ple_rows += hp.rows;
    for (auto v : hp.moduli) moduli.push_back(v);
    for (auto v : hp.offsets) offsets.push_back(v);
    for (auto v : hp.multipliers) mults.push_back(v);
    per_layer.push_back({{"layer", cfg.ple_layer_ids[size_t(i)] - 1},
                         {"rows", hp.rows},
                         {"rows_used", hp.rows_used},
                         {"moduli", hp.moduli},
                         {"offsets", hp.offsets},
                         {"multipliers", hp.multipliers}});
  }
  r["ple_rows"] = ple_rows;
  r["ple_head_dim"] = cfg.ple_layer_ids.empty() ? 0 : cfg.ple_head_dim();
  r["ple_head_moduli"] = moduli;
  r["ple_head_offsets"] = offsets;
  r["ple_multipliers"] = mults;
  r["ple_detail"] = per_layer;
  r["ple_split_ngram_parts"] = cfg.split_ngram_parts;

  // Parameters from the config.
  ComponentTotals params{};
  for (const ExpectedTensor& e : expected_tensors(cfg)) params[int(e.component)] += e.numel();
  for (const ExpectedTensor& e : expected_mtp_tensors(cfg)) params[int(Component::Mtp)] += e.numel();
  const json* vision_cfg = nullptr;
  if (auto it = doc.find("vision_config"); cfg.model_type == "qwen4_exp" && it != doc.end() && !it->is_null()) {
    vision_cfg = &*it;
    params[int(Component::Vision)] = vision_param_count(parse_vision_geometry(*it, cfg.source));
  }

  // Weight bytes: from the stored tensors for a folder, else estimated from the config's dtype.
  ComponentTotals bytes{};
  // The CUDA backend's storage of quantized weights: logical elements and device bytes per component, and how.
  ComponentTotals q_elements{}, q_cuda_bytes{};
  std::map<std::string, std::set<std::string>> q_cuda_form;
  json quant = json::object();
  quant["config"] = quantization_config_summary(doc);
  if (folder) {
    const Checkpoint ck(path);
    const WeightManifest m = WeightManifest::build(cfg, ck);
    ComponentTotals elements{};
    json companions = json::object(), qdtypes = json::object();
    auto count = [&](const ManifestEntry& e) {
      elements[int(e.component)] += e.view.numel();
      bytes[int(e.component)] += int64_t(e.view.nbytes);
      if (auto s = quant_companion_suffix(e.name); !s.empty()) {
        companions[s] = companions.value(s, 0) + 1;
      } else if (!is_float(e.view.dtype) && e.view.dtype != DType::I64) {
        const std::string d(dtype_name(e.view.dtype));
        qdtypes[d] = qdtypes.value(d, 0) + 1;
      }
    };
    for (const auto& [name, e] : m.entries()) {
      if (name == "lm_head.weight" && e.source != "lm_head.weight") continue;  // tied alias
      count(e);
    }
    for (const ManifestEntry& e : m.extra()) count(e);
    json by_dtype = json::object();
    int64_t file_bytes = 0, tensors = 0;
    for (const auto& f : ck.files()) file_bytes += int64_t(f->file_size());
    for (const auto& [name, t] : ck.tensors()) {
      const std::string d(dtype_name(t->dtype));
      by_dtype[d] = by_dtype.value(d, int64_t(0)) + int64_t(t->nbytes);
      ++tensors;
    }
    const int64_t lm_elements = language_model_total(elements), lm_params = language_model_total(params);
    if (!m.quantized() && lm_elements != lm_params) {
      fail(
          "{}: the language-model tensors hold {} elements but the config implies {} (internal inconsistency of "
          "the weight manifest)",
          path, lm_elements, lm_params);
    }
    r["stored"] = {{"files", ck.files().size()},
                   {"file_bytes", file_bytes},
                   {"tensors", tensors},
                   {"bytes_by_dtype", by_dtype},
                   {"bytes_by_component", component_object(bytes)},
                   {"elements_by_component", component_object(elements)},
                   {"language_model_elements", lm_elements},
                   {"params_match_config", m.quantized() ? json("not checked: quantized checkpoint") : json(true)}};
    quant["quantized"] = m.quantized();
    quant["quantized_weight_dtypes"] = qdtypes;
    quant["companions"] = companions;
    // Storage format of each quantized component, validated against the declared quantization (loader/quant.h).
    const QuantScheme scheme = QuantScheme::build(read_quant_config(path), cfg, m);
    quant["formats"] = scheme.summary();
    std::map<std::string, Component> component_of;
    for (const ExpectedTensor& e : expected_tensors(cfg)) component_of.emplace(e.name, e.component);
    // The CUDA backend repacks a block of routed experts for its W4A16 kernels only when every matrix of the block is
    // of a format they hold, as 4-bit codes, for a block with 8-bit integer matrices as two 4-bit planes, for one of
    // FP8 matrices as FP8 bytes (core/quant_format.h w4a16_planes; ops/cuda/weights_ops.cpp load_quantized_experts).
    auto block_of = [](const std::string& name) { return name.substr(0, name.find(".experts.")); };
    auto fp8_group = [](const QuantizedWeight& w) { return w8a16_fp8_group(w.format, w.block_cols, w.cols); };
    std::map<std::string, int> block_planes;  // 0: FP16, 1: 4-bit codes, 2: two planes, 3 (kW4a16Fp8): FP8 bytes
    std::set<std::string> untiled;            // blocks with a group that does not tile its rows (no planes)
    for (const auto& [name, w] : scheme.weights()) {
      if (name.find(".mlp.experts.") == std::string::npos) continue;
      int& bp = block_planes.try_emplace(block_of(name), kW4a16BlockStart).first->second;
      bp = w4a16_block_planes(bp, w.format, w.bits);
      if (w.group > 0 && w.group < w.cols && w.cols % w.group != 0) untiled.insert(block_of(name));
    }
    for (auto& [block, p] : block_planes)
      if (p == 2 && untiled.count(block)) p = 0;
    for (const auto& [name, w] : scheme.weights()) {
      auto it = component_of.find(name);
      if (it == component_of.end()) continue;
      const int c = int(it->second);
      const auto bp = block_planes.find(block_of(name));
      const int planes = bp == block_planes.end() ? 0 : bp->second;
      const bool w4 = it->second == Component::RoutedExperts && planes > 0 && cfg.hidden_size % 8 == 0 &&
                      cfg.moe_intermediate_size % 8 == 0 &&
                      (w.format == QuantFormat::Nvfp4 || w.format == QuantFormat::CtNvfp4 || w.group % 8 == 0) &&
                      (planes != kW4a16Fp8 || fp8_group(w) % 8 == 0);
      q_elements[c] += w.rows * w.cols;
      if (w4 && planes == kW4a16Fp8) {
        const int64_t group = fp8_group(w);
        q_cuda_bytes[c] += w8a16_fp8_packed_bytes(w.rows, w.cols, group);
        q_cuda_form[component_name(it->second)].insert(
            fmt::format("w8a16 from {} (FP8 E4M3 bytes, F32 group scales, F32 row scales)", weight_format_name(w)));
      } else if (w4 && planes == 2) {
        q_cuda_bytes[c] += w4a16_planes_packed_bytes(w.rows, w.cols, w.group);
        const bool low = w4a16_planes(w.format, w.bits) == 1;  // a 2-4-bit matrix in a block with 8-bit ones
        q_cuda_form[component_name(it->second)].insert(
            fmt::format("w8a16 from {} (two 4-bit planes over the inputs twice{}: 4-bit codes, FP16 group scales, "
                        "uint8 zero points, F32 row scales)",
                        weight_format_name(w), low ? ", in a layer with 8-bit experts: its high plane zero" : ""));
      } else if (w4) {
        const bool zeros = w.format == QuantFormat::Gptq || w.zero_point != nullptr;
        const bool nv = w.format == QuantFormat::Nvfp4 || w.format == QuantFormat::CtNvfp4;
        q_cuda_bytes[c] += w4a16_packed_bytes(w.rows, w.cols, nv ? 16 : w.group, zeros);
        q_cuda_form[component_name(it->second)].insert(
            fmt::format("w4a16 from {} (4-bit codes, FP16 group scales{}, F32 row scales)", weight_format_name(w),
                        zeros ? ", uint8 zero points" : ""));
      } else if (w8_linear_holds(w.format) && w8_linear_weight_name(name)) {
        // A linear projection of 8-bit codes (model/qwen4_exp/weights.cpp get_linear; TP slices that cut an FP8
        // block take FP16 there): codes and float32 scales.
        const int64_t group = w8_linear_group(w);
        q_cuda_bytes[c] += w8_linear_bytes(w.rows, w.cols, group);
        q_cuda_form[component_name(it->second)].insert(
            fmt::format("w8a16 from {} ({} codes, F32 {} scales)", weight_format_name(w),
                        w.format == QuantFormat::CtInt8 ? "int8" : "FP8 E4M3", group < w.cols ? "block" : "row"));
      } else {
        q_cuda_bytes[c] += 2 * w.rows * w.cols;
        q_cuda_form[component_name(it->second)].insert(
            fmt::format("fp16 (dequantized from {} at load)", weight_format_name(w)));
      }
    }
    const auto formats = scheme.summary();
    if (auto pt = formats.find("ple_table"); pt != formats.end()) {
      for (const auto& [form, n] : pt->second) {
        q_cuda_form["ple_table"].insert(
            form == "fp8-scalar"
                ? "fp8 e4m3 kept as stored (pinned host or GPU), rows converted in the gather"
                : fmt::format("{} kept as stored with its group scales (pinned host or GPU), rows converted in the "
                              "gather",
                              form));
      }
    }
    // MTP and vision as stored (the vision tower geometry of a folder is the one its tensors have).
    params[int(Component::Mtp)] = elements[int(Component::Mtp)];
    params[int(Component::Vision)] = elements[int(Component::Vision)];
  } else {
    std::string dtype = "bfloat16";
    for (const json* o : {&doc, doc.contains("text_config") ? &doc["text_config"] : &doc}) {
      for (const char* k : {"torch_dtype", "dtype"}) {
        if (auto it = o->find(k); it != o->end() && it->is_string()) dtype = it->get<std::string>();
      }
    }
    const int64_t wb = torch_dtype_bytes(dtype, cfg.source + ": dtype");
    const int64_t tb = cfg.ple_embedding_dtype.empty()
                           ? wb
                           : torch_dtype_bytes(cfg.ple_embedding_dtype, cfg.source + ": ple_embedding_dtype");
    for (int i = 0; i < kNumComponents; ++i) {
      const Component c = Component(i);
      bytes[i] = params[i] * (c == Component::PleTable ? tb : c == Component::PleHashBuffers ? 8 : wb);
    }
    quant["quantized"] = nullptr;  // unknown without the tensors
  }
  if (cfg.tie_word_embeddings) params[int(Component::LmHead)] = 0;  // shares embed_tokens
  json pj = component_object(params);
  pj["language_model"] = language_model_total(params);
  pj["total"] = language_model_total(params) + params[int(Component::Mtp)] + params[int(Component::Vision)];
  r["params"] = pj;
  r["vision_from_config"] = vision_cfg != nullptr && !folder;
  // What the CUDA backend (single GPU) holds: FP16 weights, quantized routed experts as W4A16 or FP16 (above), the
  // PLE table and hash buffers as stored. Language model only (no MTP / vision).
  if (folder) {
    ComponentTotals cuda_bytes{};
    int64_t gpu = 0;
    for (int i = 0; i < kNumComponents; ++i) {
      const Component c = Component(i);
      if (c == Component::Mtp || c == Component::Vision) continue;
      cuda_bytes[i] = c == Component::PleTable || c == Component::PleHashBuffers
                          ? bytes[i]
                          : 2 * (params[i] - q_elements[i]) + q_cuda_bytes[i];
      if (c != Component::PleTable && c != Component::PleHashBuffers) gpu += cuda_bytes[i];
    }
    json forms = json::object();
    for (const auto& [c, f] : q_cuda_form) forms[c] = f;
    quant["cuda_storage"] = forms;
    r["memory_cuda"] = {{"weight_bytes_by_component", component_object(cuda_bytes)},
                        {"gpu_weight_bytes", gpu},
                        {"routed_expert_bytes", cuda_bytes[int(Component::RoutedExperts)]},
                        {"ple_table_bytes", cuda_bytes[int(Component::PleTable)]}};
  }
  r["quantization"] = quant;

  // Memory plan.
  const StatePlan one = state_plan(cfg, 1, opt.kv_bytes), per_gpu = state_plan(cfg, opt.tp, opt.kv_bytes);
  const int64_t context = opt.context ? opt.context : cfg.max_position_embeddings;
  const int64_t weights_gpu = weight_bytes_per_gpu(bytes, opt.tp);
  r["kv_bytes_per_token"] = one.kv_bytes_per_token;
  r["indexer_bytes_per_token"] = one.indexer_bytes_per_token;
  r["gdn_state_bytes_per_sequence"] = one.gdn_state_bytes_per_sequence;
  r["gdn_conv_state_bytes_per_sequence"] = one.gdn_conv_state_bytes_per_sequence;
  r["ple_state_bytes_per_sequence"] = one.ple_state_bytes_per_sequence;
  r["memory"] = {
      {"tp", opt.tp},
      {"context", context},
      {"weights_from", folder ? "checkpoint" : "config (unquantized dtype)"},
      {"weight_bytes_by_component", component_object(bytes)},
      {"weight_bytes_per_gpu", weights_gpu},
      {"ple_table_bytes_host", bytes[int(Component::PleTable)] + bytes[int(Component::PleHashBuffers)]},
      {"kv_bytes_per_token_per_gpu", per_gpu.kv_bytes_per_token},
      {"indexer_bytes_per_token_per_gpu", per_gpu.indexer_bytes_per_token},
      {"gdn_state_bytes_per_sequence_per_gpu", per_gpu.gdn_state_bytes_per_sequence},
      {"gdn_conv_state_bytes_per_sequence_per_gpu", per_gpu.gdn_conv_state_bytes_per_sequence},
      {"ple_state_bytes_per_sequence_per_gpu", per_gpu.ple_state_bytes_per_sequence},
      {"sequence_bytes_per_gpu", per_gpu.bytes_at_context(context)},
      {"total_bytes_per_gpu", weights_gpu + per_gpu.bytes_at_context(context)},
      {"tp_plan", tp_memory_plan(cfg, tp_plan)},
  };
  return r;
}

namespace {

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string grouped(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

std::string format_inspect(const json& r) {
  std::ostringstream o;
  const json& d = r["dims"];
  o << fmt::format("{} ({}{})\n", r["source"].get<std::string>(), r["model_type"].get<std::string>(),
                   r["architecture"].get<std::string>().empty() ? "" : ", " + r["architecture"].get<std::string>());
  o << fmt::format("  vocab {}, hidden {}, {} hyper-connection streams (rank {}), max positions {}\n",
                   d["vocab_size"].get<int64_t>(), d["hidden_size"].get<int64_t>(), d["hc_count"].get<int64_t>(),
                   d["hc_lowrank"].get<int64_t>(), d["max_position_embeddings"].get<int64_t>());
  o << fmt::format(
      "  QSA: {} heads / {} KV heads x {}, rotary dim {}, indexer {} heads x {}, budget {} in blocks of {}\n",
      d["num_attention_heads"].get<int64_t>(), d["num_key_value_heads"].get<int64_t>(), d["head_dim"].get<int64_t>(),
      d["rotary_dim"].get<int64_t>(), d["indexer_n_heads"].get<int64_t>(), d["indexer_head_dim"].get<int64_t>(),
      d["indexer_budget"].get<int64_t>(), d["indexer_compress_ratio"].get<int64_t>());
  o << fmt::format("  GDN: {} key heads x {}, {} value heads x {}, conv {}, gate {}\n",
                   d["linear_num_key_heads"].get<int64_t>(), d["linear_key_head_dim"].get<int64_t>(),
                   d["linear_num_value_heads"].get<int64_t>(), d["linear_value_head_dim"].get<int64_t>(),
                   d["linear_conv_kernel_dim"].get<int64_t>(), d["output_gate_type"].get<std::string>());
  o << fmt::format("  MoE: {} experts, top-{}, width {}, shared expert width {}; MTP layers {}; vision {}\n",
                   d["num_experts"].get<int64_t>(), d["num_experts_per_tok"].get<int64_t>(),
                   d["moe_intermediate_size"].get<int64_t>(), d["shared_expert_intermediate_size"].get<int64_t>(),
                   d["mtp_num_hidden_layers"].get<int64_t>(), d["has_vision"].get<bool>() ? "yes" : "no");

  o << fmt::format("\nLayers ({}):\n", r["num_layers"].get<int64_t>());
  for (const auto& l : r["layers"]) {
    o << fmt::format("  {:>3}  {}{}\n", l["index"].get<int64_t>(), l["type"] == "qsa" ? "QSA" : "GDN",
                     l["ple"].get<bool>() ? "  + PLE" : "");
  }
  for (const auto& p : r["ple_detail"]) {
    o << fmt::format("PLE on layer {}: {} table rows ({} addressed) x {}, moduli [{}], multipliers [{}]\n",
                     p["layer"].get<int64_t>(), grouped(p["rows"].get<int64_t>()),
                     grouped(p["rows_used"].get<int64_t>()), r["ple_head_dim"].get<int64_t>(),
                     fmt::join(p["moduli"].get<std::vector<int64_t>>(), ", "),
                     fmt::join(p["multipliers"].get<std::vector<int64_t>>(), ", "));
  }

  o << "\nParameters:\n";
  for (int i = 0; i < kNumComponents; ++i) {
    const char* k = component_name(Component(i));
    o << fmt::format("  {:<18} {:>20}\n", k, grouped(r["params"][k].get<int64_t>()));
  }
  o << fmt::format("  {:<18} {:>20}\n  {:<18} {:>20}\n", "language_model",
                   grouped(r["params"]["language_model"].get<int64_t>()), "total",
                   grouped(r["params"]["total"].get<int64_t>()));

  if (r.contains("stored")) {
    const json& s = r["stored"];
    o << fmt::format("\nCheckpoint: {} files, {} tensors, {}\n", s["files"].get<int64_t>(), s["tensors"].get<int64_t>(),
                     human_bytes(s["file_bytes"].get<int64_t>()));
    for (const auto& [k, v] : s["bytes_by_dtype"].items()) {
      o << fmt::format("  {:<8} {:>20}  ({})\n", k, grouped(v.get<int64_t>()), human_bytes(v.get<int64_t>()));
    }
    o << fmt::format("  language-model elements match the config: {}\n",
                     s["params_match_config"].is_boolean() ? "yes" : s["params_match_config"].get<std::string>());
  }
  const json& q = r["quantization"];
  o << fmt::format("Quantization: config {}, found {}\n", q["config"].is_null() ? "none" : q["config"].dump(),
                   q["quantized"].is_null() ? "unknown (no weights)"
                   : q["quantized"].get<bool>()
                       ? fmt::format("weights {} with {}", q["quantized_weight_dtypes"].dump(), q["companions"].dump())
                       : "none");
  if (q.contains("formats")) {
    for (const auto& [component, by_format] : q["formats"].items()) {
      for (const auto& [format, n] : by_format.items()) {
        o << fmt::format("  {:<18} {} ({} tensors)\n", component, format, n.get<int64_t>());
      }
    }
  }

  if (q.contains("cuda_storage") && !q["cuda_storage"].empty()) {
    o << "  on the CUDA backend:\n";
    for (const auto& [component, forms] : q["cuda_storage"].items()) {
      for (const auto& f : forms) o << fmt::format("  {:<18} {}\n", component, f.get<std::string>());
    }
  }

  const json& m = r["memory"];
  o << fmt::format("\nMemory plan (TP {}, context {} tokens, weights from {}):\n", m["tp"].get<int64_t>(),
                   m["context"].get<int64_t>(), m["weights_from"].get<std::string>());
  auto line = [&](const char* what, int64_t b) {
    o << fmt::format("  {:<44} {:>18}  ({})\n", what, grouped(b), human_bytes(b));
  };
  line("weights per GPU", m["weight_bytes_per_gpu"].get<int64_t>());
  line("PLE table on the host", m["ple_table_bytes_host"].get<int64_t>());
  line("KV per token (whole model)", r["kv_bytes_per_token"].get<int64_t>());
  line("indexer keys per token (whole model)", r["indexer_bytes_per_token"].get<int64_t>());
  line("GDN recurrent state per sequence", r["gdn_state_bytes_per_sequence"].get<int64_t>());
  line("GDN conv state per sequence", r["gdn_conv_state_bytes_per_sequence"].get<int64_t>());
  line("PLE state per sequence", r["ple_state_bytes_per_sequence"].get<int64_t>());
  line("KV + indexer per token per GPU",
       m["kv_bytes_per_token_per_gpu"].get<int64_t>() + m["indexer_bytes_per_token_per_gpu"].get<int64_t>());
  line("one sequence at the context, per GPU", m["sequence_bytes_per_gpu"].get<int64_t>());
  line("total per GPU", m["total_bytes_per_gpu"].get<int64_t>());
  const json& tpp = m["tp_plan"];
  o << fmt::format("Per rank at TP {} (loader/sharding.h; FP16 weights, float32 caches; V100-32GB usable {}):\n",
                   tpp["tp"].get<int64_t>(), human_bytes(tpp["v100_usable_bytes"].get<int64_t>()));
  auto range = [](const json& j) { return fmt::format("{}..{}", j[0].get<int64_t>(), j[1].get<int64_t>()); };
  for (const json& k : tpp["ranks"]) {
    o << fmt::format(
        "  rank {}: GDN key heads {} value heads {}, QSA KV heads {} query heads {}, expert columns {}, vocab {}\n",
        k["rank"].get<int>(), range(k["gdn_key_heads"]), range(k["gdn_value_heads"]), range(k["qsa_kv_heads"]),
        range(k["qsa_query_heads"]), range(k["moe_intermediate"]), range(k["vocab_rows"]));
    const json& k0 = tpp["ranks"][0];
    bool same = k["rank"].get<int>() > 0;
    for (const char* key : {"weight_bytes", "weight_bytes_w4_experts", "ple_table_bytes_host", "kv_bytes_per_token",
                            "indexer_bytes_per_token", "state_bytes_per_sequence"})
      same = same && k[key] == k0[key];
    if (same) {
      o << "    memory as rank 0\n";
      continue;
    }
    line("  weights (FP16)", k["weight_bytes"].get<int64_t>());
    line("  weights (routed experts at 4.5 bits)", k["weight_bytes_w4_experts"].get<int64_t>());
    line("  PLE table share (host)", k["ple_table_bytes_host"].get<int64_t>());
    line("  KV + indexer per token",
         k["kv_bytes_per_token"].get<int64_t>() + k["indexer_bytes_per_token"].get<int64_t>());
    line("  GDN + PLE state per sequence", k["state_bytes_per_sequence"].get<int64_t>());
    for (const json& c : k["contexts"])
      o << fmt::format("    one sequence at {:>6} tokens: total {} (V100-32GB: {}), with 4.5-bit experts {} ({})\n",
                       c["context"].get<int64_t>(), human_bytes(c["total_bytes"].get<int64_t>()),
                       c["fits_v100_32gb"].get<bool>() ? "fits" : "does not fit",
                       human_bytes(c["total_bytes_w4_experts"].get<int64_t>()),
                       c["fits_v100_32gb_w4_experts"].get<bool>() ? "fits" : "does not fit");
  }
  if (r.contains("memory_cuda")) {
    const json& c = r["memory_cuda"];
    o << "CUDA backend, one GPU (as loaded):\n";
    line("weights on the GPU", c["gpu_weight_bytes"].get<int64_t>());
    line("  of which routed experts", c["routed_expert_bytes"].get<int64_t>());
    line("PLE table (pinned host or GPU)", c["ple_table_bytes"].get<int64_t>());
  }
  return o.str();
}

}  // namespace flashnext
