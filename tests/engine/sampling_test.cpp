// Sampler tests. Every expected value is derived by hand from the definitions in engine/sampling.h (HF / vLLM
// semantics), never from the code's own output.
#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace flashnext {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::set<int> kept(const std::vector<float>& logits) {
  std::set<int> s;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kNegInf) s.insert(int(i));
  }
  return s;
}

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  std::vector<int32_t> prompt{0};
  for (uint64_t seed : {1u, 2u, 3u}) {
    p.seed = seed;
    Sampler s(p, 5, prompt);
    std::vector<float> l{1.f, 3.f, -2.f, 3.f, 2.9f};
    EXPECT_EQ(s.sample(l), 1);
  }
  EXPECT_EQ(argmax(std::vector<float>{kNegInf, -5.f, -4.f}), 2);
  EXPECT_THROW(argmax(std::vector<float>{kNegInf, kNegInf}), Error);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> l{2.f, -2.f, 1.f, 0.5f, 0.f};
  std::vector<int32_t> seen{0, 1, 4};
  apply_repetition_penalty(l, seen, 2.0);
  EXPECT_EQ(l, (std::vector<float>{1.f, -4.f, 1.f, 0.5f, 0.f}));
}

TEST(Sampling, SamplerPenalisesPromptAndOutputForRepetitionOutputOnlyForPresenceFrequency) {
  SamplingParams p;
  p.temperature = 0;  // penalties still apply before the argmax, as in vLLM
  p.repetition_penalty = 2.0;
  p.presence_penalty = 0.25;
  p.frequency_penalty = 0.5;
  std::vector<int32_t> prompt{0, 0, 1};
  Sampler s(p, 6, prompt);
  s.accept(2);
  s.accept(2);
  s.accept(3);
  std::vector<float> l{4.f, -1.f, 3.f, 2.f, 1.f, 0.5f};
  s.sample(l);
  // token 0 (prompt): 4/2 = 2; token 1 (prompt): -1*2 = -2;
  // token 2 (output x2): 3/2 - (0.5*2 + 0.25) = 0.25; token 3 (output x1): 2/2 - (0.5 + 0.25) = 0.25;
  // tokens 4, 5 unseen: unchanged.
  EXPECT_FLOAT_EQ(l[0], 2.f);
  EXPECT_FLOAT_EQ(l[1], -2.f);
  EXPECT_FLOAT_EQ(l[2], 0.25f);
  EXPECT_FLOAT_EQ(l[3], 0.25f);
  EXPECT_FLOAT_EQ(l[4], 1.f);
  EXPECT_FLOAT_EQ(l[5], 0.5f);
}

