// Contracts of the MoE ops (moe.h).
#include "ops/contract/moe.h"

namespace flashnext::contract {

RouterDims moe_router_topk(const Backend& b, const Tensor& u, const Tensor& router, const Tensor& ids,
                           const Tensor& weights) {
  const char* op = "moe_router_topk";
  activation(b, u, 2, op, "u");
  weight(b, router, 2, op, "router");
  tensor(b, ids, DType::I32, 2, op, "ids");
  activation(b, weights, 2, op, "weights");
  const int64_t T = u.dim(0), H = u.dim(1), E = router.dim(0), k = ids.dim(1);
  FN_CHECK(router.dim(1) == H && ids.dim(0) == T && weights.shape() == ids.shape() && k >= 1 && k <= E,
           "{}: u {}, router {}, ids {}, weights {} do not fit", op, u.str(), router.str(), ids.str(), weights.str());
  return {T, H, E, k};
}

ExpertsDims moe_experts(const Backend& b, const Tensor& u, const Tensor& ids, const Tensor& weights,
                        const MoeWeights& w, const Tensor& out, const Tensor& shared) {
  const char* op = "moe_experts";
  activation(b, u, 2, op, "u");
  tensor(b, ids, DType::I32, 2, op, "ids");
  activation(b, weights, 2, op, "weights");
  activation(b, out, 2, op, "out");
  const int64_t T = u.dim(0), H = u.dim(1), k = ids.dim(1);
  FN_CHECK(ids.dim(0) == T && weights.shape() == ids.shape() && out.shape() == u.shape() && k >= 1,
           "{}: u {}, ids {}, weights {}, out {} do not fit", op, u.str(), ids.str(), weights.str(), out.str());
  if (shared.defined()) {
    activation(b, shared, 2, op, "shared");
    FN_CHECK(shared.shape() == u.shape() && shared.data() != out.data(),
             "{}: shared {} does not fit u {} (or is out itself)", op, shared.str(), u.str());
  }
  if (w.packed) return {T, H, k, 0, 0};
  weight(b, w.gate, 3, op, "experts gate_proj");
  weight(b, w.up, 3, op, "experts up_proj");
  weight(b, w.down, 3, op, "experts down_proj");
  const int64_t E = w.gate.dim(0), I = w.gate.dim(1);
  FN_CHECK(w.gate.dim(2) == H && w.up.shape() == w.gate.shape() && w.down.dim(0) == E && w.down.dim(1) == H &&
               w.down.dim(2) == I && E >= 1,
           "{}: expert weights gate {}, up {}, down {} do not fit u {}", op, w.gate.str(), w.up.str(), w.down.str(),
           u.str());
  return {T, H, k, E, I};
}

SharedExpertDims moe_shared_expert(const Backend& b, const Tensor& u, const MoeWeights& w, const Tensor& out) {
  const char* op = "moe_shared_expert";
  activation(b, u, 2, op, "u");
  linear_weight(b, w.shared_gate_proj, op, "shared_expert.gate_proj");
  linear_weight(b, w.shared_up_proj, op, "shared_expert.up_proj");
  linear_weight(b, w.shared_down_proj, op, "shared_expert.down_proj");
  weight(b, w.shared_expert_gate, 2, op, "shared_expert_gate");
  activation(b, out, 2, op, "out");
  const int64_t T = u.dim(0), H = u.dim(1), Is = w.shared_gate_proj.dim(0);
  FN_CHECK(w.shared_gate_proj.dim(1) == H && w.shared_up_proj.shape() == w.shared_gate_proj.shape() &&
               w.shared_down_proj.dim(0) == H && w.shared_down_proj.dim(1) == Is && w.shared_expert_gate.dim(0) == 1 &&
               w.shared_expert_gate.dim(1) == H && out.shape() == u.shape(),
           "{}: u {}, shared expert gate {} / up {} / down {} / gate {}, out {} do not fit", op, u.str(),
           w.shared_gate_proj.str(), w.shared_up_proj.str(), w.shared_down_proj.str(), w.shared_expert_gate.str(),
           out.str());
  return {T, H, Is};
}

}  // namespace flashnext::contract
