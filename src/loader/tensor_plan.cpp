#include "loader/tensor_plan.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "ple/ngram_hash.h"

namespace flashnext {

namespace {

struct Lister {
  std::vector<ExpectedTensor>& out;
  void add(std::string name, std::vector<int64_t> shape, Component c, int layer, bool i64 = false) {
    out.push_back(ExpectedTensor{std::move(name), std::move(shape), c, layer, i64});
  }
};

// Qwen4ExpTextGatedResidual: hc_norm [hc*H], input_mix_weight_down [r, hc*H], input_mix_weight_up [hc*H, r] and,
// except for the final mixer, block_inject_weight [hc, hc*H].
void add_hyper_connection(Lister& l, const ModelConfig& c, const std::string& p, int layer, bool inject) {
  const int64_t w = c.hc_width();
  l.add(p + ".hc_norm.weight", {w}, Component::HyperConnection, layer);
  l.add(p + ".input_mix_weight_down.weight", {c.hc_lowrank, w}, Component::HyperConnection, layer);
  l.add(p + ".input_mix_weight_up.weight", {w, c.hc_lowrank}, Component::HyperConnection, layer);
  if (inject) l.add(p + ".block_inject_weight.weight", {c.hc_count, w}, Component::HyperConnection, layer);
}

// Qwen4ExpTextAttention with its QSA indexer.
void add_qsa(Lister& l, const ModelConfig& c, const std::string& p, int layer) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_out = c.num_attention_heads * hd * 2, kv_out = c.num_key_value_heads * hd;
  const int64_t o_in = c.num_attention_heads * hd;
  const auto k = Component::QSA;
  l.add(p + ".q_proj.weight", {q_out, H}, k, layer);
  l.add(p + ".k_proj.weight", {kv_out, H}, k, layer);
  l.add(p + ".v_proj.weight", {kv_out, H}, k, layer);
  l.add(p + ".o_proj.weight", {H, o_in}, k, layer);
  if (c.attention_bias) {
    l.add(p + ".q_proj.bias", {q_out}, k, layer);
    l.add(p + ".k_proj.bias", {kv_out}, k, layer);
    l.add(p + ".v_proj.bias", {kv_out}, k, layer);
    l.add(p + ".o_proj.bias", {H}, k, layer);
  }
  l.add(p + ".q_norm.weight", {hd}, k, layer);
  l.add(p + ".k_norm.weight", {hd}, k, layer);
  l.add(p + ".indexer.index_qk_proj.weight", {(c.indexer_n_heads + c.indexer_kv_heads) * c.indexer_head_dim, H}, k,
        layer);
  l.add(p + ".indexer.q_layernorm.weight", {c.indexer_head_dim}, k, layer);
  l.add(p + ".indexer.k_layernorm.weight", {c.indexer_head_dim}, k, layer);
}

// Qwen4ExpTextGatedDeltaNet.
void add_gdn(Lister& l, const ModelConfig& c, const std::string& p, int layer) {
  const int64_t H = c.hidden_size, conv = c.gdn_conv_dim(), vdim = c.gdn_value_dim(), nv = c.linear_num_value_heads;
  const auto k = Component::GatedDeltaNet;
  l.add(p + ".in_proj_qkv.weight", {conv, H}, k, layer);
  l.add(p + ".in_proj_z.weight", {vdim, H}, k, layer);
  l.add(p + ".in_proj_b.weight", {nv, H}, k, layer);
  l.add(p + ".in_proj_a.weight", {nv, H}, k, layer);
  l.add(p + ".conv1d.weight", {conv, 1, c.linear_conv_kernel_dim}, k, layer);
  l.add(p + ".A_log", {nv}, k, layer);
  l.add(p + ".dt_bias", {nv}, k, layer);
  l.add(p + ".norm.weight", {c.linear_value_head_dim}, k, layer);
  l.add(p + ".out_proj.weight", {H, vdim}, k, layer);
}

// Qwen4ExpTextSparseMoeBlock; experts per expert unless `fused` (MTP listing).
void add_moe(Lister& l, const ModelConfig& c, const std::string& p, int layer, bool fused) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
  l.add(p + ".gate.weight", {c.num_experts, H}, Component::Router, layer);
  if (fused) {
    l.add(p + ".experts.gate_up_proj", {c.num_experts, 2 * I, H}, Component::RoutedExperts, layer);
    l.add(p + ".experts.down_proj", {c.num_experts, H, I}, Component::RoutedExperts, layer);
  } else {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string ep = fmt::format("{}.experts.{}.", p, e);
      l.add(ep + "gate_proj.weight", {I, H}, Component::RoutedExperts, layer);
      l.add(ep + "up_proj.weight", {I, H}, Component::RoutedExperts, layer);
      l.add(ep + "down_proj.weight", {H, I}, Component::RoutedExperts, layer);
    }
  }
  l.add(p + ".shared_expert.gate_proj.weight", {S, H}, Component::SharedExpert, layer);
  l.add(p + ".shared_expert.up_proj.weight", {S, H}, Component::SharedExpert, layer);
  l.add(p + ".shared_expert.down_proj.weight", {H, S}, Component::SharedExpert, layer);
  l.add(p + ".shared_expert_gate.weight", {1, H}, Component::SharedExpert, layer);
}

