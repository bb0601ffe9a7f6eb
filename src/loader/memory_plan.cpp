#include "loader/memory_plan.h"

#include "core/error.h"

namespace flashnext {

int64_t torch_dtype_bytes(const std::string& name, const std::string& field) {
  if (name == "float32" || name == "float") return 4;
  if (name == "bfloat16" || name == "float16" || name == "half") return 2;
  if (name == "float8_e4m3fn" || name == "float8_e5m2" || name == "float8_e4m3" || name == "uint8" || name == "int8") {
    return 1;
  }
  fail("{}: unknown dtype \"{}\" (expected float32, bfloat16, float16, float8_e4m3fn or float8_e5m2)", field, name);
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

StatePlan state_plan(const ModelConfig& c, int64_t tp, int64_t kv_bytes, int64_t act_bytes) {
  FN_CHECK(tp >= 1, "tensor-parallel degree must be >= 1, got {}", tp);
  StatePlan p;
  const int64_t qsa = c.num_layers_of(LayerKind::QSA), gdn = c.num_layers_of(LayerKind::GatedDeltaNet);
  p.kv_bytes_per_token = qsa * 2 * ceil_div(c.num_key_value_heads, tp) * c.head_dim * kv_bytes;
  p.indexer_bytes_per_token = qsa * c.indexer_kv_heads * c.indexer_head_dim * kv_bytes;
  const int64_t ssm = torch_dtype_bytes(c.mamba_ssm_dtype, c.source + ": mamba_ssm_dtype");
  // The GDN heads split over tp: value heads (recurrent state) and the q/k/v channels of the conv.
  const int64_t v_heads = ceil_div(c.linear_num_value_heads, tp);
  p.gdn_state_bytes_per_sequence = gdn * v_heads * c.linear_key_head_dim * c.linear_value_head_dim * ssm;
  p.gdn_conv_state_bytes_per_sequence =
      gdn * ceil_div(c.gdn_conv_dim(), tp) * (c.linear_conv_kernel_dim - 1) * act_bytes;
  const int64_t ple = int64_t(c.ple_layer_ids.size());
  p.ple_state_bytes_per_sequence =
      ple * (c.hc_width() * c.ple_conv_state_len() * act_bytes + (c.ngram_size - 1) * int64_t(sizeof(int64_t)));
  return p;
}

Placement placement_of(Component c) {
  switch (c) {
    case Component::Embedding:
    case Component::LmHead:
    case Component::GatedDeltaNet:
    case Component::QSA:
    case Component::SharedExpert:
    case Component::RoutedExperts:
      return Placement::Sharded;
    case Component::HyperConnection:
    case Component::Router:
    case Component::PleProjections:
      return Placement::Replicated;
    case Component::PleTable:
    case Component::PleHashBuffers:
      return Placement::Host;
    case Component::Mtp:
    case Component::Vision:
      return Placement::NotLoaded;
  }
  return Placement::NotLoaded;
}

int64_t weight_bytes_per_gpu(const ComponentTotals& bytes, int64_t tp) {
  FN_CHECK(tp >= 1, "tensor-parallel degree must be >= 1, got {}", tp);
  int64_t sharded = 0, replicated = 0;
  for (int i = 0; i < kNumComponents; ++i) {
    switch (placement_of(Component(i))) {
      case Placement::Sharded:
        sharded += bytes[i];
        break;
      case Placement::Replicated:
        replicated += bytes[i];
        break;
      default:
        break;
    }
  }
  return replicated + ceil_div(sharded, tp);
}

}  // namespace flashnext
