// Norm and hyper-connection kernels against float32 CPU loops written from MODEL.md.
// Tolerances (FP16 outputs, FP32 statistics): norms atol 2e-3 rtol 4e-3 (one FP16 rounding of the output plus
// FP16-rounded inputs); hc_read u atol 1e-2 rtol 1e-2 and inject weights atol 2e-3 (the kernel rounds N, the
// low-rank activations and the mix logits to FP16 as the reference's bf16 path does; the CPU loop does not).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/norm.h"

namespace flashnext::cuda::test {
namespace {

// y = x * rsqrt(mean(x^2) + eps) * (1 + w) per group.
std::vector<float> ref_zc_norm(const std::vector<float>& x, const std::vector<float>& w, int rows, int width, int group,
                               float eps) {
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r)
    for (int g0 = 0; g0 < width; g0 += group) {
      double ss = 0;
      for (int i = 0; i < group; ++i) ss += double(x[r * width + g0 + i]) * x[r * width + g0 + i];
      float rs = 1.f / std::sqrt(float(ss / group) + eps);
      for (int i = 0; i < group; ++i) {
        int c = g0 + i;
        y[r * width + c] = x[r * width + c] * rs * (1.f + w[c % w.size()]);
      }
    }
  return y;
}

struct NormCase {
  int rows, width, group;
  bool per_column_weight;
};

class ZcNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(ZcNorm, MatchesReference) {
  const auto p = GetParam();
  const int wlen = p.per_column_weight ? p.width : p.group;
  auto x = rand_f16_values(size_t(p.rows) * p.width, 1, -3.f, 3.f);
  auto w = rand_f16_values(wlen, 2, -0.5f, 0.5f);
  auto dx = dev_half(x);
  auto dw = dev_half(w);
  DeviceArray<__half> dy(x.size(), "y");
  zc_rmsnorm(dx.get(), p.width, dy.get(), p.width, dw.get(), wlen, p.rows, p.width, p.group, 1e-6f, nullptr);
  sync();
  expect_close(host_half(dy.get(), x.size()), ref_zc_norm(x, w, p.rows, p.width, p.group, 1e-6f), 2e-3f, 4e-3f,
               "zc_rmsnorm");
  // In place gives the same.
  zc_rmsnorm(dx.get(), p.width, dx.get(), p.width, dw.get(), wlen, p.rows, p.width, p.group, 1e-6f, nullptr);
  sync();
  expect_close(host_half(dx.get(), x.size()), host_half(dy.get(), x.size()), 0.f, 0.f, "zc_rmsnorm in place");
}

INSTANTIATE_TEST_SUITE_P(Shapes, ZcNorm,
                         ::testing::Values(NormCase{1, 1, 1, true}, NormCase{3, 10240, 2560, true},
                                           NormCase{5, 640 * 4, 640, true}, NormCase{7, 24 * 256, 256, false},
                                           NormCase{2, 33, 11, true}, NormCase{4, 128, 128, false}));

TEST(ZcNorm, RejectsBadShapes) {
  EXPECT_THROW(zc_rmsnorm(nullptr, 10, nullptr, 10, nullptr, 10, 1, 10, 3, 1e-6f, nullptr), Error);
  DeviceArray<__half> d(16, "d");
  EXPECT_THROW(zc_rmsnorm(d.get(), 8, d.get(), 8, d.get(), 5, 1, 8, 4, 1e-6f, nullptr), Error);
}

TEST(HeadNormRope, MatchesReference) {
  // QSA q in the interleaved q_proj layout [T, nh, 2D] (q then gate per head), written contiguous [T, nh, D].
  for (auto [tokens, heads, dim, rot] :
       std::vector<std::array<int, 4>>{{3, 24, 256, 64}, {5, 4, 128, 64}, {2, 1, 8, 8}, {1, 3, 6, 0}}) {
    const float theta = 1e7f;
    auto x = rand_f16_values(size_t(tokens) * heads * 2 * dim, 3, -2.f, 2.f);
    auto w = rand_f16_values(dim, 4, -0.3f, 0.3f);
    std::vector<int32_t> pos(tokens);
    for (int t = 0; t < tokens; ++t) pos[t] = t * 977 + (t == 2 ? 200000 : 5);
    auto dx = dev_half(x);
    auto dw = dev_half(w);
    auto dpos = to_device(pos);
    DeviceArray<__half> dy(size_t(tokens) * heads * dim, "y");
    head_norm_rope(dx.get(), int64_t(heads) * 2 * dim, 2 * dim, dy.get(), int64_t(heads) * dim, dim, dw.get(),
                   dpos.get(), tokens, heads, dim, rot, theta, 1e-6f, nullptr);
    sync();
    std::vector<float> ref(size_t(tokens) * heads * dim);
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        const float* xr = &x[(size_t(t) * heads + h) * 2 * dim];
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
        float rs = 1.f / std::sqrt(float(ss / dim) + 1e-6f);
        std::vector<float> n(dim);
        for (int i = 0; i < dim; ++i) n[i] = xr[i] * rs * (1.f + w[i]);
        float* out = &ref[(size_t(t) * heads + h) * dim];
        for (int i = 0; i < dim; ++i) out[i] = n[i];
        for (int i = 0; i < rot / 2; ++i) {
          float c, s;
          rope_cs(i, rot, theta, pos[t], &c, &s);
          out[i] = n[i] * c - n[i + rot / 2] * s;
          out[i + rot / 2] = n[i + rot / 2] * c + n[i] * s;
        }
      }
    expect_close(host_half(dy.get(), ref.size()), ref, 3e-3f, 4e-3f, "head_norm_rope dim " + std::to_string(dim));
  }
}

