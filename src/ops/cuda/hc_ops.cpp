// The CUDA backend's hyper-connection ops: the gated residual read (two float32 GEMV launches in decode; in prefill
// on SM80+ four launches around two tensor-core products with FP16x2 activations in either precision, else norm,
// FP16x2 or FP16 products and the mix: three kernels around two cuBLAS products), the injection into every stream, and
// in decode and the tensor-core prefill the injection folded into the next read (hc_inject_read).
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>

#include "ops/contract/hc.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/hc_kernels.h"

namespace flashnext::cuda {

// The read in the backend's own kernels: decode (at most kGemvMaxTokens rows: float32 throughout, two launches, the
// per-stream partial dots of the down and inject rows, then the statistics, the up rows and the mix) or prefill on
// SM80+ (hc_kernels.h: four launches around two tensor-core products), the same arguments either way.
bool CudaOps::hc_read_fused(const Tensor& X, const Tensor& out, const Tensor& inj_prev, const HcWeights& hc, double eps,
                            const Tensor& u, const Tensor& inj) {
  static const bool prefill_off = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_HC_PREFILL");
    return v && std::strcmp(v, "cublas") == 0;
  }();
  const char* op = "hc_read";
  const int64_t H = u.dim(1), S = X.dim(1) / H;
  const int T = to_int(X.dim(0), op, "tokens"), R = to_int(hc.down.dim(0), op, "rank");
  const bool with_inject = hc.inject.defined(), decode = T <= detail::kGemvMaxTokens;
  const bool supported = decode
                             ? detail::hc_read_decode_supported(T, int(S), int(H), R)
                             : !prefill_off && detail::hc_read_prefill_supported(T, int(S), to_int(H, op, "hidden"), R);
  if (!supported || !aligned16(X) || !aligned16(hc.norm) || !aligned16(hc.down) || !aligned16(hc.up) ||
      (with_inject && !aligned16(hc.inject)) || !aligned16(u) || (out.defined() && !aligned16(out)))
    return false;
  const int64_t floats = decode ? detail::hc_read_decode_scratch(T, int(S), R, with_inject)
                                : detail::hc_read_prefill_scratch(T, int(S), int(H), R, with_inject);
  Tensor scratch = alloc({floats}, DType::F32, "hc_read scratch");
  const auto launch = decode ? detail::launch_hc_read_decode : detail::launch_hc_read_prefill;
  FN_CUDA_CHECK(launch(dp<float>(X), out.defined() ? dp<const float>(out) : nullptr,
                       out.defined() ? dp<const float>(inj_prev) : nullptr, dp<__half>(hc.norm), dp<__half>(hc.down),
                       dp<__half>(hc.up), with_inject ? dp<__half>(hc.inject) : nullptr, T, int(S), int(H), R,
                       float(eps), dp<float>(scratch), dp<float>(u), with_inject ? dp<float>(inj) : nullptr, stream()),
                out.defined() ? (decode ? "hc_inject_read decode" : "hc_inject_read prefill")
                              : (decode ? "hc_read decode" : "hc_read prefill"));
  return true;
}

void CudaOps::hc_inject_read(const Tensor& X, const Tensor& out, const Tensor& inj_prev, const HcWeights& hc,
                             double eps, const Tensor& u, const Tensor& inj) {
  contract::hc_inject(spec(), X, out, inj_prev);
  const auto dims = contract::hc_read(spec(), X, hc, u, inj);
  if (dims.tokens > 0 && hc_read_fused(X, out, inj_prev, hc, eps, u, inj)) return;
  Ops::hc_inject_read(X, out, inj_prev, hc, eps, u, inj);
}

