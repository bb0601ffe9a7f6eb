// The tensors a qwen4_exp config implies, computed from the config alone (no checkpoint): the list the weight
// manifest validates a checkpoint against, and the source of the parameter counts `flashnext inspect` reports for a
// bare config.json.
//
// Shapes follow the reference modules (transformers models/qwen4_exp/modeling_qwen4_exp.py): nn.Linear weights are
// [out, in]; depthwise Conv1d weights are [channels, 1, kernel]; fused experts are [E, 2I, H] / [E, H, I] and are
// listed here per expert ([I, H] gate, [I, H] up, [H, I] down). MTP shapes are those of ARTIFACTS.md 2.5 (the
// reference does not build the MTP module); vision shapes are those of the Qwen3-VL style tower the checkpoints ship
// (`model.visual.*`).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "loader/config.h"
#include "loader/manifest.h"

namespace flashnext {

/// One tensor the config implies.
struct ExpectedTensor {
  std::string name;  ///< logical name (manifest.h), e.g. "layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  Component component;
  int layer = -1;         ///< decoder layer, -1 for global tensors
  bool is_int64 = false;  ///< a PLE hash buffer (I64), not a float weight

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// Every tensor of the language model (everything but MTP and vision), in a fixed order: globals, then layer by
/// layer. Routed experts are listed per expert. The PLE n-gram table of each PLE layer is listed as
/// `split_ngram_parts` row shards `...ngram_embedding.shard_K.weight` of ceil(rows / parts) rows each (the last
/// one shorter when rows is not a multiple), the row split `save_pretrained` writes. `lm_head.weight` is absent
/// when tie_word_embeddings is set.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

/// The MTP tensors (`mtp.*` checkpoint names, experts fused as in the BF16 release) for cfg.mtp_num_hidden_layers
/// MTP layers, with the shapes of ARTIFACTS.md 2.5; empty when the config has no MTP layer.
std::vector<ExpectedTensor> expected_mtp_tensors(const ModelConfig& cfg);

/// The vision tower geometry (`vision_config`), with the defaults of the reference's Qwen4ExpVisionConfig.
struct VisionGeometry {
  int64_t depth = 27, hidden_size = 1152, intermediate_size = 4304, num_heads = 16, in_channels = 3;
  int64_t patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2, out_hidden_size = 3584;
  int64_t num_position_embeddings = 2304;
  int64_t deepstack_layers = 0;  ///< entries of deepstack_visual_indexes (each adds one merger)
};

/// Parses `vision_config`; throws Error naming `where` for a field of the wrong type or a non-positive size.
VisionGeometry parse_vision_geometry(const nlohmann::json& vision_config, const std::string& where);

/// Parameters of the vision tower (`model.visual.*`): patch_embed (Conv3d with bias), pos_embed, `depth` blocks
/// (LayerNorm x2 with bias, qkv and proj with bias, MLP linear_fc1/linear_fc2 with bias) and the patch merger
/// (LayerNorm over hidden_size, linear_fc1 [h*m^2, h*m^2], linear_fc2 [out, h*m^2], all with bias), plus one merger
/// per deepstack layer.
int64_t vision_param_count(const VisionGeometry& v);

}  // namespace flashnext