TEST(GatedRmsNorm, MatchesReference) {
  for (auto [tokens, heads, dim] : std::vector<std::array<int, 3>>{{3, 48, 128}, {1, 12, 128}, {4, 1, 1}, {2, 5, 7}}) {
    const size_t n = size_t(tokens) * heads * dim;
    auto x = rand_f16_values(n, 5, -2.f, 2.f), z = rand_f16_values(n, 6, -4.f, 4.f);
    auto w = rand_f16_values(dim, 7, 0.5f, 1.5f);
    auto dx = dev_half(x), dz = dev_half(z), dw = dev_half(w);
    DeviceArray<__half> dy(n, "y");
    gated_rmsnorm(dx.get(), heads * dim, dz.get(), heads * dim, dy.get(), heads * dim, dw.get(), tokens, heads, dim,
                  1e-6f, nullptr);
    sync();
    std::vector<float> ref(n);
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        size_t o = (size_t(t) * heads + h) * dim;
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(x[o + i]) * x[o + i];
        float rs = 1.f / std::sqrt(float(ss / dim) + 1e-6f);
        for (int i = 0; i < dim; ++i) ref[o + i] = w[i] * (x[o + i] * rs) * sigmoid(z[o + i]);
      }
    expect_close(host_half(dy.get(), n), ref, 2e-3f, 4e-3f, "gated_rmsnorm");
  }
}

// MODEL.md hyper-connection read, float32 throughout.
void ref_hc_read(const std::vector<float>& X, const std::vector<float>& nw, const std::vector<float>& wd,
                 const std::vector<float>& wu, const std::vector<float>* wi, int T, int S, int H, int R,
                 std::vector<float>& u, std::vector<float>& winj) {
  const int W = S * H;
  u.assign(size_t(T) * H, 0.f);
  winj.assign(size_t(T) * S, 0.f);
  for (int t = 0; t < T; ++t) {
    std::vector<float> x(X.begin() + size_t(t) * W, X.begin() + size_t(t + 1) * W);
    auto N = ref_zc_norm(x, nw, 1, W, H, 1e-6f);
    std::vector<float> a(R), m(W);
    for (int r = 0; r < R; ++r) {
      double d = 0;
      for (int c = 0; c < W; ++c) d += double(wd[size_t(r) * W + c]) * N[c];
      a[r] = silu(float(d) / S);
    }
    for (int c = 0; c < W; ++c) {
      double d = 0;
      for (int r = 0; r < R; ++r) d += double(wu[size_t(c) * R + r]) * a[r];
      m[c] = sigmoid(float(d));
    }
    for (int i = 0; i < H; ++i) {
      float acc = 0;
      for (int b = 0; b < S; ++b) acc += m[b * H + i] * N[b * H + i];
      u[size_t(t) * H + i] = acc / S;
    }
    if (wi)
      for (int s = 0; s < S; ++s) {
        double d = 0;
        for (int c = 0; c < W; ++c) d += double((*wi)[size_t(s) * W + c]) * N[c];
        winj[size_t(t) * S + s] = 2.f * sigmoid(float(d) / S);
      }
  }
}

struct HcCase {
  int T, S, H, R;
  bool inject, pending;
};

