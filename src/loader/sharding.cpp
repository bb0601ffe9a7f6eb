#include "loader/sharding.h"

#include <string_view>

#include "core/error.h"

namespace flashnext {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

/// Rank r's heads of a mixer with `groups` groups (key / KV heads) of `per_group` heads each (the rules of the header
/// comment); the degree was checked by check_heads.
HeadShard split_heads(int64_t groups, int64_t per_group, int world, int r) {
  HeadShard s;
  if (groups % world == 0) {
    const int64_t n = groups / world;
    s.groups = {r * n, (r + 1) * n};
    s.heads = {s.groups.begin * per_group, s.groups.end * per_group};
    return s;
  }
  const int64_t replicas = world / groups, g = r / replicas, j = r % replicas;
  if (per_group % replicas == 0) {  // the ranks of one group split its heads
    const int64_t n = per_group / replicas;
    s.groups = {g, g + 1};
    s.heads = {g * per_group + j * n, g * per_group + (j + 1) * n};
  } else if (j == 0) {  // the group cannot be split further: its first rank computes it, the others sit it out
    s.groups = {g, g + 1};
    s.heads = {g * per_group, (g + 1) * per_group};
  }
  return s;
}

void check_heads(const ModelConfig& cfg, int world, int64_t groups, const char* what, const char* field) {
  if (groups % world == 0 || world % groups == 0) return;
  fail(
      "{}: --tp {} does not fit the {} {} ({} in the config): the tensor-parallel degree must divide them or be a "
      "multiple of them",
      cfg.source, world, groups, what, field);
}

void check_divides(const ModelConfig& cfg, int world, int64_t n, const char* what, const char* field) {
  if (n % world == 0) return;
  fail("{}: --tp {} does not divide the {} ({} = {} in the config)", cfg.source, world, what, field, n);
}

}  // namespace

IndexRange balanced_range(int64_t n, int world, int r) {
  return {n * r / world, n * (r + 1) / world};
}

std::vector<int64_t> TensorSplit::shape(const std::vector<int64_t>& full) const {
  if (split == Split::None) return {};
  std::vector<int64_t> s = full;
  if (split != Split::Rows && split != Split::Columns) return s;
  int64_t n = 0;
  for (const IndexRange& r : ranges) n += r.size();
  s[split == Split::Rows ? 0 : s.size() - 1] = n;
  return s;
}