// Qwen4ExpTextPLELayer with its Qwen4ExpTextNGramEmbedding (table rows from the hash parameters).
void add_ple(Lister& l, const ModelConfig& c, const std::string& p, int layer, int ple_index) {
  const int64_t w = c.hc_width(), P = c.ple_embed_dim;
  const auto k = Component::PleProjections;
  l.add(p + ".key_proj.weight", {w, P}, k, layer);
  l.add(p + ".value_proj.weight", {c.hidden_size, P}, k, layer);
  l.add(p + ".norm_key.weight", {w}, k, layer);
  l.add(p + ".norm_query.weight", {w}, k, layer);
  l.add(p + ".norm_conv.weight", {w}, k, layer);
  l.add(p + ".conv1d.weight", {w, 1, c.ple_conv_kernel_size}, k, layer);
  const NgramHashParams hp = ngram_hash_params(c, ple_index);
  const std::string e = p + ".ple_embedding.";
  l.add(e + "layer_multipliers", {c.ngram_size}, Component::PleHashBuffers, layer, true);
  l.add(e + "ngram_heads_vocab_sizes", {hp.heads()}, Component::PleHashBuffers, layer, true);
  l.add(e + "ngram_heads_offsets", {hp.heads()}, Component::PleHashBuffers, layer, true);
  const int64_t parts = c.split_ngram_parts, chunk = (hp.rows + parts - 1) / parts;
  for (int64_t s = 0; s < parts && s * chunk < hp.rows; ++s) {
    l.add(fmt::format("{}ngram_embedding.shard_{}.weight", e, s),
          {std::min(chunk, hp.rows - s * chunk), c.ple_head_dim()}, Component::PleTable, layer);
  }
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  Lister l{out};
  l.add("embed_tokens.weight", {c.vocab_size, c.hidden_size}, Component::Embedding, -1);
  if (!c.tie_word_embeddings) l.add("lm_head.weight", {c.vocab_size, c.hidden_size}, Component::LmHead, -1);
  add_hyper_connection(l, c, "hyper_connection_mixer", -1, false);
  for (int L = 0; L < int(c.num_hidden_layers); ++L) {
    const std::string p = fmt::format("layers.{}.", L);
    add_hyper_connection(l, c, p + "attn_hyper_connection", L, true);
    add_hyper_connection(l, c, p + "mlp_hyper_connection", L, true);
    if (c.layer_types[L] == LayerKind::GatedDeltaNet) {
      add_gdn(l, c, p + "linear_attn", L);
    } else {
      add_qsa(l, c, p + "self_attn", L);
    }
    add_moe(l, c, p + "mlp", L, false);
    if (int m = c.ple_index_of_layer(L); m >= 0) add_ple(l, c, p + "ple", L, m);
  }
  return out;
}

std::vector<ExpectedTensor> expected_mtp_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  if (c.mtp_num_hidden_layers <= 0) return out;
  Lister l{out};
  const int64_t H = c.hidden_size;
  l.add("mtp.pre_fc_norm_embedding.weight", {H}, Component::Mtp, -1);
  l.add("mtp.pre_fc_norm_hidden.weight", {c.hc_width()}, Component::Mtp, -1);
  l.add("mtp.fc_embedding.weight", {H, H}, Component::Mtp, -1);
  l.add("mtp.fc_hidden.weight", {H, H}, Component::Mtp, -1);
  add_hyper_connection(l, c, "mtp.hyper_connection_mixer", -1, false);
  for (int L = 0; L < int(c.mtp_num_hidden_layers); ++L) {
    const std::string p = fmt::format("mtp.layers.{}.", L);
    add_hyper_connection(l, c, p + "attn_hyper_connection", L, true);
    add_hyper_connection(l, c, p + "mlp_hyper_connection", L, true);
    add_qsa(l, c, p + "self_attn", L);
    add_moe(l, c, p + "mlp", L, true);
  }
  for (auto& t : out) t.component = Component::Mtp;
  return out;
}

VisionGeometry parse_vision_geometry(const nlohmann::json& vc, const std::string& where) {
  VisionGeometry v;
  if (!vc.is_object()) fail("{}: \"vision_config\" must be an object", where);
  auto get = [&](const char* key, int64_t& dst) {
    auto it = vc.find(key);
    if (it == vc.end() || it->is_null()) return;
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      fail("{}: vision_config field \"{}\" must be a positive integer, got {}", where, key, it->dump());
    }
    dst = it->get<int64_t>();
  };
  get("depth", v.depth);
  get("hidden_size", v.hidden_size);
  get("intermediate_size", v.intermediate_size);
  get("num_heads", v.num_heads);
  get("in_channels", v.in_channels);
  get("patch_size", v.patch_size);
  get("temporal_patch_size", v.temporal_patch_size);
  get("spatial_merge_size", v.spatial_merge_size);
  get("out_hidden_size", v.out_hidden_size);
  get("num_position_embeddings", v.num_position_embeddings);
  if (auto it = vc.find("deepstack_visual_indexes"); it != vc.end() && it->is_array()) {
    v.deepstack_layers = int64_t(it->size());
  }
  return v;
}

int64_t vision_param_count(const VisionGeometry& v) {
  const int64_t h = v.hidden_size, i = v.intermediate_size, m = h * v.spatial_merge_size * v.spatial_merge_size;
  const int64_t block = 2 * (2 * h)          // norm1, norm2 (LayerNorm weight + bias)
                        + 3 * h * h + 3 * h  // attn.qkv
                        + h * h + h          // attn.proj
                        + i * h + i          // mlp.linear_fc1
                        + h * i + h;         // mlp.linear_fc2
  const int64_t patch = h * v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size + h;
  const int64_t pos = v.num_position_embeddings * h;
  const int64_t fcs = m * m + m + v.out_hidden_size * m + v.out_hidden_size;
  const int64_t merger = 2 * h + fcs;     // norm over hidden_size before the spatial shuffle
  const int64_t deepstack = 2 * m + fcs;  // post-shuffle norm over h*m^2
  return v.depth * block + patch + pos + merger + v.deepstack_layers * deepstack;
}

}  // namespace flashnext
