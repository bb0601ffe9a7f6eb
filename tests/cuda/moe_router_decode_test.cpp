// The decode router in one launch (launch_moe_router_decode, cuda_ops_kernels.cu) against the two launches it
// replaces (launch_gemv_f16w_f32x for the logits, launch_moe_router_topk for the picks): the same float32 logits, expert
// ids and weights bit for bit, over odd shapes (hidden 8 .. 2,568, 3 .. 1,024 experts, top-k 1 .. 32, 1 .. 8
// tokens), and the picks against a float64 softmax top-k of those logits (MODEL.md "MoE block": higher probability,
// then lower index). Its completion counter is 0 again after each launch: a second launch on the same counter gives
// the same results.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops_kernels.h"
#include "ops/cuda/moe_kernels.h"

namespace flashnext::cuda::test {
namespace {

struct RouterCase {
  int tokens, hidden, experts, top_k;
  bool norm;
};

class RouterDecode : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterDecode, OneLaunchEqualsGemvThenTopK) {
  const RouterCase c = GetParam();
  const int T = c.tokens, H = c.hidden, E = c.experts, k = c.top_k;
  std::vector<float> x = rand_f16_values(size_t(T) * H, 11u + uint32_t(E), -1.f, 1.f);
  x[0] += 1e-3f;  // not an FP16 value: the activations are float32
  // Weights of a few magnitudes, and two rows equal to the first, so that some tokens have tied probabilities.
  std::vector<float> w = rand_f16_values(size_t(E) * H, 7u + uint32_t(H), -0.2f, 0.2f);
  for (int e = 1; e < std::min(E, 3); ++e) std::copy(w.begin(), w.begin() + H, w.begin() + size_t(e) * H);
  auto dx = to_device(x, "x");
  auto dw = dev_half(w);
  DeviceArray<float> logits_a(size_t(T) * E, "logits"), logits_b(size_t(T) * E, "logits"),
      weights_a(size_t(T) * k, "weights"), weights_b(size_t(T) * k, "weights");
  DeviceArray<int32_t> ids_a(size_t(T) * k, "ids"), ids_b(size_t(T) * k, "ids"), done(1, "done");
  ASSERT_EQ(cudaMemset(done.get(), 0, sizeof(int32_t)), cudaSuccess);

  // The two launches of the unfused path.
  detail::GemvSegments seg{};
  seg.count = 1;
  seg.w[0] = dw.get();
  seg.y[0] = logits_a.get();
  seg.ldy[0] = E;
  seg.rows_end[0] = E;
  ASSERT_EQ(detail::launch_gemv_f16w_f32x(dx.get(), H, H, seg, T, nullptr), cudaSuccess);
  ASSERT_EQ(detail::launch_moe_router_topk(logits_a.get(), E, T, E, k, c.norm, ids_a.get(), weights_a.get(), nullptr),
            cudaSuccess);
  ASSERT_TRUE(detail::moe_router_decode_supported(T, H, E, k));
  for (int run = 0; run < 2; ++run) {  // twice on one counter: it must be back at 0
    ASSERT_EQ(detail::launch_moe_router_decode(dx.get(), H, dw.get(), H, E, T, k, c.norm, logits_b.get(), done.get(),
                                               ids_b.get(), weights_b.get(), nullptr),
              cudaSuccess);
    sync();
    const auto la = download(logits_a.get(), logits_a.size()), lb = download(logits_b.get(), logits_b.size());
    const auto ia = download(ids_a.get(), ids_a.size()), ib = download(ids_b.get(), ids_b.size());
    const auto wa = download(weights_a.get(), weights_a.size()), wb = download(weights_b.get(), weights_b.size());
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "logits, run " << run;
    EXPECT_EQ(ia, ib) << "expert ids, run " << run;
    EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float))) << "weights, run " << run;
    EXPECT_EQ(download(done.get(), 1)[0], 0) << "the counter after run " << run;
    // The picks are the float64 softmax's top-k of those logits (higher probability, then lower index).
    for (int t = 0; t < T; ++t) {
      const float* row = lb.data() + size_t(t) * E;
      const double mx = *std::max_element(row, row + E);
      std::vector<double> prob(static_cast<size_t>(E));
      double total = 0;
      for (int e = 0; e < E; ++e) total += prob[size_t(e)] = std::exp(double(row[e]) - mx);
      for (double& q : prob) q /= total;
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[size_t(a)] > prob[size_t(b)]; });
      double picked = 0;
      for (int j = 0; j < k; ++j) picked += prob[size_t(order[size_t(j)])];
      for (int j = 0; j < k; ++j) {
        const int e = order[size_t(j)];
        const double pe = prob[size_t(e)];
        // A float32 softmax may order probabilities closer than its rounding otherwise than float64 does.
        const bool near_tie = (j > 0 && std::fabs(prob[size_t(order[size_t(j - 1)])] - pe) < 1e-6) ||
                              (j + 1 < E && std::fabs(prob[size_t(order[size_t(j + 1)])] - pe) < 1e-6);
        if (!near_tie) {
          EXPECT_EQ(ib[size_t(t) * k + j], e) << "token " << t << " pick " << j;
        }
        const double want = pe / (c.norm ? picked : 1.0);
        EXPECT_NEAR(wb[size_t(t) * k + j], want, 1e-5 * std::max(1.0, want)) << "token " << t << " pick " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RouterDecode,
                         ::testing::Values(RouterCase{1, 2560, 512, 10, true}, RouterCase{1, 2560, 256, 10, false},
                                           RouterCase{8, 2560, 512, 10, true}, RouterCase{3, 136, 60, 4, true},
                                           RouterCase{5, 8, 3, 1, false}, RouterCase{2, 2568, 1024, 32, true},
                                           RouterCase{7, 264, 257, 8, false}, RouterCase{4, 520, 33, 32, true}),
                         [](const auto& info) {
                           const RouterCase& c = info.param;
                           return "T" + std::to_string(c.tokens) + "_H" + std::to_string(c.hidden) + "_E" +
                                  std::to_string(c.experts) + "_k" + std::to_string(c.top_k) +
                                  (c.norm ? "_norm" : "");
                         });

}  // namespace
}  // namespace flashnext::cuda::test