void CudaOps::hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) {
  const char* op = "hc_read";
  const auto [T, S, H, R, with_inject] = contract::hc_read(spec(), X, hc, u, inj);
  const int64_t W = S * H;
  FN_CHECK(S <= detail::kHcMaxStreams, "hc_read: {} hyper-connection streams, the kernels take at most {}", S,
           detail::kHcMaxStreams);
  const int t = to_int(T, op, "tokens"), w = to_int(W, op, "width"), r = to_int(R, op, "rank");
  if (t == 0) return;
  if (hc_read_fused(X, Tensor(), Tensor(), hc, eps, u, inj)) return;
  if (split()) {  // float32 statistics and sums, products with FP16x2 inputs
    // n2 = [n_hi; n_lo] and a2 = [a_hi; a_lo] feed cuBLAS as 2T rows; the mix adds the output halves.
    Tensor n2 = alloc({2 * T, W}, DType::F16, "hc_read normed"), y2 = alloc({2 * T, R}, DType::F32, "hc_read down");
    Tensor a2 = alloc({2 * T, R}, DType::F16, "hc_read act"), m2 = alloc({2 * T, W}, DType::F32, "hc_read mix");
    FN_CUDA_CHECK(detail::launch_hc_norm_split(
                      dp<const float>(X), dp<__half>(hc.norm), with_inject ? dp<__half>(hc.inject) : nullptr,
                      dp<__half>(n2), with_inject ? dp<float>(inj) : nullptr, t, int(S), int(H), float(eps), stream()),
                  "hc_read norm");
    blas_.linear(dp<__half>(n2), 2 * t, w, dp<__half>(hc.down), r, y2.data(), OutType::F32, r, stream(),
                 "hc_read input_mix_weight_down");
    FN_CUDA_CHECK(detail::launch_hc_act_split(dp<const float>(y2), dp<__half>(a2), t, r, int(S), stream()),
                  "hc_read silu");
    blas_.linear(dp<__half>(a2), 2 * t, r, dp<__half>(hc.up), w, m2.data(), OutType::F32, w, stream(),
                 "hc_read input_mix_weight_up");
    FN_CUDA_CHECK(detail::launch_hc_mix_split(dp<const float>(m2), dp<const __half>(n2), dp<float>(u), t, int(S),
                                              int(H), stream()),
                  "hc_read mix");
    return;
  }
  Tensor n = alloc({T, W}, DType::F16, "hc_read normed"), d = alloc({T, R}, DType::F32, "hc_read down");
  Tensor a = alloc({T, R}, DType::F16, "hc_read act"), m = alloc({T, W}, DType::F16, "hc_read mix");
  FN_CUDA_CHECK(detail::launch_hc_norm(dp<float>(X), static_cast<const float*>(nullptr), nullptr, dp<__half>(hc.norm),
                                       with_inject ? dp<__half>(hc.inject) : nullptr, dp<__half>(n),
                                       with_inject ? dp<float>(inj) : nullptr, t, int(S), int(H), float(eps), stream()),
                "hc_read norm");
  blas_.linear(dp<__half>(n), t, w, dp<__half>(hc.down), r, d.data(), OutType::F32, r, stream(),
               "hc_read input_mix_weight_down");
  FN_CUDA_CHECK(detail::launch_hc_act(dp<float>(d), dp<__half>(a), t, r, int(S), stream()), "hc_read silu");
  blas_.linear(dp<__half>(a), t, r, dp<__half>(hc.up), w, m.data(), OutType::F16, w, stream(),
               "hc_read input_mix_weight_up");
  FN_CUDA_CHECK(detail::launch_hc_mix(dp<__half>(m), dp<__half>(n), dp<float>(u), t, int(S), int(H), stream()),
                "hc_read mix");
}

void CudaOps::hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) {
  const char* op = "hc_inject";
  const auto [T, S, H] = contract::hc_inject(spec(), X, out, inj);
  FN_CUDA_CHECK(
      detail::launch_hc_inject(dp<float>(X), dp<const float>(out), dp<const float>(inj), to_int(T, op, "tokens"),
                               to_int(S, op, "streams"), to_int(H, op, "hidden"), stream()),
      op);
}

}  // namespace flashnext::cuda
