// Contracts of the hyper-connection ops (hc.h).
#include "ops/contract/hc.h"

namespace flashnext::contract {

HcReadDims hc_read(const Backend& b, const Tensor& X, const HcWeights& hc, const Tensor& u, const Tensor& inj) {
  const char* op = "hc_read";
  activation(b, X, 2, op, "X");
  activation(b, u, 2, op, "u");
  weight(b, hc.norm, 1, op, "hc_norm");
  weight(b, hc.down, 2, op, "input_mix_weight_down");
  weight(b, hc.up, 2, op, "input_mix_weight_up");
  const int64_t T = X.dim(0), W = X.dim(1), H = u.dim(1);
  FN_CHECK(u.dim(0) == T && H > 0 && W % H == 0 && W / H > 1, "hc_read: X {} and u {} do not fit", X.str(), u.str());
  const int64_t S = W / H, R = hc.down.dim(0);
  FN_CHECK(hc.norm.dim(0) == W && hc.down.dim(1) == W && hc.up.dim(0) == W && hc.up.dim(1) == R,
           "hc_read: weights hc_norm {}, down {}, up {} do not fit X {}", hc.norm.str(), hc.down.str(), hc.up.str(),
           X.str());
  const bool with_inject = hc.inject.defined();
  if (with_inject) {
    weight(b, hc.inject, 2, op, "block_inject_weight");
    activation(b, inj, 2, op, "inj");
    FN_CHECK(hc.inject.dim(0) == S && hc.inject.dim(1) == W && inj.dim(0) == T && inj.dim(1) == S,
             "hc_read: block_inject_weight {} / inj {} do not fit X {}", hc.inject.str(), inj.str(), X.str());
  }
  return {T, S, H, R, with_inject};
}

HcInjectDims hc_inject(const Backend& b, const Tensor& X, const Tensor& out, const Tensor& inj) {
  const char* op = "hc_inject";
  activation(b, X, 2, op, "X");
  activation(b, out, 2, op, "out");
  activation(b, inj, 2, op, "inj");
  const int64_t T = X.dim(0), H = out.dim(1), S = inj.dim(1);
  FN_CHECK(out.dim(0) == T && inj.dim(0) == T && X.dim(1) == S * H, "hc_inject: X {}, out {}, inj {} do not fit",
           X.str(), out.str(), inj.str());
  return {T, S, H};
}

}  // namespace flashnext::contract
