// The CUDA backend's dense building blocks: embedding, linear and linear_group (float32 decode GEMV for products of
// at most kGemvMaxTokens rows; above that cuBLAS FP16 tensor-core GEMMs with FP16x2 or FP16 inputs; 8-bit weights,
// W8A16: a GEMV over the codes, or the codes as FP16 tiles for the tensor cores with the row scale after), zc_rms_norm.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdlib>

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
  const bool w8 = std::any_of(w.begin(), w.end(), [](const Tensor& wi) { return wi.has_scales(); });
  // The FP16x2 halves of x made once for the whole group (decode-sized groups the one launch did not take go weight
  // by weight, each to its own GEMV where it can).
  if (split() && !w8 && x.dim(0) > detail::kGemvMaxTokens) {
    const Tensor x2 = split_halves(x, op);
    for (size_t i = 0; i < w.size(); ++i) split_product(x2, w[i], y[i], bias.empty() ? Tensor() : bias[i], op);
    return;
  }
  for (size_t i = 0; i < w.size(); ++i) product(x, w[i], y[i], bias.empty() ? Tensor() : bias[i], op);
}

Tensor CudaOps::split_halves(const Tensor& x, const char* what) {
  const int64_t T = x.dim(0);
  Tensor x2 = alloc({2 * T, x.dim(1)}, DType::F16, "fp16x2 activations");
  FN_CUDA_CHECK(
      detail::launch_split_f16x2(dp<const float>(x), dp<__half>(x2), T, to_int(x.dim(1), what, "in"), stream()), what);
  return x2;
}

void CudaOps::split_product(const Tensor& x2, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what) {
  const int64_t T = x2.dim(0) / 2;
  const int t = to_int(T, what, "rows"), in = to_int(x2.dim(1), what, "in"), out = to_int(w.dim(0), what, "out");
  const __half* b = bias.defined() ? dp<__half>(bias) : nullptr;
  // FLASHNEXT_CUDA_SPLIT_ACCUMULATE_ROWS (read once) moves the threshold, for before/after measurements.
  static const int64_t accumulate_rows = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_SPLIT_ACCUMULATE_ROWS");
    return v ? std::max<int64_t>(1, std::atoll(v)) : kSplitAccumulateRows;
  }();
  if (T >= accumulate_rows) {
    // y = x_hi w^T, then y += x_lo w^T (cuBLAS's beta = 1: the sum of the halves' products, as the summing kernel's)
    blas_.linear(dp<__half>(x2), t, in, dp<__half>(w), out, y.data(), OutType::F32, out, stream(), what);
    blas_.linear(dp<__half>(x2) + T * in, t, in, dp<__half>(w), out, y.data(), OutType::F32, out, stream(), what, 1.f);
    if (b) FN_CUDA_CHECK(detail::launch_add_bias(dp<float>(y), b, T, out, stream()), what);
    return;
  }
  Tensor y2 = alloc({2 * T, out}, DType::F32, "product");
  blas_.linear(dp<__half>(x2), 2 * t, in, dp<__half>(w), out, y2.data(), OutType::F32, out, stream(), what);
  FN_CUDA_CHECK(detail::launch_sum_halves(dp<const float>(y2), dp<float>(y), T, out, b, stream()), what);
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
  if (w.has_scales()) return product_w8(x, w, y, bias, what, float32_inputs);
  // Decode-sized products: one float32 GEMV launch over the FP16 weights (as exact as FP16x2, read once).
  if (gemv_group(x, {&w, 1}, {&y, 1}, {&bias, 1}, what)) return;
  if (split() || float32_inputs) return split_product(split_halves(x, what), w, y, bias, what);
  Tensor xh = half_copy(x, what);
  blas_.linear(dp<__half>(xh), to_int(T, what, "rows"), in, dp<__half>(w), out, y.data(), OutType::F32, out, stream(),
               what);
  if (b) FN_CUDA_CHECK(detail::launch_add_bias(dp<float>(y), b, T, out, stream()), what);
}

