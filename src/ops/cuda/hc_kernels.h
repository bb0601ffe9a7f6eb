// Launchers for the hyper-connection kernels (hc_kernels.cu). No argument checks here: call through hc.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kHcMaxStreams = 8;

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_hc_norm(__half* x, const __half* y_prev, const float* w_prev, const __half* norm_w,
                           const __half* w_inject, __half* n_out, float* inject_out, int tokens, int streams,
                           int hidden, float eps, cudaStream_t stream);
cudaError_t launch_hc_act(const float* d, __half* a, int tokens, int rank, int streams, cudaStream_t stream);
cudaError_t launch_hc_mix(const __half* m, const __half* n, __half* u, int tokens, int streams, int hidden,
                          cudaStream_t stream);
cudaError_t launch_hc_inject(__half* x, const __half* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream);

// FP32-residual variants (the ops interface's float32 residual stream and mixer outputs); same kernels.
cudaError_t launch_hc_norm(float* x, const float* y_prev, const float* w_prev, const __half* norm_w,
                           const __half* w_inject, __half* n_out, float* inject_out, int tokens, int streams,
                           int hidden, float eps, cudaStream_t stream);
cudaError_t launch_hc_mix(const __half* m, const __half* n, float* u, int tokens, int streams, int hidden,
                          cudaStream_t stream);
cudaError_t launch_hc_inject(float* x, const float* y, const float* w, int tokens, int streams, int hidden,
                             cudaStream_t stream);

/// The FP16x2 read of the float32 residual (hc_ops.cpp, many tokens), three kernels around the two cuBLAS products.
/// hc_norm of x [tokens, S*H] FP32 into n2 [2 * tokens, S*H] FP16: rows 0..tokens-1 n_hi = fp16(n), then n_lo =
/// fp16(n - n_hi); inject_out [tokens, S] (if w_inject) from the float32 n.
cudaError_t launch_hc_norm_split(const float* x, const __half* norm_w, const __half* w_inject, __half* n2,
                                 float* inject_out, int tokens, int streams, int hidden, float eps,
                                 cudaStream_t stream);
/// y2 [2 * tokens, rank] FP32 (the down product over n2) -> a2 [2 * tokens, rank] FP16: the hi and lo halves of
/// silu((y2_hi + y2_lo) / S).
cudaError_t launch_hc_act_split(const float* y2, __half* a2, int tokens, int rank, int streams, cudaStream_t stream);
/// u [tokens, H] FP32 = mean over streams of sigmoid(m2_hi + m2_lo) * (n2_hi + n2_lo), m2 [2 * tokens, S*H] FP32 the
/// up product over a2 (16-byte aligned rows where H is a multiple of 4: vector loads).
cudaError_t launch_hc_mix_split(const float* m2, const __half* n2, float* u, int tokens, int streams, int hidden,
                                cudaStream_t stream);

/// The prefill read on the tensor cores (hc_kernels.cu "prefill read"): whether this device runs it (its kernels
/// compiled for compute capability 8.0+) for these sizes: streams 2 or 4, hidden and rank multiples of 64, the up
/// weights and the activations' halves (2 * tokens * rank) fewer than 2^31 values.
bool hc_read_prefill_supported(int tokens, int streams, int hidden, int rank);
/// Floats of scratch launch_hc_read_prefill needs on the current device: the down product's partial sums [splits,
/// tokens, rank (+ streams with inject rows)], its activations as FP16 halves [2, tokens, rank] and rstd [tokens,
/// streams].
int64_t hc_read_prefill_scratch(int tokens, int streams, int hidden, int rank, bool inject);
/// hc_read of X [tokens, streams * hidden] FP32 into u [tokens, hidden] and (with `inject`, the block_inject rows
/// [streams, streams * hidden]) inj [tokens, streams], FP16x2 activations on mma.sync; with add_out
/// [tokens, hidden] and add_inj [tokens, streams] (hc_inject_read) X' = X + add_inj * add_out is read and stored in
/// X. down [rank, S*H], up [S*H, rank], norm_w [S*H] FP16. Four launches. cudaErrorInvalidValue outside
/// hc_read_prefill_supported; every pointer and row 16-byte aligned.
cudaError_t launch_hc_read_prefill(float* X, const float* add_out, const float* add_inj, const __half* norm_w,
                                   const __half* down, const __half* up, const __half* inject, int tokens, int streams,
                                   int hidden, int rank, float eps, float* scratch, float* u, float* inj,
                                   cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
