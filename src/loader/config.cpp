#include "loader/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace flashnext {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* layer_kind_name(LayerKind k) { return k == LayerKind::GatedDeltaNet ? "linear_attention" : "qsa"; }

int64_t ModelConfig::num_layers_of(LayerKind k) const {
  return std::count(layer_types.begin(), layer_types.end(), k);
}

int ModelConfig::ple_index_of_layer(int64_t layer) const {
  for (size_t i = 0; i < ple_layer_ids.size(); ++i) {
    if (ple_layer_ids[i] == layer + 1) return int(i);
  }
  return -1;
}

namespace {

// Typed readers: a present key of the wrong type is an error naming the field; an absent (or null, where allowed)
// key keeps the default.
struct Reader {
  const json& obj;
  std::string where;  // "FILE: text_config"

  const json* find(const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t i64(const char* key, int64_t def) const {
    auto* v = find(key);
    if (!v) return def;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float() && v->get<double>() == double(int64_t(v->get<double>()))) return int64_t(v->get<double>());
    fail("{}: field \"{}\" must be an integer, got {}", where, key, v->dump());
  }
  std::optional<int64_t> opt_i64(const char* key) const {
    if (!find(key)) return std::nullopt;
    return i64(key, 0);
  }
  double f64(const char* key, double def) const {
    auto* v = find(key);
    if (!v) return def;
    if (v->is_number()) return v->get<double>();
    fail("{}: field \"{}\" must be a number, got {}", where, key, v->dump());
  }
  bool boolean(const char* key, bool def) const {
    auto* v = find(key);
    if (!v) return def;
    if (v->is_boolean()) return v->get<bool>();
    fail("{}: field \"{}\" must be true or false, got {}", where, key, v->dump());
  }
  std::string str(const char* key, const std::string& def) const {
    auto* v = find(key);
    if (!v) return def;
    if (v->is_string()) return v->get<std::string>();
    fail("{}: field \"{}\" must be a string, got {}", where, key, v->dump());
  }
  std::vector<int64_t> i64_list(const char* key) const {
    auto* v = find(key);
    std::vector<int64_t> out;
    if (!v) return out;
    if (!v->is_array()) fail("{}: field \"{}\" must be a list of integers, got {}", where, key, v->dump());
    for (auto& e : *v) {
      if (!e.is_number_integer()) fail("{}: field \"{}\" must be a list of integers, got {}", where, key, v->dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
};

void require_positive(const std::string& where, const char* key, int64_t v) {
  if (v <= 0) fail("{}: field \"{}\" must be > 0, got {}", where, key, v);
}

}  // namespace

ModelConfig parse_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail("{}: config is not a JSON object", source);
  ModelConfig c;
  c.source = source;
  Reader top{doc, source};
  c.model_type = top.str("model_type", "");
  if (auto* a = top.find("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    c.architecture = (*a)[0].get<std::string>();
  }
  const json* text = &doc;
  std::string where = source;
  if (c.model_type == "qwen4_exp") {
    auto* t = top.find("text_config");
    if (!t || !t->is_object()) fail("{}: model_type qwen4_exp needs a \"text_config\" object", source);
    text = t;
    where = source + ": text_config";
    c.has_vision = top.find("vision_config") != nullptr;
    std::string inner = Reader{*text, where}.str("model_type", "qwen4_exp_text");
    if (inner != "qwen4_exp_text") {
      fail("{}: field \"model_type\" is \"{}\", expected \"qwen4_exp_text\"", where, inner);
    }
  } else if (c.model_type != "qwen4_exp_text") {
    fail("{}: unsupported architecture: model_type \"{}\"{}; flashnext runs qwen4_exp (Qwen3.8-Flash-Next) "
         "checkpoints, model_type \"qwen4_exp\" or \"qwen4_exp_text\"",
         source, c.model_type, c.architecture.empty() ? "" : " (" + c.architecture + ")");
  }
  if (!c.architecture.empty() && c.architecture != "Qwen4ExpForConditionalGeneration" &&
      c.architecture != "Qwen4ExpForCausalLM") {
    fail("{}: unsupported architecture \"{}\": expected Qwen4ExpForConditionalGeneration or Qwen4ExpForCausalLM",
         source, c.architecture);
  }

  Reader r{*text, where};
  c.vocab_size = r.i64("vocab_size", c.vocab_size);
  c.hidden_size = r.i64("hidden_size", c.hidden_size);
  c.num_hidden_layers = r.i64("num_hidden_layers", c.num_hidden_layers);
  c.max_position_embeddings = r.i64("max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = r.f64("rms_norm_eps", c.rms_norm_eps);
  c.hidden_act = r.str("hidden_act", c.hidden_act);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", top.boolean("tie_word_embeddings", false));
  c.num_attention_heads = r.i64("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = r.i64("num_key_value_heads", c.num_key_value_heads);
  c.head_dim = r.i64("head_dim", c.head_dim);
  c.attention_bias = r.boolean("attention_bias", false);
  c.linear_conv_kernel_dim = r.i64("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  c.linear_key_head_dim = r.i64("linear_key_head_dim", c.linear_key_head_dim);
  c.linear_value_head_dim = r.i64("linear_value_head_dim", c.linear_value_head_dim);
  c.linear_num_key_heads = r.i64("linear_num_key_heads", c.linear_num_key_heads);
  c.linear_num_value_heads = r.i64("linear_num_value_heads", c.linear_num_value_heads);
  c.mamba_ssm_dtype = r.str("mamba_ssm_dtype", c.mamba_ssm_dtype);
  c.num_experts = r.i64("num_experts", c.num_experts);
  c.num_experts_per_tok = r.i64("num_experts_per_tok", c.num_experts_per_tok);
  c.moe_intermediate_size = r.i64("moe_intermediate_size", c.moe_intermediate_size);
  c.shared_expert_intermediate_size = r.i64("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.hc_count = r.i64("hc_count", c.hc_count);
  c.hc_lowrank = r.i64("hc_lowrank", c.hc_lowrank);
  c.ple_conv_kernel_size = r.i64("ple_conv_kernel_size", c.ple_conv_kernel_size);
  c.ngram_size = r.i64("ngram_size", c.ngram_size);
  c.heads_per_ngram = r.i64("heads_per_ngram", c.heads_per_ngram);
  c.ngram_vocab_size_base = r.i64("ngram_vocab_size_base", c.ngram_vocab_size_base);
  c.make_ngram_vocab_size_divisible_by =
      r.i64("make_ngram_vocab_size_divisible_by", c.make_ngram_vocab_size_divisible_by);
  c.seed = r.i64("seed", c.seed);
  c.split_ngram_parts = r.i64("split_ngram_parts", c.split_ngram_parts);
  c.ple_embedding_dtype = r.str("ple_embedding_dtype", "");
  c.mtp_num_hidden_layers = r.i64("mtp_num_hidden_layers", 0);
  c.bos_token_id = r.opt_i64("bos_token_id");
  c.pad_token_id = r.opt_i64("pad_token_id");
  if (auto* e = r.find("eos_token_id")) {
    if (e->is_array()) {
      c.eos_token_ids = r.i64_list("eos_token_id");
    } else {
      c.eos_token_ids = {r.i64("eos_token_id", 0)};
    }
  }

  // ple_layer_ids: sorted(set(...)) as in the reference; ple_embed_dim defaults to hidden_size.
  {
    auto ids = r.i64_list("ple_layer_ids");
    std::set<int64_t> s(ids.begin(), ids.end());
    c.ple_layer_ids.assign(s.begin(), s.end());
    c.ple_embed_dim = r.i64("ple_embed_dim", c.hidden_size);
  }

  // QSA indexer fields: all or none.
  const char* qsa_fields[] = {"indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget",
                              "indexer_compress_ratio"};
  int64_t* qsa_values[] = {&c.indexer_n_heads, &c.indexer_kv_heads, &c.indexer_head_dim, &c.indexer_budget,
                           &c.indexer_compress_ratio};
  std::vector<std::string> missing;
  int present = 0;
  for (int i = 0; i < 5; ++i) {
    if (r.find(qsa_fields[i])) {
      *qsa_values[i] = r.i64(qsa_fields[i], 0);
      ++present;
    } else {
      missing.push_back(qsa_fields[i]);
    }
  }

  // Rotary parameters: rope_parameters, else legacy top-level rope_theta / partial_rotary_factor.
  if (auto* rp = r.find("rope_parameters")) {
    if (!rp->is_object()) fail("{}: field \"rope_parameters\" must be an object", where);
    Reader rr{*rp, where + ": rope_parameters"};
    c.rope.type = rr.str("rope_type", "default");
    c.rope.theta = rr.f64("rope_theta", r.f64("rope_theta", 10000.0));
    c.rope.partial_rotary_factor = rr.f64("partial_rotary_factor", 1.0);
    c.rope.mrope_section = rr.i64_list("mrope_section");
    c.rope.mrope_interleaved = rr.boolean("mrope_interleaved", false);
  } else {
    c.rope.theta = r.f64("rope_theta", 10000.0);
    c.rope.partial_rotary_factor = r.f64("partial_rotary_factor", 1.0);
  }
  if (c.rope.type != "default") {
    fail("{}: rope_parameters.rope_type \"{}\" is not supported yet (only \"default\")", where, c.rope.type);
  }

  // Layer types: given, or synthesised from full_attention_interval as the reference does.
  if (auto* lt = r.find("layer_types")) {
    if (!lt->is_array()) fail("{}: field \"layer_types\" must be a list of strings", where);
    for (auto& e : *lt) {
      std::string s = e.is_string() ? e.get<std::string>() : e.dump();
      if (s == "linear_attention") {
        c.layer_types.push_back(LayerKind::GatedDeltaNet);
      } else if (s == "full_attention" || s == "qwen_sparse_attention" || s == "deepseek_sparse_attention" ||
                 s == "hybrid_indexed") {
        c.layer_types.push_back(LayerKind::QSA);
      } else {
        fail("{}: unsupported layer type \"{}\" in \"layer_types\" (expected linear_attention, full_attention, "
             "qwen_sparse_attention, deepseek_sparse_attention or hybrid_indexed)", where, s);
      }
    }
  } else {
    int64_t interval = r.i64("full_attention_interval", 4);
    require_positive(where, "full_attention_interval", interval);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_types.push_back((i + 1) % interval ? LayerKind::GatedDeltaNet : LayerKind::QSA);
    }
  }

  // ---- validation (Qwen4ExpTextConfig.validate_architecture, plus the shape facts the model relies on) ----
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers}, {"hc_lowrank", c.hc_lowrank},
                        {"max_position_embeddings", c.max_position_embeddings}}) {
    require_positive(where, key, v);
  }
  if (int64_t(c.layer_types.size()) != c.num_hidden_layers) {
    fail("{}: \"layer_types\" has {} entries but num_hidden_layers is {}", where, c.layer_types.size(),
         c.num_hidden_layers);
  }
  if (!(c.rms_norm_eps > 0)) fail("{}: field \"rms_norm_eps\" must be > 0, got {}", where, c.rms_norm_eps);
  if (c.hidden_act != "silu") fail("{}: field \"hidden_act\" is \"{}\"; qwen4_exp uses \"silu\"", where, c.hidden_act);
  c.output_gate_type = r.str("output_gate_type", "");
  if (c.output_gate_type.empty()) c.output_gate_type = c.hidden_act;
  if (c.output_gate_type != "sigmoid" && c.output_gate_type != "silu") {
    fail("{}: unsupported output gate activation \"{}\" (field \"output_gate_type\"; expected sigmoid or silu)",
         where, c.output_gate_type);
  }
  if (c.hc_count <= 1) fail("{}: qwen4_exp requires hc_count > 1, got {}", where, c.hc_count);
  if (c.num_experts <= 0) fail("{}: num_experts must be > 0, got {}", where, c.num_experts);
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    fail("{}: num_experts_per_tok must be in [1, num_experts], got {} and {}", where, c.num_experts_per_tok,
         c.num_experts);
  }
  if (c.moe_intermediate_size <= 0 || c.shared_expert_intermediate_size <= 0) {
    fail("{}: moe_intermediate_size and shared_expert_intermediate_size must be > 0, got {} and {}", where,
         c.moe_intermediate_size, c.shared_expert_intermediate_size);
  }
  const bool has_qsa_layers = c.num_layers_of(LayerKind::QSA) > 0;
  if (present > 0 && !missing.empty()) {
    fail("{}: QSA config is missing required fields: {}", where, fmt::join(missing, ", "));
  }
  if (has_qsa_layers && present == 0) {
    fail("{}: the config has attention layers but no QSA indexer fields (indexer_n_heads, indexer_kv_heads, "
         "indexer_head_dim, indexer_budget, indexer_compress_ratio)", where);
  }
  if (present > 0) {
    for (int i = 0; i < 5; ++i) {
      if (*qsa_values[i] <= 0) fail("{}: QSA config values must be positive: \"{}\" is {}", where, qsa_fields[i], *qsa_values[i]);
    }
    if (c.indexer_kv_heads != 1) fail("{}: qwen4_exp QSA requires indexer_kv_heads = 1, got {}", where, c.indexer_kv_heads);
    if (c.indexer_budget % c.indexer_compress_ratio != 0) {
      fail("{}: indexer_budget ({}) must be divisible by indexer_compress_ratio ({})", where, c.indexer_budget,
           c.indexer_compress_ratio);
    }
  }
  if (has_qsa_layers) {
    for (auto [key, v] : {std::pair{"num_attention_heads", c.num_attention_heads},
                          {"num_key_value_heads", c.num_key_value_heads}, {"head_dim", c.head_dim}}) {
      require_positive(where, key, v);
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
      fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where, c.num_attention_heads,
           c.num_key_value_heads);
    }
    int64_t rd = c.rotary_dim();
    if (rd > c.indexer_head_dim) {
      fail("{}: attention RoPE dimensions must fit the QSA index head: rotary_dim={}, indexer_head_dim={}", where, rd,
           c.indexer_head_dim);
    }
    if (rd <= 0 || rd % 2 != 0) {
      fail("{}: rotary_dim = head_dim x partial_rotary_factor = {} must be positive and even", where, rd);
    }
  }
  if (c.num_layers_of(LayerKind::GatedDeltaNet) > 0) {
    for (auto [key, v] : {std::pair{"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
                          {"linear_key_head_dim", c.linear_key_head_dim},
                          {"linear_value_head_dim", c.linear_value_head_dim},
                          {"linear_num_key_heads", c.linear_num_key_heads},
                          {"linear_num_value_heads", c.linear_num_value_heads}}) {
      require_positive(where, key, v);
    }
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
      fail("{}: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})", where,
           c.linear_num_value_heads, c.linear_num_key_heads);
    }
  }
  if (!c.ple_layer_ids.empty()) {
    int64_t heads = c.ngram_heads();
    if (c.ngram_size < 2 || heads <= 0 || c.ple_embed_dim <= 0 || c.ple_embed_dim % heads != 0) {
      fail("{}: ple_embed_dim and the number of n-gram heads ((ngram_size-1) x heads_per_ngram) must be positive and "
           "ple_embed_dim divisible by it: ple_embed_dim {}, ngram_size {}, heads_per_ngram {}", where,
           c.ple_embed_dim, c.ngram_size, c.heads_per_ngram);
    }
    std::vector<int64_t> bad;
    for (auto id : c.ple_layer_ids) {
      if (id < 1 || id > c.num_hidden_layers) bad.push_back(id);
    }
    if (!bad.empty()) {
      fail("{}: ple_layer_ids must contain one-indexed ids in [1, {}], got {}", where, c.num_hidden_layers,
           fmt::join(bad, ", "));
    }
    // PLE only on GDN layers: the validation rule of issue #2 (other ports reject it too). The transformers copy we
    // read has no such check and would name such a layer `hybrid_indexed`; revisit if a release ever uses one.
    std::vector<int64_t> on_attention;
    for (auto id : c.ple_layer_ids) {
      if (c.layer_types[size_t(id - 1)] != LayerKind::GatedDeltaNet) on_attention.push_back(id);
    }
    if (!on_attention.empty()) {
      fail("{}: PLE is only supported on linear_attention layers, but ple_layer_ids (one-indexed) puts it on the "
           "attention layer(s) {}", where, fmt::join(on_attention, ", "));
    }
    if (c.eos_token_ids.empty()) fail("{}: eos_token_id must be set when PLE layers are enabled", where);
    for (auto [key, v] : {std::pair{"ple_conv_kernel_size", c.ple_conv_kernel_size},
                          {"ngram_vocab_size_base", c.ngram_vocab_size_base},
                          {"make_ngram_vocab_size_divisible_by", c.make_ngram_vocab_size_divisible_by},
                          {"split_ngram_parts", c.split_ngram_parts}}) {
      require_positive(where, key, v);
    }
  }
  for (auto id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) fail("{}: eos_token_id {} is outside the vocabulary [0, {})", where, id, c.vocab_size);
  }
  return c;
}

std::string config_path(const std::string& path) {
  fs::path p = path;
  if (fs::is_directory(p)) p /= "config.json";
  return p.string();
}

json read_config_json(const std::string& path) {
  const std::string p = config_path(path);
  std::ifstream in(p);
  if (!in) fail("{}: cannot open config file", p);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", p, e.what());
  }
}

ModelConfig load_config(const std::string& path) {
  return parse_config(read_config_json(path), config_path(path));
}

}  // namespace flashnext