void CudaOps::product_w8(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what,
                         bool float32_inputs) {
  const int64_t T = x.dim(0);
  // Up to kW8GemvMaxTokens rows: the 8-bit GEMV, kGemvMaxTokens rows a launch (each reads the codes once: at most 4
  // bytes a weight, against the 5 of a tile: write and read 2, read 1).
  const int64_t t1 = std::min<int64_t>(T, detail::kGemvMaxTokens);
  if (T <= kW8GemvMaxTokens && gemv_group(x.rows(0, t1), {&w, 1}, std::array{y.rows(0, t1)}, {&bias, 1}, what)) {
    for (int64_t t0 = t1; t0 < T; t0 += detail::kGemvMaxTokens) {
      const int64_t e = std::min<int64_t>(T, t0 + detail::kGemvMaxTokens);
      FN_CHECK(gemv_group(x.rows(t0, e), {&w, 1}, std::array{y.rows(t0, e)}, {&bias, 1}, what),
               "internal: {}: the 8-bit GEMV took rows 0..{} but not {}..{}", what, t1, t0, e);
    }
    return;
  }
  const int in = to_int(x.dim(1), what, "in"), out = to_int(w.dim(0), what, "out");
  const int group = to_int(std::min(w.scale_group(), x.dim(1)), what, "group");
  const int64_t G = w.scales().dim(1);
  const bool row_scale = group >= in, fp8 = w.dtype() == DType::F8_E4M3, halves = split() || float32_inputs;
  // The codes become FP16 tiles of at most about 8 MiB (exact for one scale a row, whose scale follows the product;
  // block scales go in before it, one rounding), each the weight of one tensor-core GEMM into its output columns,
  // in one buffer the backend keeps (grown to the largest tile asked for: steps do not take it from their arena).
  const int64_t tile = std::min<int64_t>(out, std::max<int64_t>(256, (int64_t(4) << 20) / in / 256 * 256));
  if (!w8_tile_.defined() || w8_tile_.numel() < tile * in) {
    ++memory_generation_;  // recorded steps that used the old one are stale
    w8_tile_ = alloc({tile * in}, DType::F16, "8-bit weight tile", Lifetime::Kept);
  }
  const Tensor& wt = w8_tile_;
  Tensor xin, y2;
  if (halves) {
    xin = alloc({2 * T, in}, DType::F16, "fp16x2 activations");
    y2 = alloc({2 * T, out}, DType::F32, "product");
    FN_CUDA_CHECK(detail::launch_split_f16x2(dp<const float>(x), dp<__half>(xin), T, in, stream()), what);
  } else {
    xin = half_copy(x, what);
  }
  const int m = to_int(halves ? 2 * T : T, what, "rows");
  float* dst = halves ? dp<float>(y2) : dp<float>(y);
  for (int64_t n0 = 0; n0 < out; n0 += tile) {
    const int nc = int(std::min<int64_t>(tile, out - n0));
    FN_CUDA_CHECK(detail::launch_w8_to_f16(dp<uint8_t>(w) + n0 * in, fp8, dp<float>(w.scales()) + n0 * G, group,
                                           !row_scale, nc, in, dp<__half>(wt), stream()),
                  what);
    blas_.linear(dp<__half>(xin), m, in, dp<__half>(wt), nc, dst + n0, OutType::F32, out, stream(), what);
  }
  if (halves)
    FN_CUDA_CHECK(detail::launch_sum_halves(dp<const float>(y2), dp<float>(y), T, out, nullptr, stream()), what);
  const __half* b = bias.defined() ? dp<__half>(bias) : nullptr;
  if (row_scale) {
    FN_CUDA_CHECK(detail::launch_scale_columns(dp<float>(y), T, out, out, dp<float>(w.scales()), b, stream()), what);
  } else if (b) {
    FN_CUDA_CHECK(detail::launch_add_bias(dp<float>(y), b, T, out, stream()), what);
  }
}

namespace {
/// The fields of a GEMV launch's segments that GemvSegments and GemvSegments8 share: segment i's bias, output, its row
/// stride, the rows up to it, and the count.
template <class Segments>
void fill_segments(Segments& seg, std::span<const Tensor> w, std::span<const Tensor> y, std::span<const Tensor> bias,
                   const char* what) {
  int rows = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    seg.bias[i] = i < bias.size() && bias[i].defined() ? dp<__half>(bias[i]) : nullptr;
    seg.y[i] = dp<float>(y[i]);
    seg.ldy[i] = y[i].dim(1);
    rows += to_int(w[i].dim(0), what, "out");
    seg.rows_end[i] = rows;
  }
  seg.count = int(w.size());
}
}  // namespace

bool CudaOps::gemv_group_w8(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                            std::span<const Tensor> bias, const char* what) {
  const int64_t T = x.dim(0), K = x.dim(1);
  if (K % 16 != 0) return false;
  detail::GemvSegments8 seg{};
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t group = w[i].scale_group();
    if (w[i].dtype() != w[0].dtype() || !aligned16(w[i]) || (group < K && group % 16 != 0)) return false;
    seg.w[i] = dp<uint8_t>(w[i]);
    seg.scale[i] = dp<float>(w[i].scales());
    seg.group[i] = int(std::min(group, K));
  }
  fill_segments(seg, w, y, bias, what);
  seg.fp8 = w[0].dtype() == DType::F8_E4M3;
  FN_CUDA_CHECK(detail::launch_gemv_w8_f32x(dp<const float>(x), K, int(K), seg, int(T), stream()), what);
  return true;
}

bool CudaOps::gemv_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                         std::span<const Tensor> bias, const char* what) {
  const int64_t T = x.dim(0), K = x.dim(1);
  if (T < 1 || T > detail::kGemvMaxTokens || !aligned16(x) || w.size() > size_t(detail::kGemvMaxSegments)) return false;
  // 8-bit weights: a launch of their own (all of the group 8-bit, of one code type); a mixed group goes weight by
  // weight.
  for (const Tensor& wi : w)
    if (wi.has_scales() != w[0].has_scales()) return false;
  if (w[0].has_scales()) return gemv_group_w8(x, w, y, bias, what);
  if (K % 8 != 0) return false;
  detail::GemvSegments seg{};
  for (size_t i = 0; i < w.size(); ++i) {
    if (!aligned16(w[i])) return false;
    seg.w[i] = dp<__half>(w[i]);
  }
  fill_segments(seg, w, y, bias, what);
  FN_CUDA_CHECK(detail::launch_gemv_f16w_f32x(dp<const float>(x), K, int(K), seg, int(T), stream()), what);
  return true;
}

Tensor CudaOps::half_copy(const Tensor& x, const char* op) {
  Tensor h = alloc(x.shape(), DType::F16, "fp16 activations");
  FN_CUDA_CHECK(detail::launch_f32_to_f16(dp<const float>(x), dp<__half>(h), x.numel(), stream()), op);
  return h;
}

}  // namespace flashnext::cuda
