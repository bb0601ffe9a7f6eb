// make_step_batch and the default (per-sequence) implementations of the batched ops of ops/ops.h.
#include "ops/step_batch.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace flashnext {

StepBatch make_step_batch(Ops& ops, std::span<const StepSequence> seqs, int64_t block_size) {
  FN_CHECK(block_size >= 1, "step batch: block size {} must be >= 1", block_size);
  StepBatch b;
  b.num_seqs = int64_t(seqs.size());
  b.block_size = block_size;
  b.cu_seqlens.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const StepSequence& q = seqs[s];
    FN_CHECK(q.tokens >= 1 && q.pos0 >= 0 && q.slot >= 0,
             "step batch: sequence {} has {} tokens at position {} in slot {} (need >= 1 token, position >= 0, "
             "slot >= 0)",
             s, q.tokens, q.pos0, q.slot);
    const int64_t end = q.pos0 + q.tokens, need = (end + block_size - 1) / block_size;
    FN_CHECK(int64_t(q.block_table.size()) >= need,
             "step batch: sequence {} reaches position {} but its block table covers {} blocks of {} ({} needed)", s,
             end - 1, q.block_table.size(), block_size, need);
    for (int64_t i = 0; i < need; ++i) {
      FN_CHECK(q.block_table[size_t(i)] >= 0, "step batch: sequence {} has block id {} at table entry {}", s,
               q.block_table[size_t(i)], i);
    }
    b.cu_seqlens.push_back(int32_t(b.cu_seqlens.back() + q.tokens));
    b.pos0.push_back(q.pos0);
    b.slot_ids.push_back(q.slot);
    b.max_blocks = std::max(b.max_blocks, need);
    b.max_context = std::max(b.max_context, end);
  }
  b.num_tokens = b.cu_seqlens.back();
  // Distinct slots, and no KV block written by two sequences: a batched kernel updates them without ordering.
  std::vector<int32_t> slots = b.slot_ids, written;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t bs = block_size, first = seqs[s].pos0 / bs, last = (seqs[s].pos0 + seqs[s].tokens - 1) / bs;
    for (int64_t i = first; i <= last; ++i) written.push_back(seqs[s].block_table[size_t(i)]);
  }
  std::sort(slots.begin(), slots.end());
  std::sort(written.begin(), written.end());
  FN_CHECK(std::adjacent_find(slots.begin(), slots.end()) == slots.end(),
           "step batch: two sequences share a state slot (each sequence needs its own)");
  FN_CHECK(std::adjacent_find(written.begin(), written.end()) == written.end(),
           "step batch: two sequences write the same KV block (block tables must not overlap)");
  const int64_t T = b.num_tokens, S = b.num_seqs, M = std::max<int64_t>(b.max_blocks, 1);
  b.max_blocks = M;
  b.host_block_tables.assign(size_t(S * M), -1);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t need = (b.pos0[size_t(s)] + b.rows_of(s) + block_size - 1) / block_size;
    std::copy_n(seqs[size_t(s)].block_table.begin(), need, b.host_block_tables.begin() + s * M);
  }
  // One host buffer: positions | token_seq | slot_mapping | block_tables | seq_starts | slots.
  std::vector<int32_t> h;
  h.reserve(size_t(3 * T + S * M + 2 * S + 1));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < b.rows_of(s); ++i) h.push_back(int32_t(b.pos0[size_t(s)] + i));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < b.rows_of(s); ++i) h.push_back(int32_t(s));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < b.rows_of(s); ++i) h.push_back(int32_t(b.cache_row(s, b.pos0[size_t(s)] + i)));
  h.insert(h.end(), b.host_block_tables.begin(), b.host_block_tables.end());
  h.insert(h.end(), b.cu_seqlens.begin(), b.cu_seqlens.end());
  h.insert(h.end(), b.slot_ids.begin(), b.slot_ids.end());
  Tensor all = ops.upload(h.data(), DType::I32, {int64_t(h.size())});
  int64_t at = 0;
  auto take = [&](int64_t n) {
    Tensor t = all.rows(at, at + n);
    at += n;
    return t;
  };
  b.positions = take(T);
  b.token_seq = take(T);
  b.slot_mapping = take(T);
  b.block_tables = take(S * M).view({S, M});
  b.seq_starts = take(S + 1);
  b.slots = take(S);
  return b;
}

// ------------------------------------------------------------------------------------------------------------------
// Default batched ops: one per-sequence op call per sequence, on row slices and slot views.
// ------------------------------------------------------------------------------------------------------------------