int64_t TensorSplit::numel(const std::vector<int64_t>& full) const {
  const std::vector<int64_t> s = shape(full);
  if (s.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

TpPlan TpPlan::make(const ModelConfig& cfg, int world) {
  FN_CHECK(world >= 1, "--tp must be >= 1, got {}", world);
  TpPlan p;
  p.cfg_ = cfg;
  if (world > 1) {
    check_heads(cfg, world, cfg.linear_num_key_heads, "GDN key heads", "linear_num_key_heads");
    check_heads(cfg, world, cfg.num_key_value_heads, "QSA KV heads", "num_key_value_heads");
    check_divides(cfg, world, cfg.moe_intermediate_size, "routed experts' intermediate width", "moe_intermediate_size");
    check_divides(cfg, world, cfg.shared_expert_intermediate_size, "shared expert's intermediate width",
                  "shared_expert_intermediate_size");
    FN_CHECK(cfg.vocab_size >= world, "{}: --tp {} exceeds the vocabulary (vocab_size = {})", cfg.source, world,
             cfg.vocab_size);
  }
  const int64_t gdn_per_group = cfg.linear_num_key_heads ? cfg.linear_num_value_heads / cfg.linear_num_key_heads : 0;
  const int64_t attn_per_group = cfg.num_key_value_heads ? cfg.num_attention_heads / cfg.num_key_value_heads : 0;
  for (int r = 0; r < world; ++r) {
    RankShard s;
    s.rank = r;
    s.gdn = split_heads(cfg.linear_num_key_heads, gdn_per_group, world, r);
    s.attn = split_heads(cfg.num_key_value_heads, attn_per_group, world, r);
    s.moe_inter = balanced_range(cfg.moe_intermediate_size, world, r);
    s.shared_inter = balanced_range(cfg.shared_expert_intermediate_size, world, r);
    s.vocab = balanced_range(cfg.vocab_size, world, r);
    p.ranks_.push_back(s);
  }
  return p;
}

ModelConfig TpPlan::rank_config(int r) const {
  const RankShard& s = rank(r);
  ModelConfig c = cfg_;
  c.linear_num_key_heads = s.gdn.groups.size();
  c.linear_num_value_heads = s.gdn.heads.size();
  c.num_key_value_heads = s.attn.groups.size();
  c.num_attention_heads = s.attn.heads.size();
  c.moe_intermediate_size = s.moe_inter.size();
  c.shared_expert_intermediate_size = s.shared_inter.size();
  return c;
}

IndexRange TpPlan::ple_rows(int r, int64_t table_rows) const {
  return balanced_range(table_rows, world(), r);
}

TensorSplit TpPlan::split(int r, const std::string& name, const std::vector<int64_t>& full) const {
  using S = Split;
  if (world() == 1) return {S::Replicated, {}};
  const RankShard& s = rank(r);
  const ModelConfig& c = cfg_;
  auto rows = [](std::vector<IndexRange> ranges) { return TensorSplit{S::Rows, std::move(ranges)}; };
  auto cols = [](std::vector<IndexRange> ranges) { return TensorSplit{S::Columns, std::move(ranges)}; };
  auto scaled = [](IndexRange r, int64_t k, int64_t offset = 0) {
    return IndexRange{offset + r.begin * k, offset + r.end * k};
  };
  if (name == "embed_tokens.weight" || name == "lm_head.weight") return rows({s.vocab});

  if (contains(name, ".linear_attn.")) {
    if (s.gdn.idle()) return {S::None, {}};
    const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, key_dim = c.gdn_key_dim();
    if (ends_with(name, ".in_proj_qkv.weight") || ends_with(name, ".conv1d.weight"))  // q | k | v channels
      return rows({scaled(s.gdn.groups, dk), scaled(s.gdn.groups, dk, key_dim), scaled(s.gdn.heads, dv, 2 * key_dim)});
    if (ends_with(name, ".in_proj_z.weight")) return rows({scaled(s.gdn.heads, dv)});
    if (ends_with(name, ".in_proj_b.weight") || ends_with(name, ".in_proj_a.weight") || ends_with(name, ".A_log") ||
        ends_with(name, ".dt_bias"))
      return rows({s.gdn.heads});
    if (ends_with(name, ".out_proj.weight")) return cols({scaled(s.gdn.heads, dv)});
    return {S::Replicated, {}};  // the gated norm weight [dv]
  }
  if (contains(name, ".self_attn.")) {
    if (s.attn.idle()) return {S::None, {}};
    const int64_t D = c.head_dim;
    if (contains(name, ".q_proj.")) return rows({scaled(s.attn.heads, 2 * D)});  // per head [query | gate]
    if (contains(name, ".k_proj.") || contains(name, ".v_proj.")) return rows({scaled(s.attn.groups, D)});
    if (ends_with(name, ".o_proj.weight")) return cols({scaled(s.attn.heads, D)});
    if (ends_with(name, ".o_proj.bias")) return {r == 0 ? S::Replicated : S::None, {}};
    return {S::Replicated, {}};  // q_norm, k_norm, the indexer
  }
  if (contains(name, ".mlp.experts.")) {
    if (ends_with(name, ".gate_proj.weight") || ends_with(name, ".up_proj.weight")) return rows({s.moe_inter});
    if (ends_with(name, ".down_proj.weight")) return cols({s.moe_inter});
  }
  if (contains(name, ".mlp.shared_expert.")) {
    if (ends_with(name, ".gate_proj.weight") || ends_with(name, ".up_proj.weight")) return rows({s.shared_inter});
    if (ends_with(name, ".down_proj.weight")) return cols({s.shared_inter});
  }
  (void)full;
  return {S::Replicated, {}};  // hyper-connections, router, shared_expert_gate, PLE projections, norms
}

}  // namespace flashnext
