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
const char* component_name(Component c);

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
  /// Maps and validates every tensor of `ckpt` against `cfg`. Throws Error naming the tensor (and file) for a
  /// missing, unexpected, mis-shaped or wrongly typed tensor, or stored PLE hash buffers that disagree with the
  /// values derived from the config.
  static WeightManifest build(const ModelConfig& cfg, const Checkpoint& ckpt);

  /// The logical tensor `name`, or nullptr.
  const ManifestEntry* find(const std::string& name) const;
  /// The logical tensor `name`; throws Error when absent.
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, ManifestEntry>& entries() const { return entries_; }
  /// Tensors recognised but not part of the language model (`model.visual.*`, `mtp.*`), by component.
  const std::vector<ManifestEntry>& extra() const { return extra_; }

 private:
  std::map<std::string, ManifestEntry> entries_;
  std::vector<ManifestEntry> extra_;
};

}  // namespace flashnext
