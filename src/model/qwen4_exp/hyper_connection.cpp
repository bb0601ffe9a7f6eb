#include "model/qwen4_exp/hyper_connection.h"

namespace flashnext {

HcRead gated_residual_read(Ops& ops, const Tensor& X, const HcWeights& hc, int64_t hidden, double eps) {
  const int64_t T = X.dim(0), S = X.dim(1) / hidden;
  HcRead r{ops.empty({T, hidden}), ops.empty({T, S})};
  ops.hc_read(X, hc, eps, r.u, r.inj);
  return r;
}

void inject(Ops& ops, const Tensor& X, const Tensor& out, const Tensor& inj) {
  ops.hc_inject(X, out, inj);
}

Tensor hyper_connection_mixer(Ops& ops, const Tensor& X, const HcWeights& mixer, int64_t hidden, double eps) {
  Tensor u = ops.empty({X.dim(0), hidden});
  ops.hc_read(X, mixer, eps, u, Tensor());
  return u;
}

}  // namespace flashnext
