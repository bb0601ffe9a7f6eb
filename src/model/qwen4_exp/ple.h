// PLE: hashed n-gram embedding injected into every hyper-connection stream (docs MODEL.md "PLE"; reference
// `Qwen4ExpTextPLELayer`, `Qwen4ExpTextNGramEmbedding`).
#pragma once

#include <span>

#include "loader/config.h"
#include "model/qwen4_exp/model.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// X = X + PLE(X, ids), in place on X [T, S*H] for the tokens of a step (items in batch row order). Hashes each
/// sequence's n-grams after its token history of this layer (host), gathers the table rows, gates the value per
/// stream and adds the dilated short conv; updates the histories and each sequence's conv tail (its slot of
/// cache.ple_conv).
void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache,
             std::span<const BatchItem> items, int64_t layer, const StepBatch& batch, const Tensor& X);

}  // namespace flashnext
