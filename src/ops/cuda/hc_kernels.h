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
#endif

}  // namespace flashnext::cuda::detail