TEST(Sampling, SampleLeavesThePenalisedLogitsInPlace) {
  // Temperature and filters do not write into the caller's row; only the penalties do (none here).
  for (int64_t top_k : {0, 2}) {
    SamplingParams p;
    p.temperature = 0.5;
    p.top_k = top_k;
    p.seed = 1;
    std::vector<int32_t> prompt{};
    Sampler s(p, 4, prompt);
    std::vector<float> l{1.f, 2.f, 3.f, 4.f};
    s.sample(l);
    EXPECT_EQ(l, (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  }
}

TEST(Sampling, PresenceFrequencyAlone) {
  std::vector<float> l{0.f, 0.f, 0.f};
  std::vector<int32_t> ids{0, 2}, counts{3, 1};
  apply_presence_frequency(l, ids, counts, /*presence=*/1.0, /*frequency=*/-0.5);
  EXPECT_FLOAT_EQ(l[0], -(-0.5f * 3 + 1.f));  // 0.5
  EXPECT_FLOAT_EQ(l[1], 0.f);
  EXPECT_FLOAT_EQ(l[2], -(-0.5f + 1.f));  // -0.5
}

TEST(Sampling, Temperature) {
  std::vector<float> l{2.f, 4.f, -1.f};
  apply_temperature(l, 2.0);
  EXPECT_EQ(l, (std::vector<float>{1.f, 2.f, -0.5f}));
}

TEST(Sampling, TopKKeepsTheKLargestAndTiesWithTheKth) {
  std::vector<float> l{1, 5, 3, 5, 2};
  apply_top_k(l, 2);
  EXPECT_EQ(kept(l), (std::set<int>{1, 3}));
  l = {1, 5, 3, 5, 2};
  apply_top_k(l, 3);
  EXPECT_EQ(kept(l), (std::set<int>{1, 2, 3}));
  l = {4, 3, 3, 2};
  apply_top_k(l, 2);  // the 2nd largest is 3, shared by ids 1 and 2
  EXPECT_EQ(kept(l), (std::set<int>{0, 1, 2}));
  l = {4, 3, 3, 2};
  apply_top_k(l, 0);
  EXPECT_EQ(kept(l).size(), 4u);
  apply_top_k(l, 10);
  EXPECT_EQ(kept(l).size(), 4u);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities by id: 0.15, 0.05, 0.5, 0.3. In descending order: id2 0.5, id3 0.3, id0 0.15, id1 0.05;
  // mass before each: 0, 0.5, 0.8, 0.95.
  const std::vector<double> probs{0.15, 0.05, 0.5, 0.3};
  auto run = [&](double p) {
    auto l = log_probs(probs);
    apply_top_p(l, p);
    return kept(l);
  };
  EXPECT_EQ(run(0.3), (std::set<int>{2}));
  EXPECT_EQ(run(0.49), (std::set<int>{2}));
  EXPECT_EQ(run(0.51), (std::set<int>{2, 3}));
  EXPECT_EQ(run(0.75), (std::set<int>{2, 3}));
  EXPECT_EQ(run(0.81), (std::set<int>{0, 2, 3}));
  EXPECT_EQ(run(0.96), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(run(1.0), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(run(1e-9), (std::set<int>{2}));  // at least one token survives
}

TEST(Sampling, TopPOverALargeUniformVocabulary) {
  // 1000 equal tokens: token i (ties broken by lowest id) has mass i/1000 before it, kept while that is < p.
  // p = 0.5005 keeps ids 0..500: this needs more than the first sorted block of 256 candidates.
  std::vector<float> l(1000, 0.25f);
  apply_top_p(l, 0.5005);
  auto k = kept(l);
  EXPECT_EQ(k.size(), 501u);
  EXPECT_EQ(*k.begin(), 0);
  EXPECT_EQ(*k.rbegin(), 500);
}

TEST(Sampling, MinPThresholdIsRelativeToTheTopProbability) {
  const std::vector<double> probs{0.5, 0.3, 0.15, 0.05};
  auto run = [&](double min_p) {
    auto l = log_probs(probs);
    apply_min_p(l, min_p);
    return kept(l);
  };
  EXPECT_EQ(run(0.2), (std::set<int>{0, 1, 2}));      // threshold 0.1
  EXPECT_EQ(run(0.5), (std::set<int>{0, 1}));         // threshold 0.25
  EXPECT_EQ(run(0.7), (std::set<int>{0}));            // threshold 0.35
  EXPECT_EQ(run(0.09), (std::set<int>{0, 1, 2, 3}));  // threshold 0.045
  EXPECT_EQ(run(1.0), (std::set<int>{0}));
}

TEST(Sampling, TopPAppliesToTheTopKRenormalisedDistribution) {
  // p = 0.4, 0.3, 0.2, 0.1. top_k = 2 leaves 0.4/0.7 = 0.571 and 0.429; top_p = 0.5 then keeps id 0 only
  // (mass before id 1 is 0.571 >= 0.5). Without the top-k renormalisation id 1 would survive (0.4 < 0.5).
  SamplingParams p;
  p.top_k = 2;
  p.top_p = 0.5;
  p.seed = 7;
  std::vector<int32_t> prompt{};
  Sampler s(p, 4, prompt);
  for (int i = 0; i < 500; ++i) {
    auto l = log_probs({0.4, 0.3, 0.2, 0.1});
    ASSERT_EQ(s.sample(l), 0);
  }
}

// Draws `n` tokens with a fixed seed and checks every frequency is within 5 standard errors of `expect`.
void expect_frequencies(const SamplingParams& params, const std::vector<double>& logits_probs,
                        const std::vector<double>& expect, int n) {
  std::vector<int32_t> prompt{};
  Sampler s(params, int64_t(logits_probs.size()), prompt);
  std::vector<int> count(expect.size(), 0);
  for (int i = 0; i < n; ++i) {
    auto l = log_probs(logits_probs);
    count[size_t(s.sample(l))]++;
  }
  for (size_t i = 0; i < expect.size(); ++i) {
    const double f = double(count[i]) / n, se = std::sqrt(expect[i] * (1 - expect[i]) / n);
    if (expect[i] == 0) {
      EXPECT_EQ(count[i], 0) << "token " << i;
    } else {
      EXPECT_NEAR(f, expect[i], 5 * se) << "token " << i;
    }
  }
}

TEST(Sampling, SeededDrawFrequenciesMatchProbabilities) {
  SamplingParams p;
  p.seed = 1234;
  expect_frequencies(p, {0.1, 0.2, 0.3, 0.4}, {0.1, 0.2, 0.3, 0.4}, 100000);
}

TEST(Sampling, TemperatureSharpensAsAPower) {
  // T = 0.5 turns p_i into p_i^2 / sum p_j^2: (0.01, 0.04, 0.09, 0.16) / 0.30.
  SamplingParams p;
  p.seed = 99;
  p.temperature = 0.5;
  expect_frequencies(p, {0.1, 0.2, 0.3, 0.4}, {0.01 / 0.3, 0.04 / 0.3, 0.09 / 0.3, 0.16 / 0.3}, 100000);
}

TEST(Sampling, FilteredDrawFrequenciesMatchTheRenormalisedDistribution) {
  // top_k = 3 drops 0.1; min_p = 0.6 then drops 0.2 (< 0.6 * 0.4 = 0.24); left: 0.3 / 0.7 and 0.4 / 0.7.
  SamplingParams p;
  p.seed = 5;
  p.top_k = 3;
  p.min_p = 0.6;
  expect_frequencies(p, {0.1, 0.2, 0.3, 0.4}, {0, 0, 3.0 / 7, 4.0 / 7}, 100000);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto draw = [](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    std::vector<int32_t> prompt{};
    Sampler s(p, 16, prompt);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> l(16, 0.f);
      out.push_back(s.sample(l));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampling, Uniform01IsTheTop53BitsOfTheDraw) {
  std::mt19937_64 a(3), b(3);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = b();
    EXPECT_EQ(uniform01(a), double(x >> 11) / 9007199254740992.0);
  }
}

TEST(Sampling, ValidationNamesTheField) {
  auto msg = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    try {
      validate(p, 100);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([](SamplingParams& p) { p.temperature = -0.1; }).find("temperature"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.top_p = 1.5; }).find("top_p"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.min_p = 1.5; }).find("min_p"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.presence_penalty = 2.5; }).find("presence_penalty"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.frequency_penalty = -3; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.max_tokens = -1; }).find("max_tokens"), std::string::npos);
  EXPECT_EQ(msg([](SamplingParams& p) { p.max_tokens = 0; }), "");  // the prompt is only scored
  EXPECT_NE(msg([](SamplingParams& p) { p.min_tokens = p.max_tokens + 1; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.min_tokens = -1; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.logit_bias = {{100, 1.f}}; }).find("logit_bias token id 100"),
            std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }).find("[-100, 100]"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }).find("logit_bias of token 3"),
            std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.stop = {"a", ""}; }).find("empty"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.stop_token_ids = {100}; }).find("out of range"), std::string::npos);
  EXPECT_EQ(msg([](SamplingParams& p) { p.top_k = -1; }), "");
  EXPECT_EQ(msg([](SamplingParams& p) { p.temperature = 0; }), "");
}

