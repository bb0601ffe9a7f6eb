#include "model/qwen4_exp/hyper_connection.h"

namespace flashnext {

HcRead gated_residual_read(Ops& ops, const Tensor& X, const HcWeights& hc, int64_t hidden, double eps) {
  const int64_t T = X.dim(0), S = X.dim(1) / hidden;
  HcRead r{ops.empty({T, hidden}), ops.empty({T, S})};
  ops.hc_read(X, hc, eps, r.u, r.inj);
  return r;
}

Tensor hyper_connection_mixer(Ops& ops, const Tensor& X, const HcWeights& mixer, int64_t hidden, double eps) {
  Tensor u = ops.empty({X.dim(0), hidden});
  ops.hc_read(X, mixer, eps, u, Tensor());
  return u;
}

void flush(Ops& ops, const Tensor& X, PendingInject& p) {
  if (p) ops.hc_inject(X, p.out, p.inj);
  p = {};
}

HcRead gated_residual_read(Ops& ops, const Tensor& X, PendingInject& p, const HcWeights& hc, int64_t hidden,
                           double eps) {
  if (!p) return gated_residual_read(ops, X, hc, hidden, eps);
  const int64_t T = X.dim(0), S = X.dim(1) / hidden;
  HcRead r{ops.empty({T, hidden}), ops.empty({T, S})};
  ops.hc_inject_read(X, p.out, p.inj, hc, eps, r.u, r.inj);
  p = {};
  return r;
}

Tensor hyper_connection_mixer(Ops& ops, const Tensor& X, PendingInject& p, const HcWeights& mixer, int64_t hidden,
                              double eps) {
  if (!p) return hyper_connection_mixer(ops, X, mixer, hidden, eps);
  Tensor u = ops.empty({X.dim(0), hidden});
  ops.hc_inject_read(X, p.out, p.inj, mixer, eps, u, Tensor());
  p = {};
  return u;
}

}  // namespace flashnext
