#include "model/qwen4_exp/moe.h"

namespace flashnext {

Tensor moe_block(Ops& ops, const ModelConfig& cfg, const MoeWeights& w, const Tensor& u, const RouterObserver& observer,
                 int64_t layer) {
  const int64_t T = u.dim(0), k = cfg.num_experts_per_tok;
  // The shared expert reads only u: begun first, so that a backend can run it beside the router and the routed
  // experts (the CUDA backend's "moe_shared" phase is then only its launch; moe_routed includes the join).
  ops.profile_phase("moe_shared");
  Tensor shared = ops.empty({T, cfg.hidden_size});
  ops.moe_shared_expert_start(u, w, shared);
  ops.profile_phase("moe_router");
  Tensor ids = ops.empty({T, k}, DType::I32), weights = ops.empty({T, k});
  ops.moe_router_topk(u, w.router, cfg.norm_topk_prob, ids, weights);
  if (observer) observer(layer, ids);
  Tensor out = ops.empty({T, cfg.hidden_size});
  ops.profile_phase("moe_routed");
  ops.moe_experts(u, ids, weights, w, out, shared);
  return out;
}

}  // namespace flashnext