TEST(Sampling, SamplerRejectsBadInput) {
  SamplingParams p;
  p.seed = 1;
  std::vector<int32_t> bad_prompt{1, 7};
  EXPECT_THROW(Sampler(p, 4, bad_prompt), Error);
  std::vector<int32_t> prompt{1};
  Sampler s(p, 4, prompt);
  std::vector<float> wrong_size(3, 0.f);
  EXPECT_THROW(s.sample(wrong_size), Error);
  std::vector<float> nan_logits{0.f, NAN, 0.f, 0.f};
  EXPECT_THROW(s.sample(nan_logits), Error);
  EXPECT_THROW(s.accept(4), Error);
  EXPECT_THROW(s.accept(-1), Error);
  std::vector<float> all_masked(4, kNegInf);
  EXPECT_THROW(s.sample(all_masked), Error);
}

TEST(Sampling, LogitBiasIsAddedAfterThePenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0;
  p.logit_bias = {{2, 1.5f}, {0, -100.f}};
  std::vector<int32_t> prompt{2};
  Sampler s(p, 4, prompt);
  std::vector<float> logits{10.f, 1.f, 4.f, 3.f};
  // token 0: 10 - 100; token 2: 4 / 2 (repetition) + 1.5
  EXPECT_EQ(s.sample(logits), 2);
  EXPECT_EQ(logits, (std::vector<float>{-90.f, 1.f, 3.5f, 3.f}));
}

