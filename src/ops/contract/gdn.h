// Contracts of the Gated DeltaNet ops of ops/ops.h: gdn_conv_batch, gdn_rule_batch, gated_rms_norm, and their
// one-sequence forms (a sequence's rows with its state tensors, as the CPU oracle computes them).
#pragma once

#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// Causal conv of one sequence: qkv [T, C] F32, weight [C, K], state [K-1, C] F32.
struct ConvDims {
  int64_t tokens, channels, kernel;
};
ConvDims gdn_conv(const Backend& b, const Tensor& qkv, const Tensor& weight, const Tensor& state,
                  const char* op = "gdn_conv");
/// gdn_conv_batch: qkv [batch.num_tokens, C], state_pool [slots, K-1, C] F32, every slot of the batch in the pool.
ConvDims gdn_conv_batch(const Backend& b, const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                        const StepBatch& batch);

/// The delta rule of one sequence: qkv [T, conv_dim], a, b [T, nv], A_log / dt_bias [nv] weights, state
/// [nv, dk, dv] F32, o [T, nv*dv]; nv a multiple of nk. Returns T.
int64_t gdn_rule(const Backend& b, const char* op, const Tensor& qkv, const Tensor& a, const Tensor& bb,
                 const GdnWeights& w, const GdnDims& dims, const Tensor& state, const Tensor& o);
/// gdn_rule_batch: the same with state_pool [slots, nv, dk, dv] and the step's rows. Returns T.
int64_t gdn_rule_batch(const Backend& b, const Tensor& qkv, const Tensor& a, const Tensor& bb, const GdnWeights& w,
                       const GdnDims& dims, const Tensor& state_pool, const StepBatch& batch, const Tensor& o);

/// gated_rms_norm(x, z, w, eps, act, y): x, z, y [T, n*D], w [D] weight.
struct GatedNormDims {
  int64_t tokens, heads, dim;
};
GatedNormDims gated_rms_norm(const Backend& b, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& y);

}  // namespace flashnext::contract
