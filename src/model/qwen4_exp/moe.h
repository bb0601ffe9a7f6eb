// Sparse MoE block with a gated shared expert (docs MODEL.md "MoE block"; reference `Qwen4ExpTextSparseMoeBlock`).
#pragma once

#include <functional>

#include "loader/config.h"
#include "ops/ops.h"

namespace flashnext {

/// Sees the router's choice of every MoE block of a step: ids [T, top_k] I32 on the backend's device (valid until the
/// block's next op; download it to keep it). For measurements (`flashnext bench`: the experts a step really reads).
using RouterObserver = std::function<void(int64_t layer, const Tensor& ids)>;

/// out [T, H] = routed experts (softmax router, top-k, optional renormalisation) + sigmoid-gated shared expert.
/// `observer` (may be empty) is called with the router's ids.
Tensor moe_block(Ops& ops, const ModelConfig& cfg, const MoeWeights& w, const Tensor& u,
                 const RouterObserver& observer = {}, int64_t layer = 0);

}  // namespace flashnext
