// PLE: hashed n-gram embedding injected into every hyper-connection stream (docs MODEL.md "PLE"; reference
// `Qwen4ExpTextPLELayer`, `Qwen4ExpTextNGramEmbedding`).
#pragma once

#include <span>

#include "loader/config.h"
#include "model/qwen4_exp/model.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// Starts gathering the n-gram embedding rows of one PLE layer for a step (items in batch row order): hashes each
/// sequence's n-grams after its token history of this layer (host), advances the histories, and begins the table
/// gather (Ops::ple_gather_start: on the GPU it overlaps with the layers before this one). Returns e
/// [T, heads * head_dim], to pass to ple_add.
Tensor ple_fetch(Ops& ops, const PleLayerWeights& w, std::span<const BatchItem> items, int64_t layer);

/// X = X + PLE(X, e), in place on X [T, S*H], with e from ple_fetch: waits for the gather, gates the value per
/// stream and adds the dilated short conv, updating each sequence's conv tail (its slot of cache.ple_conv).
void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerCache& cache, const Tensor& e,
             const StepBatch& batch, const Tensor& X);

}  // namespace flashnext
