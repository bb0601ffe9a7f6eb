// tiny-a fixture (tests/data/fixtures/tiny-a): every hidden state, the full logits and the greedy continuation of
// all five prompts against transformers' float32 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kModel = "tests/data/fixtures/tiny-a/model";

class TinyA : public ::testing::TestWithParam<std::string> {};

// Hidden states layer by layer (P.hidden.i) and logits at every position, one full-prompt forward.
TEST_P(TinyA, HiddenStatesAndLogitsMatchReference) {
  const std::string P = GetParam();
  Reference ref("tiny-a");
  Model& model = shared_model(kModel);
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size, L = model.config().num_hidden_layers;
  SequenceState seq = model.new_sequence();
  int hooks = 0;
  double hidden_err = 0;
  std::vector<float> logits = model.forward(seq, ids, LogitsMode::All, [&](int i, const Tensor& h) {
    ++hooks;
    const std::vector<float> got = model.download(h);
    const std::vector<float> want = ref.f32(P + ".hidden." + std::to_string(i));
    ASSERT_EQ(got.size(), want.size()) << "hidden." << i;
    const double err = max_abs_diff(got.data(), want.data(), got.size());
    hidden_err = std::max(hidden_err, err);
    EXPECT_LE(err, kTinyAHiddenTol) << P << " hidden." << i;
  });
  EXPECT_EQ(hooks, L + 1);
  const std::vector<float> want = ref.f32(P + ".logits");
  ASSERT_EQ(logits.size(), size_t(T * V));
  const double err = max_abs_diff(logits.data(), want.data(), logits.size());
  std::printf(
      "[ tiny-a   ] %-10s max |hidden - reference| %.3g (bound %.2g), max |logit - reference| %.3g (bound %.2g)\n",
      P.c_str(), hidden_err, kTinyAHiddenTol, err, kTinyALogitTol);
  EXPECT_LE(err, kTinyALogitTol) << P;
  const std::vector<int64_t> ref_argmax = ref.i64(P + ".argmax");
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(argmax(&logits[size_t(t * V)], V), ref_argmax[size_t(t)]) << P << " position " << t;
  }
}

// Greedy ids through prefill + single-token decode steps (the reference's own cached decode).
TEST_P(TinyA, GreedyDecodeMatchesReference) {
  const std::string P = GetParam();
  Reference ref("tiny-a");
  Model& model = shared_model(kModel);
  const std::vector<int64_t> want = ref.i64(P + ".greedy_ids");
  EXPECT_EQ(greedy(model, ref.ids(P), int(want.size())), want) << P;
}

INSTANTIATE_TEST_SUITE_P(Prompts, TinyA, ::testing::Values("short", "eos_inside", "long", "single", "eos_first"));

}  // namespace
}  // namespace flashnext::test
