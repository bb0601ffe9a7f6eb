// Memory plan of a qwen4_exp model: per-token and per-sequence state sizes and the weight bytes each GPU holds at a
// tensor-parallel degree. Sizes are bytes. Source of the state shapes: the reference cache
// (transformers models/qwen4_exp): QSA layers keep K and V [num_key_value_heads, head_dim] per token plus one
// indexer key [indexer_kv_heads * indexer_head_dim] per token; GDN layers keep a recurrent state
// [linear_num_value_heads, linear_key_head_dim, linear_value_head_dim] in mamba_ssm_dtype and a conv state
// [conv_dim, linear_conv_kernel_dim - 1]; PLE layers keep a conv state [hc_count * hidden_size,
// (ple_conv_kernel_size - 1) * ngram_size] and the last ngram_size - 1 token ids (int64).
#pragma once

#include <array>
#include <cstdint>

#include "loader/config.h"
#include "loader/manifest.h"

namespace flashnext {

/// Number of Component values (Component::Vision is the last).
constexpr int kNumComponents = int(Component::Vision) + 1;
using ComponentTotals = std::array<int64_t, kNumComponents>;

/// Bytes of one element of a torch dtype name ("float32" 4, "bfloat16"/"float16" 2, "float8_e4m3fn" 1, ...).
/// Throws Error naming `field` for a name it does not know.
int64_t torch_dtype_bytes(const std::string& name, const std::string& field);

/// Per-token and per-sequence state of one sequence, on one GPU at tensor-parallel degree `tp` (tp = 1: the whole
/// model). Heads that tp splits (KV heads, GDN heads) are divided with rounding up: a GPU holds at least one head,
/// as KV heads are replicated when tp exceeds their count; the indexer key and the PLE state are replicated.
struct StatePlan {
  int64_t kv_bytes_per_token = 0;                 ///< K + V of every QSA layer at `kv_bytes` per element
  int64_t indexer_bytes_per_token = 0;            ///< indexer keys of every QSA layer at `kv_bytes` per element
  int64_t gdn_state_bytes_per_sequence = 0;       ///< GDN recurrent state in mamba_ssm_dtype
  int64_t gdn_conv_state_bytes_per_sequence = 0;  ///< GDN conv state at `act_bytes` per element
  int64_t ple_state_bytes_per_sequence = 0;       ///< PLE conv state at `act_bytes` + n-gram context ids (int64)
  int64_t bytes_at_context(int64_t tokens) const {
    return (kv_bytes_per_token + indexer_bytes_per_token) * tokens + gdn_state_bytes_per_sequence +
           gdn_conv_state_bytes_per_sequence + ple_state_bytes_per_sequence;
  }
};

/// The state plan of `cfg`. `kv_bytes`: bytes per KV-cache and indexer-key element (2 for fp16/bf16);
/// `act_bytes`: bytes per conv-state element (2 for bf16 activations). Throws Error for tp < 1.
StatePlan state_plan(const ModelConfig& cfg, int64_t tp = 1, int64_t kv_bytes = 2, int64_t act_bytes = 2);

/// Whether tensor parallelism splits a component across GPUs (embedding and lm_head by vocabulary, attention,
/// GDN and expert weights by heads/columns) or every GPU holds a copy (hyper-connections, router, PLE projections).
/// The PLE table and hash buffers stay on the host; MTP and vision are not loaded by the text engine.
enum class Placement { Sharded, Replicated, Host, NotLoaded };
Placement placement_of(Component c);

/// Weight bytes one GPU holds at degree `tp`, given bytes by component: replicated + ceil(sharded / tp).
int64_t weight_bytes_per_gpu(const ComponentTotals& bytes_by_component, int64_t tp);

}  // namespace flashnext
