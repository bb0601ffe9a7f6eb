// Sparse MoE block with a gated shared expert (docs MODEL.md "MoE block"; reference `Qwen4ExpTextSparseMoeBlock`).
#pragma once

#include "loader/config.h"
#include "ops/ops.h"

namespace flashnext {

/// out [T, H] = routed experts (softmax router, top-k, optional renormalisation) + sigmoid-gated shared expert.
Tensor moe_block(Ops& ops, const ModelConfig& cfg, const MoeWeights& w, const Tensor& u);

}  // namespace flashnext
