// The qwen4_exp model configuration, parsed from a Hugging Face config.json and validated.
//
// Accepts `model_type` "qwen4_exp" (architecture Qwen4ExpForConditionalGeneration, language model under
// `text_config`) and "qwen4_exp_text" (flat). Defaults and validation rules follow the reference
// (transformers `models/qwen4_exp/configuration_qwen4_exp.py`, Qwen4ExpTextConfig): keys the release omits take the
// class defaults (`seed` 1234, `norm_topk_prob` true, `split_ngram_parts` 512, ...). Layer types "full_attention",
// "qwen_sparse_attention", "deepseek_sparse_attention" and "hybrid_indexed" are all QSA layers (gated attention
// with the block indexer); "linear_attention" is a Gated DeltaNet layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace flashnext {

/// Mixer kind of a decoder layer.
enum class LayerKind { GatedDeltaNet, QSA };

/// "linear_attention" for GatedDeltaNet, "qsa" for QSA (the names `inspect --json` prints).
const char* layer_kind_name(LayerKind k);

/// Rotary embedding parameters (`rope_parameters`). For text, the three mRoPE sections share one position, so the
/// result is plain NeoX RoPE over the first `rotary_dim` dims of a head.
struct RopeConfig {
  std::string type = "default";
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
};

/// Validated qwen4_exp text-model configuration. All sizes are element counts.
struct ModelConfig {
  // Identity
  std::string source;         ///< file it was read from (for error messages)
  std::string model_type;     ///< "qwen4_exp" or "qwen4_exp_text"
  std::string architecture;   ///< first entry of "architectures", may be empty
  bool has_vision = false;    ///< a vision_config is present (the tower is reported, not run)

  // Trunk
  int64_t vocab_size = 248320;
  int64_t hidden_size = 2048;
  int64_t num_hidden_layers = 40;
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  bool tie_word_embeddings = false;
  std::vector<LayerKind> layer_types;
  std::vector<int64_t> eos_token_ids;  ///< text_config eos_token_id (int or list); [0] is the PLE boundary token
  std::optional<int64_t> bos_token_id, pad_token_id;

  // QSA attention
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 256;
  bool attention_bias = false;
  RopeConfig rope;
  int64_t indexer_n_heads = 0, indexer_kv_heads = 0, indexer_head_dim = 0, indexer_budget = 0,
          indexer_compress_ratio = 0;

  // Gated DeltaNet
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128, linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16, linear_num_value_heads = 32;
  std::string output_gate_type;  ///< resolved: output_gate_type if set, else hidden_act ("sigmoid" or "silu")
  std::string mamba_ssm_dtype = "float32";

  // MoE
  int64_t num_experts = 512, num_experts_per_tok = 10;
  int64_t moe_intermediate_size = 512, shared_expert_intermediate_size = 512;
  bool norm_topk_prob = true;

  // Hyper-connections
  int64_t hc_count = 4, hc_lowrank = 320;

  // PLE (hashed n-gram embedding)
  std::vector<int64_t> ple_layer_ids;  ///< one-indexed, sorted, unique (as the reference stores them)
  int64_t ple_embed_dim = 0;           ///< defaults to hidden_size
  int64_t ple_conv_kernel_size = 4, ngram_size = 3, heads_per_ngram = 8;
  int64_t ngram_vocab_size_base = 20000000, make_ngram_vocab_size_divisible_by = 128;
  int64_t seed = 1234, split_ngram_parts = 512;
  std::string ple_embedding_dtype;  ///< e.g. "float8_e4m3fn" in NVFP4 releases; empty when absent

  // MTP
  int64_t mtp_num_hidden_layers = 0;

  // ---- derived ----
  int64_t hc_width() const { return hc_count * hidden_size; }
  int64_t rotary_dim() const { return int64_t(double(head_dim) * rope.partial_rotary_factor); }
  int64_t gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int64_t qsa_block_topk() const { return indexer_compress_ratio ? indexer_budget / indexer_compress_ratio : 0; }
  int64_t ngram_heads() const { return (ngram_size - 1) * heads_per_ngram; }
  int64_t ple_head_dim() const { return ngram_heads() ? ple_embed_dim / ngram_heads() : 0; }
  int64_t ple_conv_state_len() const { return (ple_conv_kernel_size - 1) * ngram_size; }
  int64_t ple_boundary_token() const { return eos_token_ids.empty() ? -1 : eos_token_ids[0]; }
  int64_t num_layers_of(LayerKind k) const;
  /// Index of layer `layer` (0-based) among the PLE layers, or -1 when it has none.
  int ple_index_of_layer(int64_t layer) const;
};

/// Reads and validates `path`: a config.json file, or a model folder containing one. Throws Error naming the file
/// and the field on any invalid value or unsupported architecture.
ModelConfig load_config(const std::string& path);

/// The config.json file that `path` names: `path` itself, or the config.json of a model folder.
std::string config_path(const std::string& path);
/// The JSON document of config_path(path), unvalidated (for parse_config after changes, e.g. --hf-overrides).
/// Throws Error naming the file when it cannot be read or is not valid JSON.
nlohmann::json read_config_json(const std::string& path);

/// Parses and validates an already-read config.json document; `source` names it in error messages.
ModelConfig parse_config(const nlohmann::json& doc, const std::string& source);

}  // namespace flashnext
