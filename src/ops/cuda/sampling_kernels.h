// Launchers and the per-row parameter record of the sampling kernels (sampling_kernels.cu).
#pragma once

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda {

/// Sampling parameters of one row (one sequence's next token): the kernels' copy of ops.h TokenSampling (kernel
/// sources do not include the ops interface; sampling_ops.cpp asserts the two layouts equal). temperature <= 0 means greedy (argmax, lowest index
/// among equal maxima). top_k <= 0 or >= vocab disables top-k; top_p >= 1 disables top-p; min_p <= 0 disables
/// min-p. seed and offset select the random number (counter-based: the same seed and offset give the same token).
struct TokenSamplingRow {
  float temperature = 1.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

namespace detail {
#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_sample(const float* logits, int64_t ld, int rows, int vocab, const TokenSamplingRow* params,
                          int32_t* tokens, cudaStream_t stream);
#endif
}  // namespace detail

}  // namespace flashnext::cuda
