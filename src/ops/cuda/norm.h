// RMSNorm variants of qwen4_exp on the GPU (MODEL.md "Two RMSNorm kinds"). FP16 tensors, FP32 statistics.
// All functions enqueue work on `stream` and return without waiting; they throw flashnext::Error for bad sizes and
// for a failed launch. Device pointers must stay valid until the stream has run the work.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashnext::cuda {

/// Grouped zero-centred RMSNorm: for each row and each consecutive group of `group` columns,
/// y = x * rsqrt(mean(x^2) + eps) * (1 + w[c % w_len]). `x` is [rows, width] with row stride ldx, `y` likewise with
/// ldy (may equal x: in place). `w_len` is `width` (one weight per column, e.g. HC hc_norm [S*H]) or `group` (one
/// weight vector shared by every group, e.g. q_norm per head). Requires width % group == 0 and group >= 1.
void zc_rmsnorm(const __half* x, int64_t ldx, __half* y, int64_t ldy, const __half* w, int w_len, int rows, int width,
                int group, float eps, cudaStream_t stream);

/// Per-head ZC-RMSNorm (weight w[dim]) followed by rotary embedding (rotate-half / NeoX pairing i <-> i + R/2,
/// inv_freq_i = 1 / theta^(2i/R)) on the first `rotary_dims` (R, even, <= dim) dimensions at position pos[t];
/// dimensions R..dim are only normalised. Used for QSA q/k (dim 256, R 64) and the indexer queries (dim 128).
/// x: element (t, h, i) at x[t*x_token_stride + h*x_head_stride + i]; y likewise (may alias x exactly).
/// pos: device int32 [tokens], logical positions.
void head_norm_rope(const __half* x, int64_t x_token_stride, int64_t x_head_stride, __half* y, int64_t y_token_stride,
                    int64_t y_head_stride, const __half* w, const int32_t* pos, int tokens, int heads, int dim,
                    int rotary_dims, float theta, float eps, cudaStream_t stream);

/// GDN output norm per head of `dim` values: y = w * (x * rsqrt(mean(x^2) + eps)) * sigmoid(z), plain (one-centred)
/// weight w[dim]. x, z, y are [tokens, heads*dim] with row strides ldx, ldz, ldy.
void gated_rmsnorm(const __half* x, int64_t ldx, const __half* z, int64_t ldz, __half* y, int64_t ldy, const __half* w,
                   int tokens, int heads, int dim, float eps, cudaStream_t stream);

}  // namespace flashnext::cuda
