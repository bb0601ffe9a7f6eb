#include "ops/cuda/gdn.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gdn_kernels.h"

namespace flashnext::cuda {

namespace {
void check_conv(const char* op, const __half* x, int64_t ldx, __half* state, const int32_t* slots, const __half* w,
                __half* y, int64_t ldy, int channels, int kernel) {
  FN_CHECK(channels >= 1, "{}: {} channels", op, channels);
  FN_CHECK(kernel >= 1 && kernel <= detail::kGdnMaxKernel, "{}: conv kernel width {} is outside 1..{}", op, kernel,
           detail::kGdnMaxKernel);
  FN_CHECK(ldx >= channels && ldy >= channels, "{}: row strides {} / {} are below the {} channels", op, ldx, ldy,
           channels);
  FN_CHECK(x && w && y && slots && (state || kernel == 1), "{}: null pointer", op);
}

detail::GdnDims check_dims(const char* op, const GdnDims& d, int64_t ld_qkv, int64_t ld_ab, int64_t ld_out) {
  FN_CHECK(d.nk >= 1 && d.nv >= 1 && d.nv % d.nk == 0, "{}: value heads {} must be a multiple of key heads {}", op,
           d.nv, d.nk);
  FN_CHECK(d.dk >= 1 && d.dk <= detail::kGdnMaxDk && d.dv >= 1, "{}: head dims dk {} (1..{}) / dv {}", op, d.dk,
           detail::kGdnMaxDk, d.dv);
  FN_CHECK(ld_qkv >= d.conv_channels() && ld_ab >= d.nv && ld_out >= int64_t(d.nv) * d.dv,
           "{}: row strides qkv {} / ab {} / out {} below the widths {} / {} / {}", op, ld_qkv, ld_ab, ld_out,
           d.conv_channels(), d.nv, d.nv * d.dv);
  return {d.nk, d.nv, d.dk, d.dv};
}
}  // namespace

void gdn_conv_prefill(const __half* x, int64_t ldx, const int32_t* cu_seqlens, int num_seqs, int total_tokens,
                      __half* conv_state, const int32_t* slots, const __half* w, __half* y, int64_t ldy, int channels,
                      int kernel, cudaStream_t stream) {
  check_conv("gdn_conv_prefill", x, ldx, conv_state, slots, w, y, ldy, channels, kernel);
  FN_CHECK(num_seqs >= 0 && total_tokens >= 0 && cu_seqlens, "gdn_conv_prefill: bad batch ({} sequences, {} tokens)",
           num_seqs, total_tokens);
  FN_CHECK(static_cast<const void*>(x) != static_cast<const void*>(y), "gdn_conv_prefill: y must not alias x");
  FN_CUDA_CHECK(detail::launch_gdn_conv_prefill(x, ldx, cu_seqlens, num_seqs, total_tokens, conv_state, slots, w, y,
                                                ldy, channels, kernel, stream),
                "gdn_conv_prefill");
}

void gdn_conv_update(const __half* x, int64_t ldx, int batch, __half* conv_state, const int32_t* slots, const __half* w,
                     __half* y, int64_t ldy, int channels, int kernel, cudaStream_t stream) {
  check_conv("gdn_conv_update", x, ldx, conv_state, slots, w, y, ldy, channels, kernel);
  FN_CHECK(batch >= 0, "gdn_conv_update: batch {}", batch);
  FN_CUDA_CHECK(detail::launch_gdn_conv_update(x, ldx, batch, conv_state, slots, w, y, ldy, channels, kernel, stream),
                "gdn_conv_update");
}

void gdn_recurrent_step(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b, int64_t ld_ab,
                        const float* a_log, const float* dt_bias, float* state, const int32_t* slots, int batch,
                        const GdnDims& dims, __half* out, int64_t ld_out, cudaStream_t stream) {
  auto d = check_dims("gdn_recurrent_step", dims, ld_qkv, ld_ab, ld_out);
  FN_CHECK(batch >= 0, "gdn_recurrent_step: batch {}", batch);
  FN_CHECK(qkv && a && b && a_log && dt_bias && state && slots && out, "gdn_recurrent_step: null pointer");
  FN_CUDA_CHECK(detail::launch_gdn_recurrent_step(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, batch, d, out,
                                                  ld_out, stream),
                "gdn_recurrent_step");
}

void gdn_chunked_prefill(const __half* qkv, int64_t ld_qkv, const __half* a, const __half* b, int64_t ld_ab,
                         const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                         const int32_t* cu_seqlens, int num_seqs, const GdnDims& dims, __half* out, int64_t ld_out,
                         cudaStream_t stream) {
  auto d = check_dims("gdn_chunked_prefill", dims, ld_qkv, ld_ab, ld_out);
  FN_CHECK(num_seqs >= 0, "gdn_chunked_prefill: {} sequences", num_seqs);
  FN_CHECK(qkv && a && b && a_log && dt_bias && state && slots && cu_seqlens && out,
           "gdn_chunked_prefill: null pointer");
  FN_CUDA_CHECK(detail::launch_gdn_chunked_prefill(qkv, ld_qkv, a, b, ld_ab, a_log, dt_bias, state, slots, cu_seqlens,
                                                   num_seqs, d, out, ld_out, stream),
                "gdn_chunked_prefill");
}

}  // namespace flashnext::cuda
