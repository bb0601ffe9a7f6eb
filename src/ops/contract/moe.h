// Contracts of the MoE ops of ops/ops.h: moe_router_topk, moe_experts, moe_shared_expert.
#pragma once

#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// moe_router_topk(u, router, norm, ids, weights): u [T, H], router [E, H] weight, ids [T, k] I32 and weights
/// [T, k] F32 with 1 <= k <= E.
struct RouterDims {
  int64_t tokens, hidden, experts, top_k;
};
RouterDims moe_router_topk(const Backend& b, const Tensor& u, const Tensor& router, const Tensor& ids,
                           const Tensor& weights);

/// moe_experts(u, ids, weights, w, out, shared): u, out and shared (if given) [T, H], ids [T, k] I32, weights [T, k]
/// F32, k >= 1; without
/// w.packed, w.gate / w.up [E, I, H] and w.down [E, H, I] weights (experts and inter are then set; with w.packed
/// they are 0 and the backend checks its own form). Expert ids are the backend's to check.
struct ExpertsDims {
  int64_t tokens, hidden, top_k, experts, inter;
};
ExpertsDims moe_experts(const Backend& b, const Tensor& u, const Tensor& ids, const Tensor& weights,
                        const MoeWeights& w, const Tensor& out, const Tensor& shared = Tensor());

/// moe_shared_expert(u, w, out): u, out [T, H]; shared gate_proj / up_proj [Is, H], down_proj [H, Is] and
/// shared_expert_gate [1, H] weights.
struct SharedExpertDims {
  int64_t tokens, hidden, inter;
};
SharedExpertDims moe_shared_expert(const Backend& b, const Tensor& u, const MoeWeights& w, const Tensor& out);

}  // namespace flashnext::contract
