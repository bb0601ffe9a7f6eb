// StepBatch: the sequences of one batched forward step and where their cache rows live (the equivalent of vLLM's
// attention metadata). Built once per step by make_step_batch; read by the `*_batch` ops of ops/ops.h.
//
// Layout of a step with S sequences and T tokens:
//   - sequence s owns activation rows [cu_seqlens[s], cu_seqlens[s+1]); its tokens are at logical positions
//     pos0[s], pos0[s]+1, ... (a prefill chunk, a whole prompt, or one decode token);
//   - KV caches are paged: a pool of num_blocks blocks of block_size rows; logical position p of sequence s lives
//     at pool row block_tables[s, p / block_size] * block_size + p % block_size;
//   - recurrent state (GDN conv and recurrent state, PLE conv state) lives in state pools indexed by slot: row
//     slots[s] of a pool [num_slots, ...].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/tensor.h"

namespace flashnext {

class Ops;

/// One sequence's part of a step, as make_step_batch takes it.
struct StepSequence {
  int64_t tokens = 0;                     ///< rows it feeds this step (>= 1)
  int64_t pos0 = 0;                       ///< position of its first token = tokens it has fed before
  int32_t slot = 0;                       ///< its state slot
  std::span<const int32_t> block_table;   ///< its KV blocks, logical block i -> pool block; covers pos0 + tokens
};

/// The metadata of one step (see the top of this file). Host vectors for the host-side loops, device tensors (on
/// the backend's device, I32) for kernels.
struct StepBatch {
  int64_t num_seqs = 0;    ///< sequences in the step (S)
  int64_t num_tokens = 0;  ///< rows of the step's activations (T)
  int64_t block_size = 0;  ///< positions per KV block
  int64_t max_blocks = 0;           ///< columns of block_tables (the longest table in the step)
  int64_t max_context = 0;          ///< largest pos0[s] + tokens of the step
  std::vector<int32_t> cu_seqlens;  ///< host [num_seqs + 1]: row ranges
  std::vector<int64_t> pos0;        ///< host [num_seqs]
  std::vector<int32_t> slot_ids;    ///< host [num_seqs]
  std::vector<int32_t> host_block_tables;  ///< host [num_seqs, max_blocks], -1 past a table's end

  Tensor positions;     ///< [T]: logical position of each token
  Tensor token_seq;     ///< [T]: sequence index of each token
  Tensor slot_mapping;  ///< [T]: cache pool row of each token (where its K, V and index key are written)
  Tensor block_tables;  ///< [num_seqs, max_blocks]
  Tensor seq_starts;    ///< [num_seqs + 1]: cu_seqlens on the device
  Tensor slots;         ///< [num_seqs]

  /// I32 words of the device tensors (plan_step_batch's layout): 3 T + S max_blocks + 2 S + 1.
  int64_t metadata_words() const { return 3 * num_tokens + num_seqs * max_blocks + 2 * num_seqs + 1; }
  /// Rows (tokens) sequence `s` feeds this step.
  int64_t rows_of(int64_t s) const { return cu_seqlens[size_t(s) + 1] - cu_seqlens[size_t(s)]; }
  /// Rows the step's longest run of one sequence feeds (0 for no sequence).
  int64_t max_rows() const {
    int64_t n = 0;
    for (int64_t s = 0; s < num_seqs; ++s) n = rows_of(s) > n ? rows_of(s) : n;
    return n;
  }
  /// Cache pool row of logical position `p` of sequence `s`.
  int64_t cache_row(int64_t s, int64_t p) const {
    return int64_t(host_block_tables[size_t(s * max_blocks + p / block_size)]) * block_size + p % block_size;
  }
};

/// Builds the StepBatch of `seqs` (in row order) and uploads its device tensors in one copy (plan_step_batch, then
/// bind_step_batch over the upload). Throws Error naming the sequence when it has no tokens, a negative position or
/// slot, or a block table that does not cover pos0 + tokens positions or holds a negative block id; and when two
/// sequences share a slot or write the same KV block this step. block_size must be >= 1.
StepBatch make_step_batch(Ops& ops, std::span<const StepSequence> seqs, int64_t block_size);

/// The host half of make_step_batch (same checks): fills the host fields of `b` and returns the I32 words of its
/// device tensors, in the order positions [T] | token_seq [T] | slot_mapping [T] | block_tables [S, max_blocks] |
/// seq_starts [S + 1] | slots [S]. `context_bucket` > 0 rounds max_context up to a multiple of it and max_blocks (the
/// table stride) up to the blocks of that context, so that consecutive decode steps of the same sequences have the
/// same launch arguments (a recorded step, Ops::begin_step_capture, is replayed while they stay in the bucket); the
/// kernels bound their work by the device positions, so a larger max_context only widens their grids.
std::vector<int32_t> plan_step_batch(StepBatch& b, std::span<const StepSequence> seqs, int64_t block_size,
                                     int64_t context_bucket = 0);

/// The device half: `words` (I32, the upload of plan_step_batch's words, or a section of a larger upload) viewed as
/// the StepBatch's device tensors. Throws Error when it does not hold as many words as `b` needs.
void bind_step_batch(StepBatch& b, const Tensor& words);

}  // namespace flashnext
