// Contracts of the hyper-connection ops of ops/ops.h: hc_read, hc_inject.
#pragma once

#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// hc_read(X, hc, eps, u, inj): X [T, S*H], u [T, H] (S > 1 streams), hc_norm [S*H], down [R, S*H], up [S*H, R]
/// weights; with hc.inject [S, S*H] defined, inj [T, S].
struct HcReadDims {
  int64_t tokens, streams, hidden, rank;
  bool inject;
};
HcReadDims hc_read(const Backend& b, const Tensor& X, const HcWeights& hc, const Tensor& u, const Tensor& inj);

/// hc_inject(X, out, inj): X [T, S*H], out [T, H], inj [T, S].
struct HcInjectDims {
  int64_t tokens, streams, hidden;
};
HcInjectDims hc_inject(const Backend& b, const Tensor& X, const Tensor& out, const Tensor& inj);

}  // namespace flashnext::contract