namespace {

/// Row `slot` of a state pool [slots, ...] as a tensor of the remaining dimensions.
Tensor slot_view(const Tensor& pool, int64_t slot, const char* op) {
  FN_CHECK(pool.rank() >= 2 && slot >= 0 && slot < pool.dim(0), "{}: state slot {} outside the pool {}", op, slot,
           pool.str());
  Shape inner(pool.shape().begin() + 1, pool.shape().end());
  return pool.rows(slot, slot + 1).view(inner);
}

Tensor seq_rows(const Tensor& t, const StepBatch& b, int64_t s) {
  return t.rows(b.cu_seqlens[size_t(s)], b.cu_seqlens[size_t(s) + 1]);
}

void check_rows(const Tensor& t, const StepBatch& b, const char* op, const char* what) {
  FN_CHECK(t.rank() >= 1 && t.dim(0) == b.num_tokens, "{}: {} {} does not have the step's {} rows", op, what, t.str(),
           b.num_tokens);
}

}  // namespace

Tensor Ops::gather_sequence(const Tensor& pool, const StepBatch& b, int64_t s, int64_t length) {
  std::vector<int32_t> rows(static_cast<size_t>(length));
  for (int64_t p = 0; p < length; ++p) rows[size_t(p)] = int32_t(b.cache_row(s, p));
  Shape shape = pool.shape();
  shape[0] = length;
  Tensor out = empty(shape, pool.dtype());
  gather_rows(pool, upload(rows.data(), DType::I32, {length}), out);
  return out;
}

void Ops::gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool, const StepBatch& b) {
  check_rows(qkv, b, "gdn_conv_batch", "qkv");
  for (int64_t s = 0; s < b.num_seqs; ++s)
    gdn_conv(seq_rows(qkv, b, s), weight, slot_view(state_pool, b.slot_ids[size_t(s)], "gdn_conv_batch"));
}

void Ops::gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& bb, const GdnWeights& w, const GdnDims& dims,
                         const Tensor& state_pool, const StepBatch& b, const Tensor& o) {
  check_rows(qkv, b, "gdn_rule_batch", "qkv");
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    const Tensor state = slot_view(state_pool, b.slot_ids[size_t(s)], "gdn_rule_batch");
    if (b.rows_of(s) == 1) {
      gdn_recurrent(seq_rows(qkv, b, s), seq_rows(a, b, s), seq_rows(bb, b, s), w, dims, state, seq_rows(o, b, s));
    } else {
      gdn_chunked(seq_rows(qkv, b, s), seq_rows(a, b, s), seq_rows(bb, b, s), w, dims, state, seq_rows(o, b, s));
    }
  }
}

void Ops::ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                             int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& b,
                             const Tensor& X) {
  check_rows(P, b, "ple_conv_add_batch", "P");
  for (int64_t s = 0; s < b.num_seqs; ++s)
    ple_conv_add(seq_rows(P, b, s), norm_conv, group, conv_w, dilation, eps,
                 slot_view(state_pool, b.slot_ids[size_t(s)], "ple_conv_add_batch"), seq_rows(X, b, s));
}

void Ops::qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                               double eps, const RopeParams& rope, const StepBatch& b, const Tensor& q,
                               const Tensor& gate) {
  check_rows(qg, b, "qsa_prepare_qk_batch", "q_proj output");
  for (int64_t s = 0; s < b.num_seqs; ++s)
    qsa_prepare_qk(seq_rows(qg, b, s), seq_rows(k, b, s), q_norm, k_norm, eps, rope, b.pos0[size_t(s)],
                   seq_rows(q, b, s), seq_rows(gate, b, s));
}

void Ops::qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                   const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                   const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& b,
                                   const Tensor& selected) {
  (void)pooled_key_pool;  // the per-sequence op recomputes the block keys
  check_rows(qi, b, "qsa_indexer_select_batch", "index queries");
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    const int64_t pos0 = b.pos0[size_t(s)], end = pos0 + b.rows_of(s);
    qsa_indexer_select(seq_rows(qi, b, s), gather_sequence(index_key_pool, b, s, end), q_layernorm, k_layernorm, eps,
                       rope, pos0, budget, block, seq_rows(selected, b, s));
  }
}

void Ops::sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& selected,
                                 const Tensor& gate, double scale, const StepBatch& b, const Tensor& out) {
  check_rows(q, b, "sparse_attention_batch", "q");
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    const int64_t end = b.pos0[size_t(s)] + b.rows_of(s);
    sparse_attention(seq_rows(q, b, s), gather_sequence(k_pool, b, s, end), gather_sequence(v_pool, b, s, end),
                     seq_rows(selected, b, s), seq_rows(gate, b, s), scale, seq_rows(out, b, s));
  }
}

}  // namespace flashnext
