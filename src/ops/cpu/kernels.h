// Scalar/row kernels shared by the CPU ops (float32, matching the reference's float32 formulas).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace flashnext::cpu {

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
/// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

/// Dot product with 8 independent accumulators (vectorisable without -ffast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// y += alpha * x.
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

/// rsqrt(mean(x^2) + eps) in float32 (the sum is accumulated in double, closer to torch's pairwise sum).
inline float rms_scale(const float* x, int64_t n, float eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return 1.0f / std::sqrt(float(s / double(n)) + eps);
}

/// Zero-centred RMSNorm of one group: y = (x * rsqrt(mean(x^2) + eps)) * (1 + w). y may equal x.
inline void zc_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float r = rms_scale(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * r) * (1.0f + w[i]);
}

/// L2 normalisation as the reference's l2norm: x * rsqrt(sum(x^2) + 1e-6).
inline void l2norm(const float* x, int64_t n, float* y) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  const float r = 1.0f / std::sqrt(float(s) + 1e-6f);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
}

/// cos/sin tables of one position for NeoX RoPE over `rotary_dim` dims (half = rotary_dim / 2 frequencies):
/// inv_freq[i] = 1 / theta^(2i / rotary_dim) in float32, angle = float(pos) * inv_freq[i].
struct RopeTable {
  std::vector<float> inv_freq;
  RopeTable(int64_t rotary_dim, double theta) : inv_freq(static_cast<size_t>(rotary_dim / 2)) {
    const float base = float(theta);
    for (int64_t i = 0; i < rotary_dim / 2; ++i) {
      const float e = float(2 * i) / float(rotary_dim);
      inv_freq[size_t(i)] = 1.0f / std::pow(base, e);
    }
  }
  int64_t half() const { return int64_t(inv_freq.size()); }
  /// Rotates x[0 .. 2*half) in place for position `pos`: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
  void apply(float* x, int64_t pos) const {
    const int64_t h = half();
    for (int64_t i = 0; i < h; ++i) {
      const float ang = float(pos) * inv_freq[size_t(i)];
      const float c = std::cos(ang), s = std::sin(ang);
      const float x1 = x[i], x2 = x[i + h];
      x[i] = x1 * c - x2 * s;
      x[i + h] = x2 * c + x1 * s;
    }
  }
};

}  // namespace flashnext::cpu
