// The MTP layer and speculative decoding on the GPU: the tiny-mtp fixture (tools/make_mtp_fixture.py, the SGLang /
// vLLM wiring on top of transformers' modules) loaded on the CUDA backend with load_mtp.
//   - MTP logits over the prompt and the chained drafts against the PyTorch reference, as a ratio to the
//     reference scale (the largest |logit|), as model_e2e_test.cpp checks the trunk; printed as `E2E-MTP:`.
//   - Greedy speculative decoding (mtp:K and ngram:K, engine/speculative.h) gives the GPU's plain greedy tokens; where
//     the two first differ, the plain run's top-2 gap there is a near-tie (the verify forward over K+1 rows and the
//     one-row decode step round differently; past a near-tie the two runs may legitimately part).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <vector>

#include "engine/speculative.h"
#include "model/fixture.h"
#include "ops/cuda/cuda_ops.h"

namespace flashnext::test {
namespace {

constexpr const char* kMtpModel = "tests/data/fixtures/tiny-mtp/model";
/// Bound on max |MTP logit - reference| / reference scale (prompt rows and chained drafts): measured 2026-12-02 on the
/// H200 (fp16x2) 5.0e-7 (prompt rows) and 3.2e-7 (chained drafts), trunk 7.9e-7; the bound is 10x that, as in
/// model_e2e_test.cpp.
constexpr double kMtpTol = 5e-6;
constexpr double kNearTie = 1e-2;  // plain-run top-2 gap below which the runs may part

Model& gpu_mtp_model() {
  static std::unique_ptr<Model> m = [] {
    ModelOptions o;
    o.ops = make_cuda_ops(0);
    o.load_mtp = true;
    return Model::load(source_path(kMtpModel), o);
  }();
  return *m;
}

TEST(MtpOnGpu, LogitsMatchTheReference) {
  Reference ref("tiny-mtp");
  Model& model = gpu_mtp_model();
  ASSERT_TRUE(model.has_mtp());
  const auto ids = ref.ids("prompt");
  const auto next64 = ref.i64("prompt.next_ids");
  const std::vector<int32_t> next(next64.begin(), next64.end());
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState seq = model.new_sequence();
  Tensor wide;
  const BatchItem item{&seq, ids, LogitsMode::All};
  const std::vector<float> trunk = model.download(model.forward_batch({&item, 1}, nullptr, {}, &wide));
  const std::vector<float> trunk_ref = ref.f32("prompt.trunk_logits");
  const double trunk_ratio = max_abs_diff(trunk.data(), trunk_ref.data(), trunk.size()) / max_abs(trunk_ref);

  Model::MtpOutput out = model.mtp_forward(seq, wide, next, LogitsMode::All);
  const std::vector<float> got = model.download(out.logits), want = ref.f32("prompt.mtp_logits");
  ASSERT_EQ(got.size(), size_t(T * V));
  const double scale = max_abs(want);
  const double mtp_ratio = max_abs_diff(got.data(), want.data(), got.size()) / scale;

  // Chained drafts from the MTP layer's own state of the last row, fed the reference's draft tokens.
  const auto drafts64 = ref.i64("draft.ids");
  const std::vector<int32_t> drafts(drafts64.begin(), drafts64.end());
  const std::vector<float> draft_logits = ref.f32("draft.logits");
  double draft_ratio = max_abs_diff(got.data() + (T - 1) * V, draft_logits.data(), size_t(V)) / scale;
  Tensor state = out.wide.rows(T - 1, T);
  for (size_t k = 1; k < drafts.size(); ++k) {
    Model::MtpOutput d = model.mtp_forward(seq, state, {&drafts[k - 1], 1});
    const std::vector<float> row = model.download(d.logits);
    const float* want_row = draft_logits.data() + int64_t(k) * V;
    draft_ratio = std::max(draft_ratio, max_abs_diff(row.data(), want_row, size_t(V)) / scale);
    if (top2_gap(want_row, V) > kNearTie) {
      EXPECT_EQ(argmax(row.data(), V), drafts[k]) << "draft " << k;
    }
    state = d.wide;
  }
  std::printf("E2E-MTP: trunk %.3g, MTP prompt rows %.3g, chained drafts %.3g (ratios to scale %.3g), bound %.3g\n",
              trunk_ratio, mtp_ratio, draft_ratio, scale, kMtpTol);
  EXPECT_LE(mtp_ratio, kMtpTol);
  EXPECT_LE(draft_ratio, kMtpTol);
}

// Model::replay_state on the GPU: after a verify of 6 tokens that keeps its state inputs, the state from before it put
// back and advanced over its first n tokens equals feeding those n tokens (to the rounding of a different batch
// shape: the verify's 6-row products against 1..6-row ones): every state tensor, and the next token's logits.
TEST(MtpOnGpu, ReplayedStateEqualsFeedingTheAcceptedTokens) {
  Model& m = gpu_mtp_model();
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt, verify;
  for (int i = 0; i < 41; ++i) prompt.push_back(int32_t((i * 977 + 13) % V));
  for (int i = 0; i < 6; ++i) verify.push_back(int32_t((i * 331 + 5) % V));
  for (int64_t keep : {1, 3, 6}) {
    SCOPED_TRACE(testing::Message() << keep << " of 6 tokens kept");
    auto [a, b] = replayed_and_fed(m, prompt, verify, keep);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.ple_history, b.ple_history);
    const auto sa = state_tensors(m, a), sb = state_tensors(m, b);
    ASSERT_EQ(sa.size(), sb.size());
    double worst = 0;
    for (size_t i = 0; i < sa.size(); ++i)
      worst = std::max(worst, max_abs_diff(sa[i].data(), sb[i].data(), sa[i].size()) / std::max(1.0, max_abs(sb[i])));
    const int32_t next = 7;
    const std::vector<float> la = m.forward(a, {&next, 1}, LogitsMode::Last),
                             lb = m.forward(b, {&next, 1}, LogitsMode::Last);
    const double logits = max_abs_diff(la.data(), lb.data(), la.size()) / max_abs(lb);
    std::printf("E2E-MTP: replay of %lld of 6 tokens: state %.3g, next logits %.3g (ratios to scale)\n",
                (long long)keep, worst, logits);
    EXPECT_LE(worst, 1e-4);
    EXPECT_LE(logits, 1e-4);
  }
}

/// Plain greedy decoding on the GPU: `n` tokens and the top-2 gap of the logits row each was chosen from.
std::vector<int32_t> plain_greedy(Model& model, const std::vector<int32_t>& prompt, int n, std::vector<double>& gaps) {
  SequenceState seq = model.new_sequence();
  std::vector<float> row = model.forward(seq, prompt, LogitsMode::Last);
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    out.push_back(int32_t(argmax(row.data(), V)));
    gaps.push_back(top2_gap(row.data(), V));
    if (int(out.size()) < n) row = model.forward(seq, {&out.back(), 1}, LogitsMode::Last);
  }
  return out;
}

