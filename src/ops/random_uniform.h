// Counter-based pseudo-random numbers for random-weight models (`flashnext bench`, Model::random): element i of a
// tensor filled with seed s gets u(s, i) in [0, 1), the same on the CPU and in CUDA kernels, so that a model made
// with the same seed holds the same values on every backend (up to the backend's rounding to its weight dtype).
// u(s, i) = top 24 bits of splitmix64(s + (i + 1) * 0x9E3779B97F4A7C15) / 2^24 (SplitMix64 finaliser: Steele et
// al., "Fast splittable pseudorandom number generators", 2014). Included by kernel sources: no host-only headers.
#pragma once

#include "ops/cuda/cuda_stdint.h"

#if defined(__CUDACC__)
#define FN_HOST_DEVICE __host__ __device__
#else
#define FN_HOST_DEVICE
#endif

namespace flashnext {

/// 64 random bits for counter `i` of stream `seed`.
FN_HOST_DEVICE inline uint64_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// u(seed, i) in [0, 1), a multiple of 2^-24 (exact in float32).
FN_HOST_DEVICE inline float random_uniform(uint64_t seed, uint64_t i) {
  return float(random_bits(seed, i) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace flashnext
