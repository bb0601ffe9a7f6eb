// Launchers of the random-weight fills (random_kernels.cu) for Ops::random_weight / random_experts: values from
// ops/random_uniform.h, so that the CUDA weights equal the CPU backend's before rounding to FP16. No argument checks
// here: the CUDA backend checks.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {
#ifndef __CUDACC_RTC__  // host launchers
/// out[i] = fp16(lo + (hi - lo) * random_uniform(seed, i)) for i < n.
cudaError_t launch_random_f16(__half* out, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
/// W4A16 codes [rows][wpr] (rows = experts * matrix rows): word w < valid_words of a row = 32 random bits (8 random
/// 4-bit codes), the padding words 0.
cudaError_t launch_random_w4_codes(uint32_t* codes, int64_t rows, int wpr, int valid_words, uint64_t seed,
                                   cudaStream_t stream);
/// out[i] = v for i < n (FP16 and F32 fills of the W4A16 scales and global scales).
cudaError_t launch_fill_f16(__half* out, int64_t n, float v, cudaStream_t stream);
cudaError_t launch_fill_f32(float* out, int64_t n, float v, cudaStream_t stream);
#endif
}  // namespace flashnext::cuda::detail
