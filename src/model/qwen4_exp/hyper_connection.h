// Hyper-connections (docs MODEL.md "Hyper-connection (gated residual) read"; reference
// `Qwen4ExpTextGatedResidual`): the S-stream wide residual X [T, S*H] is read into one mixer input u [T, H] with
// per-stream injection weights, and the mixer output is injected back into every stream.
#pragma once

#include "ops/ops.h"

namespace flashnext {

/// Result of a gated residual read.
struct HcRead {
  Tensor u;    ///< [T, H] mixer input
  Tensor inj;  ///< [T, S] injection weights 2*sigmoid(W_inject N / S)
};

/// u, inj = GatedResidualRead(X): N = grouped ZC-RMSNorm(X), m = sigmoid(W_up silu(W_down N / S)),
/// u = mean_b(m_b * N_b), inj = 2 sigmoid(W_inject N / S).
HcRead gated_residual_read(Ops& ops, const Tensor& X, const HcWeights& hc, int64_t hidden, double eps);

/// The final hyper_connection_mixer: only u of the gated residual read (no injection weights).
Tensor hyper_connection_mixer(Ops& ops, const Tensor& X, const HcWeights& mixer, int64_t hidden, double eps);

/// A sublayer's output not yet injected into X: the model hands it to the next read (Ops::hc_inject_read, one pass
/// over X where the backend fuses them) or injects it where X itself is needed next (PLE, a hidden-state hook).
struct PendingInject {
  Tensor out;  ///< [T, H] sublayer output
  Tensor inj;  ///< [T, S] its injection weights
  explicit operator bool() const { return out.defined(); }
};

/// X = X + p.inj ⊗ p.out (stream b of every token gets inj[b] * out) if p holds an output; p is empty afterwards.
void flush(Ops& ops, const Tensor& X, PendingInject& p);

/// gated_residual_read of X + p (p injected first, in the same op); p is empty afterwards.
HcRead gated_residual_read(Ops& ops, const Tensor& X, PendingInject& p, const HcWeights& hc, int64_t hidden,
                           double eps);

/// hyper_connection_mixer of X + p (p injected first, in the same op); p is empty afterwards.
Tensor hyper_connection_mixer(Ops& ops, const Tensor& X, PendingInject& p, const HcWeights& mixer, int64_t hidden,
                              double eps);

}  // namespace flashnext
