// Gated DeltaNet mixer (docs MODEL.md "Gated DeltaNet (linear attention) layer"; reference
// `Qwen4ExpTextGatedDeltaNet`).
#pragma once

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// out [T, H] = GatedDeltaNet(u [T, H]) for the tokens of a step, continuing from and updating each sequence's conv
/// tail and recurrent state (its slot of the layer's pools). A sequence's chunk of more than one token runs the
/// chunked (WY) form, a single token the recurrence (decode).
Tensor gated_delta_net(Ops& ops, const ModelConfig& cfg, const GdnLayerWeights& w, LayerCache& cache,
                       const StepBatch& batch, const Tensor& u);

/// Head geometry of the config's GDN layers.
GdnDims gdn_dims(const ModelConfig& cfg);

}  // namespace flashnext
