#include "loader/manifest.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "loader/quant.h"
#include "loader/tensor_plan.h"
#include "ple/ngram_hash.h"

namespace flashnext {

const char* component_name(Component c) {
  switch (c) {
    case Component::Embedding:
      return "embedding";
    case Component::LmHead:
      return "lm_head";
    case Component::HyperConnection:
      return "hyper_connection";
    case Component::GatedDeltaNet:
      return "gated_deltanet";
    case Component::QSA:
      return "qsa";
    case Component::Router:
      return "router";
    case Component::SharedExpert:
      return "shared_expert";
    case Component::RoutedExperts:
      return "routed_experts";
    case Component::PleProjections:
      return "ple_projections";
    case Component::PleTable:
      return "ple_table";
    case Component::PleHashBuffers:
      return "ple_hash_buffers";
    case Component::Mtp:
      return "mtp";
    case Component::Vision:
      return "vision";
  }
  return "unknown";
}

namespace {

constexpr const char* kTextPrefixes[] = {"model.language_model.", "model."};

// Suffixes that quantization formats attach to a weight's stem (ModelOpt, FP8 block, compressed-tensors).
constexpr const char* kCompanions[] = {"weight_scale",
                                       "weight_scale_2",
                                       "weight_scale_inv",
                                       "input_scale",
                                       "input_global_scale",
                                       "weight_global_scale",
                                       "weight_zero_point",
                                       "weight_shape",
                                       "weight_packed",
                                       "qweight",
                                       "qzeros",
                                       "scales",
                                       "g_idx"};  // GPTQ and AutoAWQ (loader/quant.h)
// Companions that make a non-float weight dequantizable.
constexpr const char* kScales[] = {"weight_scale", "weight_scale_inv", "weight_scale_2", "weight_global_scale"};

bool is_float(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32;
}

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}

// "layers.L<rest>" -> L and rest; false when `name` is not a layer tensor.
bool split_layer(const std::string& name, int* layer, std::string* rest) {
  if (!starts_with(name, "layers.")) return false;
  const char* b = name.data() + 7;
  const char* e = name.data() + name.size();
  auto [p, ec] = std::from_chars(b, e, *layer);
  if (ec != std::errc() || p == b || p == e || *p != '.') return false;
  *rest = std::string(p, e);
  return true;
}

// ".ple.ple_embedding.ngram_embedding.shard_K" + tail -> K (tail ".weight": a row shard, ".weight_scale": its
// int8 group scales).
bool parse_shard(const std::string& rest, const std::string& tail, int64_t* k) {
  static const std::string head = ".ple.ple_embedding.ngram_embedding.shard_";
  if (rest.size() <= head.size() + tail.size() || rest.compare(0, head.size(), head) != 0 ||
      rest.compare(rest.size() - tail.size(), tail.size(), tail) != 0) {
    return false;
  }
  const char* b = rest.data() + head.size();
  const char* e = rest.data() + rest.size() - tail.size();
  auto [p, ec] = std::from_chars(b, e, *k);
  return ec == std::errc() && p == e && *k >= 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// Shape a quantized weight of dtype `t` takes for a logical [N, K] weight: FP8/INT8 keep the shape, U8 packs two
// FP4 codes per byte ([N, K/2]), I32 packs eight 4-bit codes ([N, K/8]) (ARTIFACTS.md 3).
bool quantized_shape_ok(DType t, const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
  switch (t) {
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::I8:
      return got == want;
    case DType::U8:
      return want.size() == 2 && want[1] % 2 == 0 && got == std::vector<int64_t>{want[0], want[1] / 2};
    case DType::I32:
      return want.size() == 2 && want[1] % 8 == 0 && got == std::vector<int64_t>{want[0], want[1] / 8};
    default:
      return false;
  }
}

std::vector<int64_t> read_i64(const TensorView& t) {
  std::vector<int64_t> v(size_t(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(int64_t));  // the data may be unaligned
  return v;
}

}  // namespace

std::string quant_companion_suffix(const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string suffix = dot == std::string::npos ? name : name.substr(dot + 1);
  for (const char* c : kCompanions) {
    if (suffix == c) return suffix;
  }
  return "";
}

WeightManifest WeightManifest::build(const ModelConfig& cfg, const Checkpoint& ckpt) {
  WeightManifest m;
  const std::vector<ExpectedTensor> expected = expected_tensors(cfg);
  std::unordered_map<std::string, const ExpectedTensor*> by_name;
  by_name.reserve(expected.size() * 2);
  for (auto& e : expected) {
    if (e.component != Component::PleTable) by_name.emplace(e.name, &e);
  }
  // A tied checkpoint may still carry lm_head.weight; then it must have the embedding's shape.
  ExpectedTensor tied_head{"lm_head.weight", {cfg.vocab_size, cfg.hidden_size}, Component::LmHead, -1, false};
  if (cfg.tie_word_embeddings) by_name.emplace(tied_head.name, &tied_head);

  std::string text_prefix = cfg.model_type == "qwen4_exp" ? kTextPrefixes[0] : kTextPrefixes[1];
  auto ckpt_name = [&](const std::string& logical) {
    return logical == "lm_head.weight" ? logical : text_prefix + logical;
  };
  auto add = [&](const std::string& logical, const std::string& source, Component c, int layer, TensorView view) {
    if (auto it = m.entries_.find(logical); it != m.entries_.end()) {
      fail(
          "{}: tensor '{}' (in {}) and '{}' (in {}) both hold {}: the checkpoint mixes fused and per-expert "
          "copies (or repeats a tensor)",
          ckpt.dir(), source, view.file, it->second.source, it->second.view.file, logical);
    }
    m.entries_.emplace(logical, ManifestEntry{logical, source, c, layer, std::move(view)});
  };
  std::map<int, std::map<int64_t, std::string>> shards;  // layer -> shard number -> logical name
  std::map<int, std::map<int64_t, std::string>> shard_scales;  // layer -> shard number -> checkpoint name (int8)

  for (const auto& [name, tp] : ckpt.tensors()) {
    const TensorView& t = *tp;
    if (starts_with(name, "model.visual.")) {
      m.extra_.push_back(ManifestEntry{name, name, Component::Vision, -1, t});
      continue;
    }
    if (starts_with(name, "mtp.") || starts_with(name, "model.mtp.")) {
      m.extra_.push_back(ManifestEntry{name, name, Component::Mtp, -1, t});
      continue;
    }
    std::string logical;
    if (name == "lm_head.weight" || (starts_with(name, "lm_head.") && !quant_companion_suffix(name).empty())) {
      logical = name;  // a quantized head keeps its companions (GPTQ lm_head: qweight, qzeros, ...)
    } else {
      for (const char* p : kTextPrefixes) {
        if (starts_with(name, p)) {
          logical = name.substr(std::strlen(p));
          text_prefix = p;
          break;
        }
      }
      if (logical.empty()) {
        fail(
            "{}: unexpected tensor '{}': not a qwen4_exp checkpoint name (expected model.language_model.*, model.*, "
            "lm_head.weight, model.visual.* or mtp.*)",
            t.file, name);
      }
    }
    if (auto it = by_name.find(logical); it != by_name.end()) {
      add(logical, name, it->second->component, it->second->layer, t);
      continue;
    }
    int layer = -1;
    std::string rest;
    const bool in_layer = split_layer(logical, &layer, &rest) && layer < cfg.num_hidden_layers;
    // Fused 3-D experts: sliced into per-expert zero-copy views.
    if (in_layer && (rest == ".mlp.experts.gate_up_proj" || rest == ".mlp.experts.down_proj")) {
      const bool gate_up = rest == ".mlp.experts.gate_up_proj";
      const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
      const std::vector<int64_t> want = gate_up ? std::vector<int64_t>{E, 2 * I, H} : std::vector<int64_t>{E, H, I};
      if (!is_float(t.dtype)) {
        fail(
            "{}: tensor '{}' is {}: fused expert tensors must be BF16, F16 or F32 (quantized experts are read "
            "per expert)",
            t.file, name, dtype_name(t.dtype));
      }
      if (t.shape != want) {
        fail("{}: tensor '{}' has shape {}, expected {} (num_experts, {}) from {}", t.file, name, t.shape_str(),
             shape_str(want), gate_up ? "2 x moe_intermediate_size, hidden_size" : "hidden_size, moe_intermediate_size",
             cfg.source);
      }
      const size_t es = dtype_size(t.dtype);
      const size_t gate_up_bytes = size_t(2 * I * H) * es, down_bytes = size_t(H * I) * es;  // one expert
      for (int64_t e = 0; e < E; ++e) {
        const std::string p = fmt::format("layers.{}.mlp.experts.{}.", layer, e);
        auto slice = [&](const char* proj, size_t offset, std::vector<int64_t> shape) {
          TensorView v = t;
          v.name = name;
          v.shape = std::move(shape);
          v.data = t.data + offset;
          v.nbytes = size_t(v.numel()) * es;
          add(p + proj, name, Component::RoutedExperts, layer, std::move(v));
        };
        if (gate_up) {
          slice("gate_proj.weight", size_t(e) * gate_up_bytes, {I, H});                     // rows 0..I-1
          slice("up_proj.weight", size_t(e) * gate_up_bytes + size_t(I * H) * es, {I, H});  // rows I..2I-1
        } else {
          slice("down_proj.weight", size_t(e) * down_bytes, {H, I});
        }
      }
      continue;
    }
    // PLE table row shards, placed by number.
    int64_t k = -1;
    if (in_layer && cfg.ple_index_of_layer(layer) >= 0 && parse_shard(rest, ".weight", &k)) {
      add(logical, name, Component::PleTable, layer, t);
      shards[layer][k] = logical;
      continue;
    }
    if (in_layer && cfg.ple_index_of_layer(layer) >= 0 && parse_shard(rest, ".weight_scale", &k)) {
      add(logical, name, Component::PleTable, layer, t);  // an int8 shard's group scales, checked with the shards
      shard_scales[layer][k] = name;
      continue;
    }
    if (in_layer && cfg.ple_index_of_layer(layer) >= 0 && rest == ".ple.ple_embedding.ngram_embedding.weight_scale") {
      add(logical, name, Component::PleTable, layer, t);
      continue;
    }
    // Quantization companions of an expected weight.
    const size_t dot = logical.rfind('.');
    if (dot != std::string::npos) {
      const std::string stem = logical.substr(0, dot);
      const bool companion = !quant_companion_suffix(logical).empty();
      if (auto it = by_name.find(stem + ".weight"); companion && it != by_name.end()) {
        add(logical, name, it->second->component, it->second->layer, t);
        continue;
      }
    }
    fail(
        "{}: unexpected tensor '{}' {}: the config {} implies no such tensor (layer types, ple_layer_ids, "
        "num_hidden_layers and attention_bias decide which tensors exist)",
        t.file, name, t.shape_str(), cfg.source);
  }

  // Every expected tensor: present with the right shape and dtype.
  auto has = [&](const std::string& n) { return m.entries_.count(n) > 0; };
  std::vector<std::string> missing;
  for (const ExpectedTensor& e : expected) {
    if (e.component == Component::PleTable) continue;  // checked as a whole below
    auto it = m.entries_.find(e.name);
    const std::string stem =
        e.name.size() > 7 && e.name.ends_with(".weight") ? e.name.substr(0, e.name.size() - 7) : "";
    if (it == m.entries_.end()) {
      if (e.is_int64) continue;  // hash buffers are derivable from the config; compared below when present
      // GPTQ: I32 [K*b/32, N] for b = 2, 3, 4 or 8 bits; AutoAWQ GEMM: I32 [K, N/8] (the config says which and
      // how many bits: loader/quant.cpp, which checks the scales and the rest).
      if (!stem.empty() && has(stem + ".qweight")) {
        const TensorView& p = m.entries_.at(stem + ".qweight").view;
        const bool two_d = e.shape.size() == 2, mult8 = two_d && e.shape[0] % 8 == 0;
        bool gptq = false;
        for (int64_t b : {2, 3, 4, 8})
          gptq = gptq || (two_d && (e.shape[1] * b) % 32 == 0 &&
                          p.shape == std::vector<int64_t>{e.shape[1] * b / 32, e.shape[0]});
        const bool awq = mult8 && p.shape == std::vector<int64_t>{e.shape[1], e.shape[0] / 8};
        if (p.dtype != DType::I32 || !(gptq || awq)) {
          fail(
              "{}: tensor '{}' is {} {}, which is neither a GPTQ packing (I32 [in*bits/32, out], bits 2, 3, 4 or 8) "
              "nor the AutoAWQ GEMM packing (I32 [in, out/8]) of the logical {} weight",
              p.file, ckpt_name(stem + ".qweight"), dtype_name(p.dtype), p.shape_str(), shape_str(e.shape));
        }
        m.quantized_ = true;
        continue;
      }
      if (!stem.empty() && has(stem + ".weight_packed")) {
        const TensorView& p = m.entries_.at(stem + ".weight_packed").view;
        if (!quantized_shape_ok(p.dtype, p.shape, e.shape) || p.dtype == DType::F8_E4M3 || p.dtype == DType::F8_E5M2) {
          fail("{}: tensor '{}' is {} {}, which is not a packed form of the logical {} weight", p.file,
               ckpt_name(stem + ".weight_packed"), dtype_name(p.dtype), p.shape_str(), shape_str(e.shape));
        }
        if (!has(stem + ".weight_scale")) {
          fail("{}: tensor '{}' has no '{}' to dequantize it", p.file, ckpt_name(stem + ".weight_packed"),
               ckpt_name(stem + ".weight_scale"));
        }
        m.quantized_ = true;
        continue;
      }
      missing.push_back(fmt::format("'{}' {}", ckpt_name(e.name), shape_str(e.shape)));
      continue;
    }
    const TensorView& t = it->second.view;
    const std::string& shown = it->second.source;
    if (e.is_int64) {
      if (t.dtype != DType::I64 || t.shape != e.shape) {
        fail("{}: tensor '{}' is {} {}, expected I64 {}", t.file, shown, dtype_name(t.dtype), t.shape_str(),
             shape_str(e.shape));
      }
      continue;
    }
    if (is_float(t.dtype)) {
      if (t.shape != e.shape) {
        fail("{}: tensor '{}' has shape {}, expected {} from the config {}", t.file, shown, t.shape_str(),
             shape_str(e.shape), cfg.source);
      }
      continue;
    }
    const bool scaled = !stem.empty() && std::any_of(std::begin(kScales), std::end(kScales),
                                                     [&](const char* s) { return has(stem + "." + s); });
    if (!scaled) {
      fail(
          "{}: tensor '{}' is {}, but a weight without quantization scales must be BF16, F16 or F32 (no '{}' or "
          "other scale companion found)",
          t.file, shown, dtype_name(t.dtype), ckpt_name(stem + ".weight_scale"));
    }
    if (!quantized_shape_ok(t.dtype, t.shape, e.shape)) {
      fail("{}: quantized tensor '{}' is {} {}, which does not store the logical {} weight", t.file, shown,
           dtype_name(t.dtype), t.shape_str(), shape_str(e.shape));
    }
    m.quantized_ = true;
  }
  if (!missing.empty()) {
    fail("{}: {} tensor{} missing from the checkpoint (config {}): {}{}", ckpt.dir(), missing.size(),
         missing.size() == 1 ? " is" : "s are", cfg.source,
         fmt::join(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 5), ", "),
         missing.size() > 5 ? ", ..." : "");
  }

  // PLE: the table shards tile [rows, ple_head_dim]; stored hash buffers equal the derived ones.
  for (int i = 0; i < int(cfg.ple_layer_ids.size()); ++i) {
    const int layer = int(cfg.ple_layer_ids[i] - 1);
    const NgramHashParams hp = ngram_hash_params(cfg, i);
    const std::string table = fmt::format("layers.{}.ple.ple_embedding.ngram_embedding", layer);
    auto sit = shards.find(layer);
    if (sit == shards.end()) {
      fail("{}: the PLE n-gram table of layer {} is missing: no '{}.shard_K.weight' tensors (expected {} rows x {})",
           ckpt.dir(), layer, ckpt_name(table), hp.rows, cfg.ple_head_dim());
    }
    int64_t rows = 0, next = 0, table_group = 0;
    DType table_dtype = DType::BF16, table_scale_dtype = DType::F16;
    const bool scaled_table = has(table + ".weight_scale");
    for (const auto& [k, logical] : sit->second) {
      const TensorView& t = m.entries_.at(logical).view;
      if (k != next) fail("{}: PLE table shard {} of layer {} is missing (found shard {})", ckpt.dir(), next, layer, k);
      ++next;
      if (k == 0) {
        table_dtype = t.dtype;
      } else if (t.dtype != table_dtype) {
        fail("{}: tensor '{}' is {}, but shard 0 of the same PLE table is {}: a table's shards share one dtype", t.file,
             ckpt_name(logical), dtype_name(t.dtype), dtype_name(table_dtype));
      }
      const bool fp8 = t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E5M2, int8 = t.dtype == DType::I8;
      const std::string group_scales = fmt::format("{}.shard_{}.weight_scale", table, k);
      if (fp8 && !scaled_table) {
        fail(
            "{}: tensor '{}' is an FP8 PLE table shard without its table scale '{}' (not in the checkpoint; a PLE "
            "table kept in files of its own needs the file that holds it named in ple_table.json too)",
            t.file, ckpt_name(logical), ckpt_name(table + ".weight_scale"));
      }
      if (!is_float(t.dtype) && !(fp8 && scaled_table) && !(int8 && has(group_scales))) {
        fail(
            "{}: tensor '{}' is {}: PLE table shards must be BF16, F16, F32, FP8 with '{}', or I8 with group scales "
            "'{}'",
            t.file, ckpt_name(logical), dtype_name(t.dtype), ckpt_name(table + ".weight_scale"),
            ckpt_name(group_scales));
      }
      if (has(group_scales) && !int8) {
        fail("{}: tensor '{}' is {}: group scales '{}' go only with an I8 shard", t.file, ckpt_name(logical),
             dtype_name(t.dtype), ckpt_name(group_scales));
      }
      if (int8 && scaled_table) {
        fail("{}: '{}' is an I8 shard with group scales; the table-wide FP8 multiplier '{}' does not go with it",
             t.file, ckpt_name(logical), ckpt_name(table + ".weight_scale"));
      }
      if (int8) {
        const TensorView& sv = m.entries_.at(group_scales).view;
        const int64_t g = ple_int8_group(t, sv, /*check_values=*/true);  // throws naming both tensors
        if (k == 0) {
          table_group = g;
          table_scale_dtype = sv.dtype;
        } else if (g != table_group || sv.dtype != table_scale_dtype) {
          fail("{}: tensor '{}' holds {} group scales of {} columns, but shard 0 of the table has {} ones of {}",
               sv.file, sv.name, dtype_name(sv.dtype), g, dtype_name(table_scale_dtype), table_group);
        }
      }
      if (fp8 || int8) m.quantized_ = true;
      if (t.shape.size() != 2 || t.shape[1] != cfg.ple_head_dim()) {
        fail("{}: tensor '{}' has shape {}, expected [rows, {}] (ple_embed_dim / n-gram heads)", t.file,
             ckpt_name(logical), t.shape_str(), cfg.ple_head_dim());
      }
      rows += t.shape[0];
    }
    for (const auto& [k, name] : shard_scales[layer]) {
      if (!sit->second.count(k)) {
        fail("{}: tensor '{}' holds group scales of PLE table shard {} of layer {}, which the checkpoint lacks",
             ckpt.dir(), name, k, layer);
      }
    }
    if (rows != hp.rows) {
      fail(
          "{}: the {} PLE table shards of layer {} hold {} rows, but the config {} gives {} (sum of the {} head "
          "moduli padded to a multiple of {})",
          ckpt.dir(), sit->second.size(), layer, rows, cfg.source, hp.rows, hp.heads(),
          cfg.make_ngram_vocab_size_divisible_by);
    }
    const std::pair<const char*, const std::vector<int64_t>*> buffers[] = {{"layer_multipliers", &hp.multipliers},
                                                                           {"ngram_heads_vocab_sizes", &hp.moduli},
                                                                           {"ngram_heads_offsets", &hp.offsets}};
    for (auto [buf, want] : buffers) {
      auto it = m.entries_.find(fmt::format("layers.{}.ple.ple_embedding.{}", layer, buf));
      if (it == m.entries_.end()) continue;
      const auto got = read_i64(it->second.view);
      if (got != *want) {
        fail(
            "{}: tensor '{}' holds [{}] but the config {} gives [{}] (derived from ngram_vocab_size_base, seed, "
            "vocab_size and the PLE layer number)",
            it->second.view.file, it->second.source, fmt::join(got, ", "), cfg.source, fmt::join(*want, ", "));
      }
    }
  }

  // Tied head: a zero-copy alias of the embedding.
  if (cfg.tie_word_embeddings && !has("lm_head.weight")) {
    const ManifestEntry& emb = m.entries_.at("embed_tokens.weight");
    m.entries_.emplace("lm_head.weight", ManifestEntry{"lm_head.weight", emb.source, Component::LmHead, -1, emb.view});
  }
  return m;
}

const ManifestEntry* WeightManifest::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const TensorView& WeightManifest::get(const std::string& name) const {
  auto* e = find(name);
  if (!e) fail("weight manifest: no logical tensor '{}'", name);
  return e->view;
}

std::vector<const ManifestEntry*> WeightManifest::ple_table_shards(int layer) const {
  std::vector<const ManifestEntry*> out;
  for (int64_t k = 0;; ++k) {
    auto* e = find(fmt::format("layers.{}.ple.ple_embedding.ngram_embedding.shard_{}.weight", layer, k));
    if (!e) return out;
    out.push_back(e);
  }
}

const ManifestEntry* WeightManifest::ple_table_shard_scales(int layer, int64_t k) const {
  return find(fmt::format("layers.{}.ple.ple_embedding.ngram_embedding.shard_{}.weight_scale", layer, k));
}

}  // namespace flashnext
