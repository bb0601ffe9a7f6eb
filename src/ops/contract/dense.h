// Contracts of the dense building blocks of ops/ops.h: embedding, linear, linear_group, zc_rms_norm.
#pragma once

#include <cstdint>
#include <span>

#include "ops/contract/contract.h"

namespace flashnext::contract {

/// embedding(table, ids, out): table [V, H] weight, ids [T] I32, out [T, reps*H] F32.
struct EmbeddingDims {
  int64_t vocab, hidden, tokens, replicas;
};
EmbeddingDims embedding(const Backend& b, const Tensor& table, const Tensor& ids, const Tensor& out);

/// linear(x, w, y, bias): x [T, in], w [out, in] weight, y [T, out], bias [out] weight or undefined.
struct LinearDims {
  int64_t tokens, in, out;
};
LinearDims linear(const Backend& b, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias,
                  const char* op = "linear");

/// linear_group(x, w, y, bias): linear for every (w[i], y[i], bias[i]); at least one weight, bias empty or one
/// per weight. Returns the dims of x (out: the sum of the weights' rows).
LinearDims linear_group(const Backend& b, const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                        std::span<const Tensor> bias);

/// zc_rms_norm(x, w, group, eps, y): x, y [T, L], w [W] weight, L % W == 0, W % group == 0.
struct NormDims {
  int64_t tokens, width, weight;
};
NormDims zc_rms_norm(const Backend& b, const Tensor& x, const Tensor& w, int64_t group, const Tensor& y);

}  // namespace flashnext::contract
