// Contracts of the Gated DeltaNet ops (gdn.h).
#include "ops/contract/gdn.h"

namespace flashnext::contract {

ConvDims gdn_conv(const Backend& b, const Tensor& qkv, const Tensor& weight, const Tensor& state, const char* op) {
  activation(b, qkv, 2, op, "qkv");
  contract::weight(b, weight, 2, op, "weight");
  activation(b, state, 2, op, "state");
  const int64_t T = qkv.dim(0), C = qkv.dim(1), K = weight.dim(1);
  FN_CHECK(weight.dim(0) == C && K >= 1 && state.dim(0) == K - 1 && state.dim(1) == C,
           "{}: qkv {}, weight {}, state {} do not fit", op, qkv.str(), weight.str(), state.str());
  return {T, C, K};
}

ConvDims gdn_conv_batch(const Backend& b, const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                        const StepBatch& batch) {
  const char* op = "gdn_conv_batch";
  activation(b, state_pool, 3, op, "state pool");
  step_rows(qkv, batch, op, "qkv");
  state_slots(state_pool, batch, op);
  return gdn_conv(b, qkv, weight, state_pool.rows(0, 1).view({state_pool.dim(1), state_pool.dim(2)}), op);
}

int64_t gdn_rule(const Backend& b, const char* op, const Tensor& qkv, const Tensor& a, const Tensor& bb,
                 const GdnWeights& w, const GdnDims& d, const Tensor& state, const Tensor& o) {
  activation(b, qkv, 2, op, "qkv");
  activation(b, a, 2, op, "a");
  activation(b, bb, 2, op, "b");
  weight(b, w.A_log, -1, op, "A_log");
  weight(b, w.dt_bias, -1, op, "dt_bias");
  activation(b, state, 3, op, "state");
  activation(b, o, 2, op, "o");
  const int64_t T = qkv.dim(0), nv = d.num_v_heads;
  FN_CHECK(d.num_k_heads > 0 && nv % d.num_k_heads == 0 && d.k_head_dim > 0 && d.v_head_dim > 0,
           "{}: bad head geometry nk={} nv={} dk={} dv={}", op, d.num_k_heads, nv, d.k_head_dim, d.v_head_dim);
  FN_CHECK(qkv.dim(1) == d.conv_dim() && a.dim(0) == T && a.dim(1) == nv && bb.shape() == a.shape() &&
               w.A_log.numel() == nv && w.dt_bias.numel() == nv && state.dim(0) == nv && state.dim(1) == d.k_head_dim &&
               state.dim(2) == d.v_head_dim && o.dim(0) == T && o.dim(1) == nv * d.v_head_dim,
           "{}: shapes do not fit: qkv {}, a {}, b {}, state {}, o {} (nk={} nv={} dk={} dv={})", op, qkv.str(),
           a.str(), bb.str(), state.str(), o.str(), d.num_k_heads, nv, d.k_head_dim, d.v_head_dim);
  return T;
}

int64_t gdn_rule_batch(const Backend& b, const Tensor& qkv, const Tensor& a, const Tensor& bb, const GdnWeights& w,
                       const GdnDims& dims, const Tensor& state_pool, const StepBatch& batch, const Tensor& o) {
  const char* op = "gdn_rule_batch";
  activation(b, state_pool, 4, op, "state pool");
  FN_CHECK(state_pool.dim(1) == dims.num_v_heads && state_pool.dim(2) == dims.k_head_dim &&
               state_pool.dim(3) == dims.v_head_dim,
           "{}: state pool {} is not [slots, {}, {}, {}]", op, state_pool.str(), dims.num_v_heads, dims.k_head_dim,
           dims.v_head_dim);
  step_rows(qkv, batch, op, "qkv");
  state_slots(state_pool, batch, op);
  // Shapes as for one sequence, slot 0's state standing for every slot.
  return gdn_rule(b, op, qkv, a, bb, w, dims,
                  state_pool.rows(0, 1).view({dims.num_v_heads, dims.k_head_dim, dims.v_head_dim}), o);
}

GatedNormDims gated_rms_norm(const Backend& b, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& y) {
  const char* op = "gated_rms_norm";
  activation(b, x, 2, op, "x");
  activation(b, z, 2, op, "z");
  weight(b, w, -1, op, "weight");
  activation(b, y, 2, op, "y");
  const int64_t L = x.dim(1), D = w.numel();
  FN_CHECK(D > 0 && L % D == 0 && z.shape() == x.shape() && y.shape() == x.shape(),
           "gated_rms_norm: x {}, z {}, weight {}, y {} do not fit", x.str(), z.str(), w.str(), y.str());
  return {x.dim(0), L / D, D};
}

}  // namespace flashnext::contract
