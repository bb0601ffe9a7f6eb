// make_step_batch: the StepBatch of one step, host vectors and one upload of its device tensors.
#include "ops/step_batch.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace flashnext {

StepBatch make_step_batch(Ops& ops, std::span<const StepSequence> seqs, int64_t block_size) {
  StepBatch b;
  const std::vector<int32_t> h = plan_step_batch(b, seqs, block_size);
  bind_step_batch(b, ops.upload(h.data(), DType::I32, {int64_t(h.size())}));
  return b;
}

std::vector<int32_t> plan_step_batch(StepBatch& b, std::span<const StepSequence> seqs, int64_t block_size,
                                     int64_t context_bucket) {
  FN_CHECK(block_size >= 1, "step batch: block size {} must be >= 1", block_size);
  FN_CHECK(context_bucket >= 0, "step batch: context bucket {} must be >= 0", context_bucket);
  b = StepBatch{};
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
  if (context_bucket > 0) {
    b.max_context = (b.max_context + context_bucket - 1) / context_bucket * context_bucket;
    b.max_blocks = std::max(b.max_blocks, (b.max_context + block_size - 1) / block_size);
  }
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
  return h;
}

void bind_step_batch(StepBatch& b, const Tensor& all) {
  const int64_t T = b.num_tokens, S = b.num_seqs, M = b.max_blocks;
  FN_CHECK(all.dtype() == DType::I32 && all.rank() == 1 && all.dim(0) >= b.metadata_words(),
           "step batch: {} does not hold the step's {} metadata words", all.str(), b.metadata_words());
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
}

}  // namespace flashnext
