// Helpers for the CUDA kernel tests: deterministic random inputs rounded to FP16, device round trips, and a
// tolerance check |gpu - ref| <= atol + rtol * |ref| against float32 CPU references written in each test.
#pragma once

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/cuda/buffer.h"

namespace flashnext::cuda::test {

/// Uniform values in [lo, hi), rounded to FP16 (the returned floats are exactly the FP16 values).
inline std::vector<float> rand_f16_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = __half2float(__float2half_rn(d(rng)));
  return v;
}

inline std::vector<__half> to_half(const std::vector<float>& v) {
  std::vector<__half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half_rn(v[i]);
  return h;
}

inline std::vector<float> to_float(const std::vector<__half>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = __half2float(v[i]);
  return f;
}

/// Device copy of FP16-rounded values.
inline DeviceArray<__half> dev_half(const std::vector<float>& v) {
  return to_device(to_half(v), "test input");
}

inline std::vector<float> host_half(const __half* d, size_t n) {
  return to_float(download(d, n));
}

/// Expects every element within atol + rtol*|ref|; reports the worst element.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t worst = 0, bad = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double ratio = err == 0 ? 0.0 : err / (atol + rtol * std::fabs(double(ref[i])));
    if (!(ratio <= 1.0)) ++bad;  // also counts NaN
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements outside atol " << atol << " rtol "
                     << rtol << "; worst at " << worst << ": got " << got[worst] << ", want " << ref[worst];
}

inline void sync() {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
}

inline float sigmoid(float x) {
  return 1.f / (1.f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.f + std::exp(-x));
}

/// Reference rotary for pair i at position p (float32 as the reference computes cos/sin).
inline void rope_cs(int i, int rotary_dims, float theta, int64_t p, float* c, float* s) {
  float inv = 1.f / std::pow(theta, float(2 * i) / float(rotary_dims));
  float ang = inv * float(p);
  *c = std::cos(ang);
  *s = std::sin(ang);
}

}  // namespace flashnext::cuda::test
