// tiny-b (weights models/tiny-b-random, reference tests/data/fixtures/tiny-b): real Qwen3 vocabulary (151,936 rows),
// PLE with 8 heads per n-gram. The reference stores the top-32 logits of every position and the last 4 rows in full.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kModel = "models/tiny-b-random";
class TinyB : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyB, Top32AndLastRowsMatchReference) {
  const std::string P = GetParam();
  Reference ref("tiny-b");
  Model& model = shared_model(kModel);
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState seq = model.new_sequence();
  const std::vector<float> logits = model.forward(seq, ids);
  ASSERT_EQ(logits.size(), size_t(T * V));
  const auto top_ids = ref.i64(P + ".top32_ids");
  const auto top_vals = ref.f32(P + ".top32_logits");
  ASSERT_EQ(top_ids.size(), size_t(T * 32));
  double err = 0;
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = &logits[size_t(t * V)];
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 32, order.end(),
                      [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int64_t j = 0; j < 32; ++j) {
      EXPECT_EQ(order[size_t(j)], top_ids[size_t(t * 32 + j)]) << P << " position " << t << " rank " << j;
      const double d = std::fabs(double(row[top_ids[size_t(t * 32 + j)]]) - double(top_vals[size_t(t * 32 + j)]));
      err = std::max(err, d);
      EXPECT_LE(d, kTinyBLogitTol) << P << " position " << t << " rank " << j;
    }
  }
  const auto last4 = ref.f32(P + ".logits_last4");
  ASSERT_EQ(last4.size(), size_t(4 * V));
  const double last4_err = max_abs_diff(&logits[size_t((T - 4) * V)], last4.data(), last4.size());
  EXPECT_LE(last4_err, kTinyBLogitTol) << P;
  std::printf("[ tiny-b   ] %-6s max |logit - reference| top-32 rows %.3g, last 4 rows %.3g (bound %.2g)\n", P.c_str(),
              err, last4_err, kTinyBLogitTol);
  const auto ref_argmax = ref.i64(P + ".argmax");
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(argmax(&logits[size_t(t * V)], V), ref_argmax[size_t(t)]) << P << " " << t;
}

TEST_P(TinyB, GreedyDecodeMatchesReference) {
  const std::string P = GetParam();
  Reference ref("tiny-b");
  Model& model = shared_model(kModel);
  const std::vector<int64_t> want = ref.i64(P + ".greedy_ids");
  EXPECT_EQ(greedy(model, ref.ids(P), int(want.size())), want) << P;
}

INSTANTIATE_TEST_SUITE_P(Prompts, TinyB, ::testing::Values("chat0", "chat2", "code"));

}  // namespace
}  // namespace flashnext::test
