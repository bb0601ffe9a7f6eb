// Launcher for the embedding gather (embedding_kernels.cu). No argument checks here: call through embedding.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {
#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_embed(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens, int copies,
                         __half* out, int32_t* status, cudaStream_t stream);
#endif
}  // namespace flashnext::cuda::detail
