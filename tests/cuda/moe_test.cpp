// MoE kernels against CPU loops of MODEL.md's MoE block. Tolerances: router weights atol 1e-6 rtol 1e-5 and expert
// ids exact (logits on a coarse grid so that the FP32 kernel and the double loop rank alike; exact ties are
// deliberate and must go to the lower index); expert outputs atol 3e-3 rtol 1e-2 (FP16 activations between the two
// GEMMs and FP16 per-slot outputs, FP32 accumulation; the CPU loop runs in double without roundings).
#include "ops/cuda/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cuda_test_util.h"

namespace flashnext::cuda::test {
namespace {

struct RouterCase {
  int tokens, experts, top_k;
  bool norm;
};

class MoeRouter : public ::testing::TestWithParam<RouterCase> {};

TEST_P(MoeRouter, SoftmaxTopKMatchesReference) {
  const auto p = GetParam();
  std::mt19937 rng(5);
  std::vector<float> logits(size_t(p.tokens) * p.experts);
  for (auto& x : logits) x = float(int(rng() % 512) - 256) / 64.f;
  for (int t = 0; t < p.tokens; ++t)  // exact ties at the top: experts 5 and 3 share the largest logit
    if (p.experts > 5) logits[size_t(t) * p.experts + 5] = logits[size_t(t) * p.experts + 3] = 4.5f + t;
  auto dl = to_device(logits);
  DeviceArray<int32_t> ids(size_t(p.tokens) * p.top_k, "ids");
  DeviceArray<float> w(size_t(p.tokens) * p.top_k, "w");
  moe_router_topk(dl.get(), p.experts, p.tokens, p.experts, p.top_k, p.norm, ids.get(), w.get(), nullptr);
  sync();
  std::vector<int32_t> want_ids;
  std::vector<float> want_w;
  for (int t = 0; t < p.tokens; ++t) {
    const float* row = &logits[size_t(t) * p.experts];
    double mx = *std::max_element(row, row + p.experts), sum = 0;
    std::vector<double> prob(p.experts);
    for (int e = 0; e < p.experts; ++e) sum += (prob[e] = std::exp(double(row[e]) - mx));
    for (auto& x : prob) x /= sum;
    std::vector<int> order(p.experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
    double top_sum = 0;
    for (int j = 0; j < p.top_k; ++j) top_sum += prob[order[j]];
    for (int j = 0; j < p.top_k; ++j) {
      want_ids.push_back(order[j]);
      want_w.push_back(float(p.norm ? prob[order[j]] / top_sum : prob[order[j]]));
    }
  }
  EXPECT_EQ(download(ids.get(), want_ids.size()), want_ids);
  expect_close(download(w.get(), want_w.size()), want_w, 1e-6f, 1e-5f, "router weights");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRouter,
                         ::testing::Values(RouterCase{5, 512, 10, true}, RouterCase{3, 512, 10, false},
                                           RouterCase{17, 8, 2, true}, RouterCase{2, 1, 1, true},
                                           RouterCase{1, 1000, 32, true}));

struct RoutedCase {
  int tokens, experts, top_k, hidden, inter;
  bool shared;
};

class MoeRouted : public ::testing::TestWithParam<RoutedCase> {};

TEST_P(MoeRouted, MatchesReference) {
  const auto p = GetParam();
  const int T = p.tokens, E = p.experts, k = p.top_k, H = p.hidden, I = p.inter;
  const float ws = 1.f / std::sqrt(float(H)), wd = 1.f / std::sqrt(float(I));
  auto u = rand_f16_values(size_t(T) * H, 1, -1.f, 1.f);
  auto gu = rand_f16_values(size_t(E) * 2 * I * H, 2, -2 * ws, 2 * ws);
  auto dn = rand_f16_values(size_t(E) * H * I, 3, -wd, wd);
  std::mt19937 rng(4);
  std::vector<int32_t> ids(size_t(T) * k);
  std::vector<float> wts(size_t(T) * k);
  for (int t = 0; t < T; ++t) {
    std::vector<int> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    for (int j = 0; j < k; ++j) {
      ids[size_t(t) * k + j] = e[j] % 3 == 0 || E < 4 ? e[j] : e[j] / 2 * 2;  // skewed: some experts get many tokens
      wts[size_t(t) * k + j] = 0.05f + 0.1f * float(j);
    }
  }
  // Shared expert.
  auto sg = rand_f16_values(size_t(I) * H, 5, -2 * ws, 2 * ws), su = rand_f16_values(size_t(I) * H, 6, -2 * ws, 2 * ws),
       sd = rand_f16_values(size_t(H) * I, 7, -wd, wd), sgl = rand_f16_values(H, 8, -ws, ws);

  auto du = dev_half(u), dgu = dev_half(gu), ddn = dev_half(dn);
  auto dids = to_device(ids);
  auto dw = to_device(wts);
  auto dsg = dev_half(sg), dsu = dev_half(su), dsd = dev_half(sd), dsgl = dev_half(sgl);
  DeviceArray<__half> out(size_t(T) * H, "out"), shared_out(size_t(T) * H, "shared");
  DeviceArray<float> shared_logit(T, "shared logit");
  MoeWorkspace mws(T, k, E, H, I);
  Blas blas;
  if (p.shared) {
    SharedExpertWorkspace sws(T, I);
    moe_shared(blas, SharedExpert{dsg.get(), dsu.get(), dsd.get(), dsgl.get(), H, I}, du.get(), T, shared_out.get(),
               shared_logit.get(), sws, nullptr);
    sync();
  }
  moe_routed(MoeExperts{dgu.get(), ddn.get(), E, H, I}, du.get(), H, T, dids.get(), dw.get(),
             p.shared ? shared_out.get() : nullptr, p.shared ? shared_logit.get() : nullptr, out.get(), H, mws,
             nullptr);
  EXPECT_NO_THROW(moe_check_status(mws, nullptr));

  auto mlp = [&](const float* x, const float* wg, const float* wu, const float* wdn, std::vector<double>& y) {
    std::vector<double> a(I);
    for (int n = 0; n < I; ++n) {
      double g = 0, up = 0;
      for (int c = 0; c < H; ++c) {
        g += double(wg[size_t(n) * H + c]) * x[c];
        up += double(wu[size_t(n) * H + c]) * x[c];
      }
      a[n] = g / (1 + std::exp(-g)) * up;
    }
    y.assign(H, 0);
    for (int c = 0; c < H; ++c)
      for (int n = 0; n < I; ++n) y[c] += double(wdn[size_t(c) * I + n]) * a[n];
  };
  std::vector<float> ref(size_t(T) * H);
  for (int t = 0; t < T; ++t) {
    std::vector<double> acc(H, 0), y;
    for (int j = 0; j < k; ++j) {
      const int e = ids[size_t(t) * k + j];
      const float* g = &gu[size_t(e) * 2 * I * H];
      mlp(&u[size_t(t) * H], g, g + size_t(I) * H, &dn[size_t(e) * H * I], y);
      for (int c = 0; c < H; ++c) acc[c] += wts[size_t(t) * k + j] * y[c];
    }
    if (p.shared) {
      mlp(&u[size_t(t) * H], sg.data(), su.data(), sd.data(), y);
      double gl = 0;
      for (int c = 0; c < H; ++c) gl += double(sgl[c]) * u[size_t(t) * H + c];
      for (int c = 0; c < H; ++c) acc[c] += y[c] / (1 + std::exp(-gl));
    }
    for (int c = 0; c < H; ++c) ref[size_t(t) * H + c] = float(acc[c]);
  }
  expect_close(host_half(out.get(), ref.size()), ref, 3e-3f, 1e-2f, "moe output");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRouted,
                         ::testing::Values(RoutedCase{1, 512, 10, 256, 64, true},  // decode: 512 experts, top-10
                                           RoutedCase{40, 512, 10, 256, 64,
                                                      false},  // prefill chunk: experts with many tokens
                                           RoutedCase{3, 16, 10, 2560, 640, true},  // released hidden and expert widths
                                           RoutedCase{9, 32, 4, 2560, 160, false},  // expert width of a TP4 rank
                                           RoutedCase{2, 1, 1, 8, 8, true},         // one expert, widths of 8
                                           RoutedCase{33, 3, 2, 72, 24, false}));

TEST(MoeRouted, BadExpertIdIsReported) {
  const int H = 8, I = 8;
  auto z = dev_half(std::vector<float>(2 * 2 * I * H, 0.f));
  auto ids = to_device(std::vector<int32_t>{0, 7});
  auto w = to_device(std::vector<float>{0.5f, 0.5f});
  MoeWorkspace ws(1, 2, 2, H, I);
  DeviceArray<__half> out(H, "out");
  moe_routed(MoeExperts{z.get(), z.get(), 2, H, I}, z.get(), H, 1, ids.get(), w.get(), nullptr, nullptr, out.get(), H,
             ws, nullptr);
  EXPECT_THROW(moe_check_status(ws, nullptr), Error);
  EXPECT_THROW(moe_router_topk(nullptr, 4, 1, 4, 5, true, nullptr, nullptr, nullptr), Error);  // top-k above E
}

}  // namespace
}  // namespace flashnext::cuda::test
