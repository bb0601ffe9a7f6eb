// QSA attention mixer: gated attention over the tokens chosen by the block indexer (docs MODEL.md "QSA attention
// layer"; reference `Qwen4ExpTextAttention`, `Qwen4ExpTextQSAIndexer`).
#pragma once

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// out [T, H] = QSA(u [T, H]) for the tokens of a step (batch.positions), writing their K, V and raw indexer keys
/// into the layer's paged caches at batch.slot_mapping.
Tensor qsa_attention(Ops& ops, const ModelConfig& cfg, const QsaLayerWeights& w, LayerCache& cache,
                     const StepBatch& batch, const Tensor& u);

}  // namespace flashnext
