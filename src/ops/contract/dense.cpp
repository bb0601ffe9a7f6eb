// Contracts of the dense building blocks (dense.h).
#include "ops/contract/dense.h"

namespace flashnext::contract {

EmbeddingDims embedding(const Backend& b, const Tensor& table, const Tensor& ids, const Tensor& out) {
  weight(b, table, 2, "embedding", "table");
  tensor(b, ids, DType::I32, 1, "embedding", "ids");
  activation(b, out, 2, "embedding", "out");
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.dim(0);
  FN_CHECK(out.dim(0) == T && H > 0 && out.dim(1) % H == 0, "embedding: out {} does not fit table {} and {} ids",
           out.str(), table.str(), T);
  return {V, H, T, out.dim(1) / H};
}

LinearDims linear(const Backend& b, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias,
                  const char* op) {
  activation(b, x, 2, op, "x");
  linear_weight(b, w, op, "weight");
  activation(b, y, 2, op, "y");
  FN_CHECK(x.dim(1) == w.dim(1) && y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0),
           "{}: shapes do not match: x {}, weight {}, y {}", op, x.str(), w.str(), y.str());
  if (bias.defined()) {
    weight(b, bias, 1, op, "bias");
    FN_CHECK(bias.dim(0) == w.dim(0), "{}: bias {} does not fit weight {}", op, bias.str(), w.str());
  }
  return {x.dim(0), x.dim(1), w.dim(0)};
}

LinearDims linear_group(const Backend& b, const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                        std::span<const Tensor> bias) {
  const char* op = "linear_group";
  FN_CHECK(w.size() == y.size() && (bias.empty() || bias.size() == w.size()) && !w.empty(),
           "{}: {} weights, {} outputs and {} biases", op, w.size(), y.size(), bias.size());
  LinearDims d{x.rank() == 2 ? x.dim(0) : 0, x.rank() == 2 ? x.dim(1) : 0, 0};
  for (size_t i = 0; i < w.size(); ++i) d.out += linear(b, x, w[i], y[i], bias.empty() ? Tensor() : bias[i], op).out;
  return d;
}

NormDims zc_rms_norm(const Backend& b, const Tensor& x, const Tensor& w, int64_t group, const Tensor& y) {
  const char* op = "zc_rms_norm";
  activation(b, x, 2, op, "x");
  weight(b, w, -1, op, "weight");
  activation(b, y, 2, op, "y");
  const int64_t L = x.dim(1), W = w.numel();
  FN_CHECK(y.shape() == x.shape() && group > 0 && W > 0 && L % W == 0 && W % group == 0,
           "zc_rms_norm: x {}, weight {}, group {}, y {} do not fit", x.str(), w.str(), group, y.str());
  return {x.dim(0), L, W};
}

}  // namespace flashnext::contract
