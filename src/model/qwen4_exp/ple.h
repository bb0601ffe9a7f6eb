// PLE: hashed n-gram embedding injected into every hyper-connection stream (docs MODEL.md "PLE"; reference
// `Qwen4ExpTextPLELayer`, `Qwen4ExpTextNGramEmbedding`).
#pragma once

#include <span>

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// X = X + PLE(X, ids), in place on X [T, S*H]. Hashes the n-grams of `ids` after the layer's token history (host),
/// gathers the table rows, gates the value per stream and adds the dilated short conv; updates the history and the
/// conv tail of `state`.
void ple_add(Ops& ops, const ModelConfig& cfg, const PleLayerWeights& w, LayerState& state,
             std::span<const int32_t> ids, const Tensor& X);

}  // namespace flashnext
