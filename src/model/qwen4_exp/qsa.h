// QSA attention mixer: gated attention over the tokens chosen by the block indexer (docs MODEL.md "QSA attention
// layer"; reference `Qwen4ExpTextAttention`, `Qwen4ExpTextQSAIndexer`).
#pragma once

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// out [T, H] = QSA(u [T, H]) for tokens at positions pos0 .. pos0+T-1, appending their K, V and raw indexer keys
/// to the layer's caches (grown as needed, up to max_position_embeddings rows).
Tensor qsa_attention(Ops& ops, const ModelConfig& cfg, const QsaLayerWeights& w, LayerState& state, const Tensor& u,
                     int64_t pos0);

/// Makes the QSA caches of `state` hold at least `rows` positions, keeping the first `keep` rows.
void qsa_reserve(Ops& ops, const ModelConfig& cfg, LayerState& state, int64_t rows, int64_t keep);

}  // namespace flashnext
