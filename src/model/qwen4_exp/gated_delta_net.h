// Gated DeltaNet mixer (docs MODEL.md "Gated DeltaNet (linear attention) layer"; reference
// `Qwen4ExpTextGatedDeltaNet`).
#pragma once

#include <span>

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "model/qwen4_exp/weights.h"

namespace flashnext {

/// out [T, H] = GatedDeltaNet(u [T, H]) for the tokens of a step, continuing from and updating each sequence's conv
/// tail and recurrent state (its slot of the layer's pools). A sequence's chunk of more than one token runs the
/// chunked (WY) form, a single token the recurrence (decode). `keep`: row ranges whose conv inputs (in_proj_qkv
/// before the conv) and in_proj_a / in_proj_b rows are copied into their StateInputs::Layer's qkv / a / b (a
/// speculative verify; the caller allocates them, [n, conv_dim] and [n, nv]).
Tensor gated_delta_net(Ops& ops, const ModelConfig& cfg, const GdnLayerWeights& w, LayerCache& cache,
                       const StepBatch& batch, const Tensor& u, std::span<const KeepRows> keep = {});

/// The state half of gated_delta_net over the first batch.num_tokens rows of `kept` (one sequence's kept rows, the
/// batch that sequence alone): the conv and the gated delta rule, updating its conv tail and recurrent state; the
/// output is dropped (Model::replay_state).
void gated_delta_net_replay(Ops& ops, const ModelConfig& cfg, const GdnLayerWeights& w, LayerCache& cache,
                            const StepBatch& batch, const StateInputs::Layer& kept);

/// Head geometry of the config's GDN layers.
GdnDims gdn_dims(const ModelConfig& cfg);

}  // namespace flashnext