class HcRead : public ::testing::TestWithParam<HcCase> {};

TEST_P(HcRead, MatchesReference) {
  const auto p = GetParam();
  const int W = p.S * p.H;
  auto X = rand_f16_values(size_t(p.T) * W, 11, -2.f, 2.f);
  auto nw = rand_f16_values(W, 12, -0.2f, 0.2f);
  const float ws = 1.f / std::sqrt(float(W)), us = 2.f / std::sqrt(float(p.R));
  auto wd = rand_f16_values(size_t(p.R) * W, 13, -ws, ws);
  auto wu = rand_f16_values(size_t(W) * p.R, 14, -us, us);
  auto wi = rand_f16_values(size_t(p.S) * W, 15, -ws * 4, ws * 4);
  auto yp = rand_f16_values(size_t(p.T) * p.H, 16);
  std::vector<float> wp(size_t(p.T) * p.S);
  for (size_t i = 0; i < wp.size(); ++i) wp[i] = 0.25f + 0.5f * float(i % 3);

  auto dX = dev_half(X), dnw = dev_half(nw), dwd = dev_half(wd), dwu = dev_half(wu), dwi = dev_half(wi);
  auto dyp = dev_half(yp);
  auto dwp = to_device(wp);
  DeviceArray<__half> du(size_t(p.T) * p.H, "u");
  DeviceArray<float> dinj(size_t(p.T) * p.S, "inject");
  HcWeights wt{dnw.get(), dwd.get(), dwu.get(), p.inject ? dwi.get() : nullptr, p.S, p.H, p.R, 1e-6f};
  HcWorkspace ws_(p.T, p.S, p.H, p.R);
  Blas blas;
  hc_read(blas, wt, dX.get(), p.T, p.pending ? dyp.get() : nullptr, p.pending ? dwp.get() : nullptr, du.get(),
          p.inject ? dinj.get() : nullptr, ws_, nullptr);
  sync();

  std::vector<float> Xref = X;
  if (p.pending)  // the fused inject: X += w ⊗ y, rounded to FP16 as the kernel stores it
    for (int t = 0; t < p.T; ++t)
      for (int b = 0; b < p.S; ++b)
        for (int i = 0; i < p.H; ++i) {
          float& v = Xref[size_t(t) * W + b * p.H + i];
          v = __half2float(__float2half_rn(v + wp[t * p.S + b] * yp[size_t(t) * p.H + i]));
        }
  std::vector<float> u, winj;
  ref_hc_read(Xref, nw, wd, wu, p.inject ? &wi : nullptr, p.T, p.S, p.H, p.R, u, winj);
  expect_close(host_half(du.get(), u.size()), u, 1e-2f, 1e-2f, "hc_read u");
  if (p.inject) expect_close(download(dinj.get(), winj.size()), winj, 2e-3f, 2e-3f, "hc_read inject weights");
  expect_close(host_half(dX.get(), X.size()), Xref, 1e-3f, 1e-3f, "hc_read residual after pending inject");
}

INSTANTIATE_TEST_SUITE_P(Shapes, HcRead,
                         ::testing::Values(HcCase{1, 4, 2560, 320, true, false}, HcCase{5, 4, 2560, 320, true, true},
                                           HcCase{3, 4, 640, 80, true, false},  // H and rank / TP4
                                           HcCase{2, 4, 1, 1, true, false}, HcCase{17, 2, 96, 16, false, false},
                                           HcCase{4, 1, 64, 8, true, true}));

TEST(HcInject, MatchesReference) {
  const int T = 3, S = 4, H = 37;
  auto X = rand_f16_values(size_t(T) * S * H, 21), y = rand_f16_values(size_t(T) * H, 22);
  std::vector<float> w = {0.1f, 1.9f, 1.f, 0.5f, 0.f, 2.f, 0.3f, 0.7f, 1.2f, 1.3f, 0.01f, 1.99f};
  auto dX = dev_half(X), dy = dev_half(y);
  auto dw = to_device(w);
  hc_inject(dX.get(), dy.get(), dw.get(), T, S, H, nullptr);
  sync();
  std::vector<float> ref = X;
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < S; ++b)
      for (int i = 0; i < H; ++i) ref[(size_t(t) * S + b) * H + i] += w[t * S + b] * y[size_t(t) * H + i];
  expect_close(host_half(dX.get(), ref.size()), ref, 1e-3f, 1e-3f, "hc_inject");
}

}  // namespace
}  // namespace flashnext::cuda::test