TEST(MtpOnGpu, GreedySpeculativeDecodingGivesThePlainTokens) {
  Model& model = gpu_mtp_model();
  const int64_t V = model.config().vocab_size;
  constexpr int kTokens = 40;
  for (int salt : {1, 2}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 37; ++i) prompt.push_back(int32_t((i * 131 + salt * 17 + 7) % std::min<int64_t>(V, 400)));
    std::vector<double> gaps;
    const std::vector<int32_t> want = plain_greedy(model, prompt, kTokens, gaps);
    for (const char* spec : {"mtp:1", "mtp:3", "ngram:4"}) {
      SCOPED_TRACE(testing::Message() << "salt " << salt << ", " << spec);
      SpeculativeDecoder dec(model, SpeculativeConfig::parse(spec));
      SequenceState seq = model.new_sequence();
      auto choose = [&](std::span<float> row) { return int32_t(argmax(row.data(), V)); };
      std::vector<float> first = dec.prefill(seq, prompt);
      std::vector<int32_t> context = prompt;
      context.push_back(choose(first));
      while (int(context.size() - prompt.size()) < kTokens) {
        for (int32_t t : dec.step(seq, context, choose)) context.push_back(t);
      }
      const std::vector<int32_t> got(context.begin() + int64_t(prompt.size()),
                                     context.begin() + int64_t(prompt.size()) + kTokens);
      // The runs agree up to their first difference, and that one is a near-tie of the plain run.
      int equal = 0;
      while (equal < kTokens && got[size_t(equal)] == want[size_t(equal)]) ++equal;
      if (equal < kTokens) {
        EXPECT_LT(gaps[size_t(equal)], kNearTie)
            << "token " << equal << ": " << got[size_t(equal)] << " vs plain " << want[size_t(equal)];
      }
      EXPECT_GT(dec.stats().steps, 0);
      std::printf(
          "E2E-MTP: %s salt %d: %d of %d tokens equal to plain decoding, %lld verify steps, mean accepted "
          "length %.2f\n",
          spec, salt, equal, kTokens, (long long)dec.stats().steps, dec.stats().mean_accepted_length());
    }
  }
}

}  // namespace
}  // namespace flashnext::test
