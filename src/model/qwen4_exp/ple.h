// PLE: hashed n-gram embedding injected into every hyper-connection stream (docs MODEL.md "PLE"; reference
// `Qwen4ExpTextPLELayer`, `Qwen4ExpTextNGramEmbedding`).
#pragma once

#include <span>
#include <vector>

#include "loader/config.h"
#include "model/qwen4_exp/model.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"
#include "parallel/communicator.h"

namespace flashnext {

/// The n-gram table rows of one PLE layer for a step (items in batch row order), [T * heads] row-major: hashes each
/// sequence's n-grams after its token history of this layer (host; once per step, for every rank). `next_history`
/// receives each item's history after the step, for the caller to store once the step succeeded.
std::vector<int64_t> ple_hash_rows(const PleLayerWeights& w, std::span<const BatchItem> items, int64_t layer,
                                   std::vector<std::vector<int64_t>>& next_history);

/// The layer's n-gram history after `ids` follow `history` (its last context_len ids): what ple_hash_rows leaves
/// for the item.
std::vector<int64_t> ple_next_history(const PleLayerWeights& w, const std::vector<int64_t>& history,
                                      std::span<const int32_t> ids);

/// The rows of ple_hash_rows as the rank holding `w` reads them: under tensor parallelism a rank that holds only
/// some rows (PleLayerWeights::rows_held) reads its own at their local index and the zero row after them for the
/// rest; otherwise `rows` as they are.
std::vector<int64_t> ple_local_rows(const PleLayerWeights& w, std::span<const int64_t> rows);

/// Begins the table gather of `rows` (I64 [T, heads] on the device, from ple_local_rows) for the step's T tokens
/// (Ops::ple_gather_start: on the GPU it overlaps with the layers before this one). Returns e [T, heads * head_dim],
/// to pass to ple_add.
Tensor ple_fetch(Ops& ops, const PleLayerWeights& w, const Tensor& rows);

/// X = X + PLE(X, e), in place on X [T, S*H], with e from ple_fetch: waits for the gather, sums the ranks' partial
/// gathers (comm: each row comes from the one rank that holds it, so the sum is exact), gates the value per stream
/// and adds the dilated short conv, updating each sequence's conv tail (its slot of cache.ple_conv). `keep`: row
/// ranges whose conv input P is copied into their StateInputs::Layer's ple (a speculative verify; the caller
/// allocates it, [n, S*H]).
void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache, const Tensor& e,
             const StepBatch& batch, const Tensor& X, Communicator& comm, std::span<const KeepRows> keep = {});

/// The state half of ple_add over the first batch.num_tokens rows of kept.ple (one sequence's kept rows, the batch
/// that sequence alone): the short conv, updating its conv tail; the residual sum is dropped (Model::replay_state).
void ple_replay(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache, const StepBatch& batch,
                const StateInputs::Layer& kept);

}  // namespace flashnext
