// Tensor-parallel sharding plan of the qwen4_exp model: what each rank of a group of `world` ranks holds and
// computes, derived from the config alone (docs/ENGINE.md "Tensor parallelism" has the table in prose). It is the one
// place that decides: the loader reads each rank's part of every checkpoint tensor (TpPlan::split), the model
// computes with the rank's geometry (TpPlan::rank_config) and combines partial results with the collectives of
// parallel/communicator.h, inspect counts the bytes per rank.
//
// The rules (Megatron-style: column-parallel in-projections, row-parallel out-projections, one all-reduce each):
// - Gated DeltaNet by heads: groups are the key heads (linear_num_key_heads), each serving nv/nk value heads. With
//   world dividing the key heads a rank takes nk/world key heads and their value heads; with world a multiple of the
//   key heads, the world/nk ranks of one key head split its value heads when they divide, else the first of them
//   computes the whole group and the others sit the layer out (they add zeros). in_proj_qkv and conv1d rows: the
//   rank's q, k (key heads) and v (value heads) channels; in_proj_z / b / a, A_log, dt_bias by value heads; out_proj
//   by input columns (then all-reduce); the gated norm weight replicated. Any other degree is an error naming
//   linear_num_key_heads.
// - QSA attention the same way with KV heads as groups (num_key_value_heads) serving nh/nkv query heads: q_proj rows
//   by query head (each head's [query | gate] rows), k/v_proj rows by KV head (a KV head is replicated on the
//   ranks of its query heads when world exceeds the KV heads), o_proj by input columns (all-reduce), o_proj.bias on
//   rank 0 only. The indexer (index_qk_proj, its norms, the indexer key cache) is replicated on every rank that
//   holds attention heads, so every rank selects the blocks TP 1 selects.
// - MoE: the router and shared_expert_gate replicated (every rank routes alike); every routed expert and the shared
//   expert sliced along their intermediate width (gate/up rows, down columns; world must divide
//   moe_intermediate_size and shared_expert_intermediate_size); one all-reduce of the block's output.
// - embed_tokens and lm_head by vocabulary rows (balanced contiguous ranges, widths may differ by one): the
//   embedding all-reduced (a rank contributes the rows of its ids, zeros for the others), the logits all-gathered.
// - The PLE n-gram table by rows (TpPlan::ple_rows: balanced contiguous ranges of the logical table, cut across its
//   checkpoint shards); the gathered rows all-reduced (each row comes from the one rank that holds it). Its
//   projections, norms and conv replicated.
// - Hyper-connections and everything else replicated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/config.h"

namespace flashnext {

/// [begin, end) of some index.
struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

/// The heads of one mixer kind a rank holds: contiguous key/KV heads (`groups`) and the value/query heads they
/// serve (`heads`), global indices. Both empty: the rank sits this kind of layer out.
struct HeadShard {
  IndexRange groups;
  IndexRange heads;
  bool idle() const { return heads.empty(); }
};

/// What one rank holds.
struct RankShard {
  int rank = 0;
  HeadShard gdn;            ///< GDN key heads / value heads
  HeadShard attn;           ///< QSA KV heads / query heads
  IndexRange moe_inter;     ///< columns of every routed expert's intermediate (moe_intermediate_size)
  IndexRange shared_inter;  ///< columns of the shared expert's intermediate (shared_expert_intermediate_size)
  IndexRange vocab;         ///< rows of embed_tokens and lm_head
};

/// How a rank holds one checkpoint tensor.
enum class Split : uint8_t {
  Replicated,  ///< all of it
  Rows,        ///< the rows (dimension 0) in `ranges`, concatenated in order
  Columns,     ///< the columns (last dimension) in `ranges`, concatenated in order
  None,        ///< nothing (a mixer the rank sits out; o_proj.bias on ranks > 0: added once, before the sum)
};

/// The part of one tensor a rank holds.
struct TensorSplit {
  Split split = Split::Replicated;
  std::vector<IndexRange> ranges;  ///< for Rows / Columns
  /// The shape of the part, given the full shape (dimension 0 or the last one shortened; empty for None).
  std::vector<int64_t> shape(const std::vector<int64_t>& full) const;
  /// Elements of the part of a tensor of `full` shape.
  int64_t numel(const std::vector<int64_t>& full) const;
};

class TpPlan {
 public:
  /// The plan of `cfg` over `world` ranks. Throws Error, before anything is loaded, when world < 1 or when a sharded
  /// dimension does not allow it, naming the dimension and its config field (e.g. "--tp 3 does not fit the 2 GDN key
  /// heads (linear_num_key_heads in .../config.json): the degree must divide them or be a multiple of them").
  static TpPlan make(const ModelConfig& cfg, int world);

  int world() const { return int(ranks_.size()); }
  const ModelConfig& config() const { return cfg_; }
  const RankShard& rank(int r) const { return ranks_.at(size_t(r)); }

  /// The geometry rank r computes with: `cfg` with its own GDN key / value heads, QSA query / KV heads and MoE
  /// intermediate widths (0 where it sits a mixer out); vocab_size, hidden sizes and everything else unchanged
  /// (vocabulary parallelism is in RankShard::vocab).
  ModelConfig rank_config(int r) const;

  /// How rank r holds the logical checkpoint tensor `name` (WeightManifest names: "embed_tokens.weight",
  /// "layers.3.linear_attn.in_proj_qkv.weight", ...) of shape `full` (the table of the header comment; quantization
  /// companions are not covered: the loader slices dequantized weights, and hands quantized routed experts whole
  /// to the backend with the rank's slice of the intermediate, RankShard::moe_inter). The PLE table shards are not
  /// covered either: see ple_rows.
  TensorSplit split(int r, const std::string& name, const std::vector<int64_t>& full) const;

  /// Rows of a PLE table of `table_rows` logical rows that rank r holds (balanced contiguous ranges).
  IndexRange ple_rows(int r, int64_t table_rows) const;

 private:
  ModelConfig cfg_;
  std::vector<RankShard> ranks_;
};

/// Rank r's part of [0, n) split into `world` balanced contiguous ranges (sizes differ by at most one).
IndexRange balanced_range(int64_t n, int world, int r);

}  // namespace flashnext
