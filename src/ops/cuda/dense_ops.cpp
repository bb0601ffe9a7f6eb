// The CUDA backend's dense building blocks: embedding, linear and linear_group (float32 decode GEMV for products of
// at most kGemvMaxTokens rows; above that cuBLAS FP16 tensor-core GEMMs with FP16x2 or FP16 inputs), zc_rms_norm.
#include <cuda_fp16.h>

#include "ops/contract/dense.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/norm_kernels.h"

namespace flashnext::cuda {

void CudaOps::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "embedding";
  const auto [V, H, T, replicas] = contract::embedding(spec(), table, ids, out);
  FN_CUDA_CHECK(detail::launch_embedding_f32(dp<__half>(table), V, to_int(H, op, "hidden"), dp<int32_t>(ids),
                                             to_int(T, op, "tokens"), int(replicas), dp<float>(out),
                                             status(kStatusEmbedding), stream()),
                op);
}

void CudaOps::linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias) {
  const char* op = "linear";
  contract::linear(spec(), x, w, y, bias);
  product(x, w, y, bias, op);
}

void CudaOps::linear_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                           std::span<const Tensor> bias) {
  const char* op = "linear_group";
  contract::linear_group(spec(), x, w, y, bias);
  if (x.dim(0) == 0 || gemv_group(x, w, y, bias, op)) return;
  for (size_t i = 0; i < w.size(); ++i) product(x, w[i], y[i], bias.empty() ? Tensor() : bias[i], op);
}

void CudaOps::zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) {
  const char* op = "zc_rms_norm";
  const auto [T, L, W] = contract::zc_rms_norm(spec(), x, w, group, y);
  FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(x), L, dp<float>(y), L, dp<__half>(w), to_int(W, op, "W"),
                                          to_int(T, op, "rows"), to_int(L, op, "width"), to_int(group, op, "group"),
                                          float(eps), stream()),
                op);
}

void CudaOps::product(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what,
                      bool float32_inputs) {
  const int64_t T = x.dim(0);
  const int in = to_int(x.dim(1), what, "in"), out = to_int(w.dim(0), what, "out");
  const __half* b = bias.defined() ? dp<__half>(bias) : nullptr;
  if (T == 0) return;
  // Decode-sized products: one float32 GEMV launch over the FP16 weights (as exact as FP16x2, read once).
  if (gemv_group(x, {&w, 1}, {&y, 1}, {&bias, 1}, what)) return;
  if (split() || float32_inputs) {
    const int m = to_int(2 * T, what, "rows");
    Tensor x2 = alloc({2 * T, in}, DType::F16, "fp16x2 activations"), y2 = alloc({2 * T, out}, DType::F32, "product");
    FN_CUDA_CHECK(detail::launch_split_f16x2(dp<const float>(x), dp<__half>(x2), T, in, stream()), what);
    blas_.linear(dp<__half>(x2), m, in, dp<__half>(w), out, y2.data(), OutType::F32, out, stream(), what);
    FN_CUDA_CHECK(detail::launch_sum_halves(dp<const float>(y2), dp<float>(y), T, out, b, stream()), what);
    return;
  }
  Tensor xh = half_copy(x, what);
  blas_.linear(dp<__half>(xh), to_int(T, what, "rows"), in, dp<__half>(w), out, y.data(), OutType::F32, out, stream(),
               what);
  if (b) FN_CUDA_CHECK(detail::launch_add_bias(dp<float>(y), b, T, out, stream()), what);
}

bool CudaOps::gemv_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                         std::span<const Tensor> bias, const char* what) {
  const int64_t T = x.dim(0), K = x.dim(1);
  if (T < 1 || T > detail::kGemvMaxTokens || K % 8 != 0 || !aligned16(x) || w.size() > size_t(detail::kGemvMaxSegments))
    return false;
  detail::GemvSegments seg{};
  int rows = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!aligned16(w[i])) return false;
    seg.w[i] = dp<__half>(w[i]);
    seg.bias[i] = i < bias.size() && bias[i].defined() ? dp<__half>(bias[i]) : nullptr;
    seg.y[i] = dp<float>(y[i]);
    seg.ldy[i] = y[i].dim(1);
    rows += to_int(w[i].dim(0), what, "out");
    seg.rows_end[i] = rows;
  }
  seg.count = int(w.size());
  FN_CUDA_CHECK(detail::launch_gemv_f16w_f32x(dp<const float>(x), K, int(K), seg, int(T), stream()), what);
  return true;
}

Tensor CudaOps::half_copy(const Tensor& x, const char* op) {
  Tensor h = alloc(x.shape(), DType::F16, "fp16 activations");
  FN_CUDA_CHECK(detail::launch_f32_to_f16(dp<const float>(x), dp<__half>(h), x.numel(), stream()), op);
  return h;
}

}  // namespace flashnext::cuda
