// Weight manifest: maps every checkpoint tensor name to a logical tensor of the qwen4_exp language model and checks
// shape and dtype against the config before anything is allocated.
//
// Logical names are the reference's module paths relative to the text model, with routed experts always per expert
// and the PLE table as numbered row shards:
//   embed_tokens.weight                                   [vocab, H]
//   lm_head.weight                                        [vocab, H]   (embed_tokens when tie_word_embeddings)
//   hyper_connection_mixer.{hc_norm,input_mix_weight_down,input_mix_weight_up}.weight
//   layers.L.{attn,mlp}_hyper_connection.{hc_norm,input_mix_weight_down,input_mix_weight_up,block_inject_weight}.weight
//   layers.L.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,conv1d,norm,out_proj}.weight, .A_log, .dt_bias
//   layers.L.self_attn.{q_proj,k_proj,v_proj,o_proj,q_norm,k_norm}.weight,
//   layers.L.self_attn.indexer.{index_qk_proj,q_layernorm,k_layernorm}.weight
//   layers.L.mlp.gate.weight, layers.L.mlp.shared_expert.{gate,up,down}_proj.weight, layers.L.mlp.shared_expert_gate.weight
//   layers.L.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight   (fused 3-D checkpoints are sliced, zero-copy)
//   layers.L.ple.{key_proj,value_proj,norm_key,norm_query,norm_conv,conv1d}.weight
//   layers.L.ple.ple_embedding.ngram_embedding.shard_K.weight      (placed by K, not by name order)
//   layers.L.ple.ple_embedding.ngram_embedding.shard_K.weight_scale (int8 shards: group scales)
// Checkpoint prefixes `model.language_model.` (qwen4_exp) and `model.` (qwen4_exp_text) are stripped. Quantized
// companions keep their suffix on the same logical stem (`....gate_proj.weight_scale`, `.weight_scale_2`,
// `.input_scale`, `.weight_scale_inv`, `.weight_packed`, `.weight_zero_point`, `.weight_global_scale`, ...).
// `model.visual.*` and `mtp.*` are recognised and counted, not loaded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/config.h"
#include "loader/safetensors.h"

namespace flashnext {

/// The parameter groups `inspect` reports.
enum class Component {
  Embedding, LmHead, HyperConnection, GatedDeltaNet, QSA, Router, SharedExpert, RoutedExperts, PleProjections,
  PleTable, PleHashBuffers, Mtp, Vision
};
/// The snake_case name of `c` ("embedding", "routed_experts", "ple_table", ...), used as the `params` keys of
/// `flashnext inspect --json`.
const char* component_name(Component c);

/// The quantization companion suffix of a tensor name (`weight_scale`, `weight_scale_2`, `weight_scale_inv`,
/// `input_scale`, `input_global_scale`, `weight_global_scale`, `weight_zero_point`, `weight_shape`,
/// `weight_packed`; GPTQ `qweight`, `qzeros`, `scales`, `g_idx`, of which AutoAWQ uses the first three), or an empty
/// string when the last name component is none of them.
std::string quant_companion_suffix(const std::string& name);

/// One logical tensor.
struct ManifestEntry {
  std::string name;          ///< logical name (see above)
  std::string source;        ///< checkpoint tensor it views (a fused tensor for sliced experts)
  Component component;
  int layer = -1;            ///< decoder layer, -1 for global tensors
  TensorView view;           ///< zero-copy view (a slice for fused experts)
};

/// The validated set of logical tensors of one checkpoint.
class WeightManifest {
 public:
  /// Maps and validates every tensor of `ckpt` against `cfg` (expected shapes: loader/tensor_plan.h). Throws Error
  /// naming the tensor (and file) for a missing, unexpected, mis-shaped or wrongly typed tensor, or stored PLE hash
  /// buffers that disagree with the values derived from the config (ngram_hash_params). Float weights must be BF16,
  /// F16 or F32; a weight of another dtype needs a scale companion and the packed shape of its format (FP8/I8: the
  /// logical shape, U8: [N, K/2], I32: [N, K/8]). The PLE table shards must be numbered 0..n-1, [rows_k,
  /// ple_head_dim] each, rows summing to the padded table height; FP8 shards need `ngram_embedding.weight_scale`,
  /// I8 shards their group scales `ngram_embedding.shard_K.weight_scale` (loader/quant.h ple_int8_group).
  /// The three hash buffers are optional (derivable), checked when present.
  static WeightManifest build(const ModelConfig& cfg, const Checkpoint& ckpt);

  /// The logical tensor `name`, or nullptr.
  const ManifestEntry* find(const std::string& name) const;
  /// The logical tensor `name`; throws Error when absent.
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, ManifestEntry>& entries() const { return entries_; }
  /// Tensors recognised but not part of the language model (`model.visual.*`, `mtp.*`), by component.
  const std::vector<ManifestEntry>& extra() const { return extra_; }
  /// The PLE n-gram table row shards of decoder layer `layer` in row order (by shard number K, not name order);
  /// concatenated they are the [rows, ple_head_dim] table. Empty when the layer has no PLE.
  std::vector<const ManifestEntry*> ple_table_shards(int layer) const;
  /// The group scales of int8 shard `k` of layer `layer`'s table (`shard_K.weight_scale`), or nullptr.
  const ManifestEntry* ple_table_shard_scales(int layer, int64_t k) const;
  /// True when some language-model weight is stored quantized (a non-float weight with its scale companions).
  bool quantized() const { return quantized_; }

 private:
  std::map<std::string, ManifestEntry> entries_;
  std::vector<ManifestEntry> extra_;
  bool quantized_ = false;
};

}  // namespace flashnext
