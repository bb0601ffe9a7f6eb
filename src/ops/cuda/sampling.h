// Sampling of the next token on the GPU from FP32 logits (lm_head output): greedy, temperature, top-k, top-p,
// min-p, per row. See SamplingParams (sampling_kernels.h) for the parameters and their neutral values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/sampling_kernels.h"

namespace flashnext::cuda {

/// tokens[r] = a token drawn for row r of logits [rows, vocab] (row stride ld) under params[r] (device array).
/// Filters apply in the order temperature, top-k, top-p (over the top-k survivors), min-p (p >= min_p * p_max);
/// the draw is an inverse-CDF walk in token order with a counter-based random number from (seed, offset).
void sample_tokens(const float* logits, int64_t ld, int rows, int vocab, const SamplingParams* params, int32_t* tokens,
                   cudaStream_t stream);

}  // namespace flashnext::cuda