TEST(Sampling, MinTokensMasksEosAndStopIdsUntilReached) {
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  p.max_tokens = 8;
  p.stop_token_ids = {1};
  std::vector<int32_t> prompt{3};
  const std::vector<int64_t> eos{0};
  Sampler s(p, 4, prompt, eos);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> logits{9.f, 8.f, 1.f, 2.f};  // EOS (0), then the stop id (1), are the most likely
    const int32_t tok = s.sample(logits);
    EXPECT_EQ(tok, step < 2 ? 3 : 0) << "step " << step;
    if (step < 2) EXPECT_TRUE(std::isinf(logits[0]) && std::isinf(logits[1]));
    s.accept(tok);
  }
  EXPECT_EQ(s.num_output(), 3);
  // ignore_eos: the EOS id is not masked (it does not end the sequence), the stop ids still are.
  p.ignore_eos = true;
  Sampler t(p, 4, prompt, eos);
  std::vector<float> logits{9.f, 8.f, 1.f, 2.f};
  EXPECT_EQ(t.sample(logits), 0);
  EXPECT_TRUE(std::isinf(logits[1]));
}

// Allows only even ids.
class EvenIds : public TokenConstraint {
 public:
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<EvenIds>(); }
  void mask(std::span<float> logits) override {
    for (size_t i = 1; i < logits.size(); i += 2) logits[i] = kNegInf;
  }
  void accept(int32_t token) override {
    if (token % 2) throw Error("odd token");
  }
};

TEST(Sampling, TheConstraintMasksEveryDrawAndSeesEveryToken) {
  SamplingParams p;
  p.seed = 7;
  p.constraint = std::make_shared<EvenIds>();
  std::vector<int32_t> prompt{1};
  Sampler s(p, 6, prompt);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits{0.f, 5.f, 0.5f, 5.f, 1.f, 5.f};
    const int32_t tok = s.sample(logits);
    EXPECT_EQ(tok % 2, 0);
    s.accept(tok);
  }
  EXPECT_THROW(s.accept(3), Error);  // the constraint's error reaches the caller
  p.temperature = 0;
  Sampler g(p, 6, prompt);
  std::vector<float> logits{0.f, 5.f, 0.5f, 5.f, 1.f, 5.f};
  EXPECT_EQ(g.sample(logits), 4);
}

}  // namespace
}  // namespace flashnext
