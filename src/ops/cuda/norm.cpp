#include "ops/cuda/norm.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/norm_kernels.h"

namespace flashnext::cuda {

void zc_rmsnorm(const __half* x, int64_t ldx, __half* y, int64_t ldy, const __half* w, int w_len, int rows, int width,
                int group, float eps, cudaStream_t stream) {
  FN_CHECK(rows >= 0 && width >= 1 && group >= 1 && width % group == 0,
           "zc_rmsnorm: width {} must be a positive multiple of the group size {} (rows {})", width, group, rows);
  FN_CHECK(w_len == width || w_len == group, "zc_rmsnorm: weight length {} must be the width {} or the group {}", w_len,
           width, group);
  FN_CHECK(ldx >= width && ldy >= width, "zc_rmsnorm: row strides {} / {} are below the width {}", ldx, ldy, width);
  FN_CHECK(x && y && w, "zc_rmsnorm: null pointer");
  FN_CUDA_CHECK(detail::launch_zc_rmsnorm(x, ldx, y, ldy, w, w_len, rows, width, group, eps, stream), "zc_rmsnorm");
}

void head_norm_rope(const __half* x, int64_t xts, int64_t xhs, __half* y, int64_t yts, int64_t yhs, const __half* w,
                    const int32_t* pos, int tokens, int heads, int dim, int rotary_dims, float theta, float eps,
                    cudaStream_t stream) {
  FN_CHECK(tokens >= 0 && heads >= 1 && dim >= 1, "head_norm_rope: bad shape tokens={} heads={} dim={}", tokens, heads,
           dim);
  FN_CHECK(rotary_dims >= 0 && rotary_dims % 2 == 0 && rotary_dims <= dim,
           "head_norm_rope: rotary dims {} must be even and at most the head dim {}", rotary_dims, dim);
  FN_CHECK(theta > 0.f, "head_norm_rope: rope theta {} must be positive", theta);
  FN_CHECK(x && y && w && pos, "head_norm_rope: null pointer");
  FN_CUDA_CHECK(detail::launch_head_norm_rope(x, xts, xhs, y, yts, yhs, w, pos, tokens, heads, dim, rotary_dims, theta,
                                              eps, stream),
                "head_norm_rope");
}

void gated_rmsnorm(const __half* x, int64_t ldx, const __half* z, int64_t ldz, __half* y, int64_t ldy, const __half* w,
                   int tokens, int heads, int dim, float eps, cudaStream_t stream) {
  FN_CHECK(tokens >= 0 && heads >= 1 && dim >= 1, "gated_rmsnorm: bad shape tokens={} heads={} dim={}", tokens, heads,
           dim);
  const int64_t width = int64_t(heads) * dim;
  FN_CHECK(ldx >= width && ldz >= width && ldy >= width, "gated_rmsnorm: row strides below the width {}", width);
  FN_CHECK(x && z && y && w, "gated_rmsnorm: null pointer");
  FN_CUDA_CHECK(detail::launch_gated_rmsnorm(x, ldx, z, ldz, y, ldy, w, tokens, heads, dim, eps, stream),
                "gated_rmsnorm");
}

}  // namespace flashnext::cuda
