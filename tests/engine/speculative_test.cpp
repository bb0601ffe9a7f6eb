// Speculative decoding (engine/speculative.h): greedy output equals decoding without speculation for K = 1..8 with
// both proposers on every fixture model, rollback after partial acceptance (an oracle proposer whose drafts go wrong
// half way), prompt-lookup drafts, the generator path against the reference's greedy tokens, seeded sampling, the
// distribution of sampled speculation (acceptance rate and emitted tokens against the exact target distribution),
// and the errors of --speculative.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/sampling.h"
#include "fixture.h"
#include "model/fixture.h"

namespace flashnext {
namespace {

std::string src(const std::string& rel) {
  return std::string(FLASHNEXT_SOURCE_DIR) + "/" + rel;
}

const char* const kTinyA = "tests/data/fixtures/tiny-a/model";
const char* const kTinyB = "models/tiny-b-random";
const char* const kTinyMtp = "tests/data/fixtures/tiny-mtp/model";

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

std::vector<int32_t> prompt_for(const Model& model, int n, int salt) {
  std::vector<int32_t> p;
  const int64_t V = std::min<int64_t>(model.config().vocab_size, 400);
  for (int i = 0; i < n; ++i) p.push_back(int32_t((i * 131 + salt * 17 + 7) % V));
  return p;
}

/// Plain greedy decoding: `n` tokens, one forward each.
std::vector<int32_t> plain_greedy(Model& model, const std::vector<int32_t>& prompt, int n) {
  SequenceState seq = model.new_sequence();
  std::vector<float> row = model.forward(seq, prompt, LogitsMode::Last);
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    out.push_back(argmax(row));
    if (int(out.size()) < n) row = model.forward(seq, {&out.back(), 1}, LogitsMode::Last);
  }
  return out;
}

/// Speculative greedy decoding of `n` tokens; `seq_out` receives the sequence.
std::vector<int32_t> spec_greedy(SpeculativeDecoder& sd, Model& model, const std::vector<int32_t>& prompt, int n,
                                 SequenceState* seq_out = nullptr) {
  SequenceState seq = model.new_sequence();
  auto choose = [](std::span<float> row) { return argmax(row); };
  std::vector<int32_t> context = prompt, out;
  std::vector<float> first = sd.prefill(seq, prompt);
  out.push_back(choose(first));
  context.push_back(out.back());
  while (int(out.size()) < n) {
    const std::vector<int32_t> toks = sd.step(seq, context, choose);
    EXPECT_GE(toks.size(), 1u);
    EXPECT_EQ(seq.length, int64_t(context.size() + toks.size()) - 1);  // committed: everything but the last token
    context.insert(context.end(), toks.begin(), toks.end());
    out.insert(out.end(), toks.begin(), toks.end());
  }
  out.resize(size_t(n));
  if (seq_out) *seq_out = std::move(seq);
  return out;
}

TEST(Speculative, ParsesTheFlag) {
  EXPECT_FALSE(SpeculativeConfig::parse("").enabled());
  const SpeculativeConfig m = SpeculativeConfig::parse("mtp:3");
  EXPECT_EQ(m.method, SpeculativeConfig::Method::Mtp);
  EXPECT_EQ(m.k, 3);
  const SpeculativeConfig g = SpeculativeConfig::parse("ngram:8");
  EXPECT_EQ(g.method, SpeculativeConfig::Method::Ngram);
  EXPECT_EQ(g.k, 8);
  EXPECT_EQ(g.str(), "ngram:8");
  for (const char* bad : {"mtp:0", "mtp:9", "ngram:-1", "mtp", "mtp:", "mtp:2x", "eagle:3", "ngram3"}) {
    SCOPED_TRACE(bad);
    try {
      SpeculativeConfig::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--speculative"), std::string::npos) << e.what();
    }
  }
}

TEST(Speculative, NgramProposesWhatFollowedTheLastMatch) {
  using V = std::vector<int32_t>;
  // Suffix [1 2 3] occurs at 0: propose what followed it.
  EXPECT_EQ(ngram_propose(V{1, 2, 3, 4, 1, 2, 3}, 2), (V{4, 1}));
  EXPECT_EQ(ngram_propose(V{1, 2, 3, 4, 1, 2, 3}, 8), (V{4, 1, 2, 3}));  // up to the end of the context
  // The most recent earlier occurrence of [1 2] wins (index 3, followed by 8).
  EXPECT_EQ(ngram_propose(V{1, 2, 9, 1, 2, 8, 1, 2}, 1), (V{8}));
  // n falls back from 3 to 1: [6 7 6] and [7 6] occur nowhere earlier; [6] occurs at 1, followed by 7 6.
  EXPECT_EQ(ngram_propose(V{5, 6, 7, 6}, 3), (V{7, 6}));
  // A longer match is preferred over a more recent shorter one: [3 4 5] at 2 (-> 6), not [5] at 6 (-> 9).
  EXPECT_EQ(ngram_propose(V{1, 2, 3, 4, 5, 6, 5, 9, 3, 4, 5}, 1), (V{6}));
  EXPECT_TRUE(ngram_propose(V{1, 2, 3, 4}, 3).empty());
  EXPECT_TRUE(ngram_propose(V{1}, 3).empty());
  EXPECT_TRUE(ngram_propose(V{1, 1, 1}, 0).empty());
}

// Greedy output equals plain decoding for K = 1..8, both proposers, every fixture model.
TEST(Speculative, GreedyOutputEqualsPlainDecoding) {
  struct Case {
    const char* model;
    bool mtp;
  };
  for (const Case c : {Case{kTinyA, false}, Case{kTinyB, false}, Case{kTinyMtp, false}, Case{kTinyMtp, true}}) {
    Model& model = test::shared_model(c.model, c.mtp);
    for (int salt : {0, 1}) {
      const std::vector<int32_t> prompt = prompt_for(model, 30 + 7 * salt, salt);
      const int n = 40;
      const std::vector<int32_t> plain = plain_greedy(model, prompt, n);
      for (int k = 1; k <= SpeculativeConfig::kMaxDrafts; ++k) {
        for (auto method : {SpeculativeConfig::Method::Ngram, SpeculativeConfig::Method::Mtp}) {
          if (method == SpeculativeConfig::Method::Mtp && !c.mtp) continue;
          const SpeculativeConfig cfg{method, k};
          SCOPED_TRACE(std::string(c.model) + " " + cfg.str() + " salt " + std::to_string(salt));
          SpeculativeDecoder sd(model, cfg);
          EXPECT_EQ(spec_greedy(sd, model, prompt, n), plain);
          const SpeculativeStats& st = sd.stats();
          EXPECT_LE(st.accepted, st.drafted);
          EXPECT_EQ(st.emitted, st.steps + st.accepted);
          if (k == 4)
            std::printf(
                "[ spec ] %s %s salt %d: %lld steps, drafted %lld, accepted %lld, mean accepted length %.2f, "
                "%lld rollbacks\n",
                c.model, cfg.str().c_str(), salt, (long long)st.steps, (long long)st.drafted, (long long)st.accepted,
                st.mean_accepted_length(), (long long)st.rollbacks);
        }
      }
    }
  }
}

// MTP drafts under tensor parallelism (the MTP layer split over the ranks like a trunk layer): greedy output equal to
// plain decoding of the same model for K = 1, 3, 8, and drafts accepted at the rate TP 1 accepts them.
TEST(Speculative, MtpUnderTensorParallelismEqualsPlainDecoding) {
  Model& one = test::shared_model(kTinyMtp, true);
  const std::vector<int32_t> prompt = prompt_for(one, 30, 0);
  const int n = 40;
  for (int tp : {2, 4}) {
    ModelOptions o;
    o.load_mtp = true;
    o.tp = tp;
    std::unique_ptr<Model> model = Model::load(test::source_path(kTinyMtp), o);
    const std::vector<int32_t> plain = plain_greedy(*model, prompt, n);
    EXPECT_EQ(plain, plain_greedy(one, prompt, n)) << "tp " << tp;
    for (int k : {1, 3, 8}) {
      const SpeculativeConfig cfg{SpeculativeConfig::Method::Mtp, k};
      SpeculativeDecoder sd(*model, cfg), sd1(one, cfg);
      EXPECT_EQ(spec_greedy(sd, *model, prompt, n), plain) << "tp " << tp << " " << cfg.str();
      (void)spec_greedy(sd1, one, prompt, n);
      EXPECT_EQ(sd.stats().accepted, sd1.stats().accepted) << "tp " << tp << " " << cfg.str();
    }
  }
}

// An oracle proposer that knows the greedy continuation and spoils every draft from index K/2 on: each verify
// accepts exactly K/2 drafts, rolls back, and the output is still the plain one; without spoiling every draft is
// accepted and nothing rolls back.
TEST(Speculative, RollbackAfterRejectingHalfTheDrafts) {
  for (const char* dir : {kTinyA, kTinyMtp}) {
    Model& model = test::shared_model(dir, false);
    const int64_t V = model.config().vocab_size;
    const std::vector<int32_t> prompt = prompt_for(model, 26, 3);
    const int n = 36;
    const std::vector<int32_t> truth = plain_greedy(model, prompt, n + SpeculativeConfig::kMaxDrafts + 2);
    const std::vector<int32_t> plain(truth.begin(), truth.begin() + n);
    for (bool spoil : {true, false}) {
      for (int k = 1; k <= SpeculativeConfig::kMaxDrafts; ++k) {
        SCOPED_TRACE(std::string(dir) + " k " + std::to_string(k) + (spoil ? " spoiled" : " exact"));
        const size_t plen = prompt.size();
        SpeculativeDecoder sd(model, k, [&](std::span<const int32_t> context, int max_drafts) {
          std::vector<int32_t> d;
          const size_t at = context.size() - plen;  // output tokens so far; the next one is truth[at]
          for (int i = 0; i < max_drafts; ++i) {
            const int32_t t = truth[at + size_t(i)];
            d.push_back(spoil && i >= k / 2 ? int32_t((t + 1) % V) : t);
          }
          return d;
        });
        SequenceState seq;
        EXPECT_EQ(spec_greedy(sd, model, prompt, n, &seq), plain);
        const SpeculativeStats& st = sd.stats();
        ASSERT_GT(st.steps, 0);
        EXPECT_EQ(st.drafted, st.steps * k);
        EXPECT_EQ(st.accepted, st.steps * (spoil ? k / 2 : k));
        EXPECT_EQ(st.rollbacks, spoil ? st.steps : 0);
        EXPECT_EQ(st.refeeds, 0);  // one process: every rollback replays the accepted tokens (Model::replay_state)
        // The committed state continues like the plain one: its next logits row equals plain decoding's.
        SequenceState ref = model.new_sequence();
        const int64_t fed = seq.length;
        std::vector<int32_t> all = prompt;
        all.insert(all.end(), truth.begin(), truth.end());
        model.forward(ref, std::span<const int32_t>(all.data(), size_t(fed)), LogitsMode::Last);
        const int32_t next = all[size_t(fed)];
        const std::vector<float> a = model.forward(seq, {&next, 1}, LogitsMode::Last);
        const std::vector<float> b = model.forward(ref, {&next, 1}, LogitsMode::Last);
        double diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
        EXPECT_LE(diff, 1e-4);
      }
    }
  }
}

// stats_using: a step of K exact drafts makes K + 1 tokens; when only some are used (a stop condition cut it), the
// emitted count drops by the unused ones and the accepted count to the drafts among the used ones.
TEST(Speculative, StatsCountOnlyTheUsedTokensOfTheLastStep) {
  Model& model = test::shared_model(kTinyA, false);
  const std::vector<int32_t> prompt = prompt_for(model, 12, 5);
  const std::vector<int32_t> truth = plain_greedy(model, prompt, 8);
  const int k = 4;
  SpeculativeDecoder sd(model, k, [&](std::span<const int32_t> context, int max_drafts) {
    const size_t at = context.size() - prompt.size();
    return std::vector<int32_t>(truth.begin() + long(at), truth.begin() + long(at) + max_drafts);
  });
  SequenceState seq = model.new_sequence();
  std::vector<int32_t> context = prompt;
  std::vector<float> row = sd.prefill(seq, prompt);
  context.push_back(truth[0]);
  auto choose = [](std::span<float> r) { return int32_t(std::max_element(r.begin(), r.end()) - r.begin()); };
  const std::vector<int32_t> out = sd.step(seq, context, choose);
  ASSERT_EQ(out.size(), size_t(k + 1));
  EXPECT_EQ(sd.stats().emitted, k + 1);
  EXPECT_EQ(sd.stats().accepted, k);
  for (size_t used = 0; used <= out.size(); ++used) {
    const SpeculativeStats st = sd.stats_using(used);
    EXPECT_EQ(st.emitted, int64_t(used)) << used;
    EXPECT_EQ(st.accepted, int64_t(std::min<size_t>(used, k))) << used;
    EXPECT_EQ(st.drafted, k);
    EXPECT_EQ(st.steps, 1);
  }
}

// The generator with ngram drafts reproduces transformers' greedy tokens of the tiny-b fixture prompts.
TEST(Speculative, GeneratorReproducesTheReferenceGreedyTokens) {
  static LoadedModel m = LoadedModel::load(src(kTinyB));
  for (const char* name : {"chat0", "chat2", "code"}) {
    const auto expect = test::reference_ids(std::string(name) + ".greedy_ids");
    for (const char* spec : {"ngram:1", "ngram:3", "ngram:8"}) {
      SCOPED_TRACE(std::string(name) + " " + spec);
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = int64_t(expect.size());
      GenerationRequest req{test::reference_ids(std::string(name) + ".input_ids"), p, SpeculativeConfig::parse(spec)};
      Generator gen = generate(*m.model, m.tokenizer, m.generation, std::move(req));
      EXPECT_EQ(gen.output_ids(), expect);
      EXPECT_EQ(gen.stats().output_tokens, int64_t(expect.size()));
      EXPECT_GT(gen.speculative_stats().steps, 0);
      // The prefill made the first token, the verify steps the others: tokens a stop cut off are not counted.
      EXPECT_EQ(gen.speculative_stats().emitted, int64_t(expect.size()) - 1);
    }
  }
}

// Seeded sampling: one sample per emitted token in order, so a seeded sampled request gives the same tokens with
// and without speculation (the rejection rule for point-mass drafts), penalties included.
TEST(Speculative, SeededSamplingEqualsPlainSampling) {
  static LoadedModel m = LoadedModel::load(src(kTinyB));
  const auto prompt = test::reference_ids("code.input_ids");
  for (uint64_t seed : {1u, 2u, 3u}) {
    SamplingParams p;
    p.temperature = 0.7;
    p.top_p = 0.9;
    p.repetition_penalty = 1.1;
    p.seed = seed;
    p.max_tokens = 40;
    p.ignore_eos = true;
    Generator plain = generate(*m.model, m.tokenizer, m.generation, {prompt, p});
    for (const char* spec : {"ngram:2", "ngram:5"}) {
      SCOPED_TRACE(std::string(spec) + " seed " + std::to_string(seed));
      Generator sp = generate(*m.model, m.tokenizer, m.generation, {prompt, p, SpeculativeConfig::parse(spec)});
      EXPECT_EQ(sp.output_ids(), plain.output_ids());
    }
  }
}

// The MTP proposer's incremental state (catch-up over the accepted positions, draft positions discarded) equals a
// fresh recompute: at every step its drafts are the chained greedy drafts of the MTP layer run from scratch over the
// committed context. The target here is scripted to accept all drafts, or the first half, so that both the full-
// acceptance and the rollback paths feed the MTP catch-up (random weights never accept on their own).
TEST(Speculative, MtpDraftsEqualAFreshRecompute) {
  Model& model = test::shared_model(kTinyMtp, true);
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> prompt = prompt_for(model, 21, 5);
  // Chained greedy drafts from scratch after `context` (its last token not fed), with the top-2 gap of each.
  auto scratch = [&](const std::vector<int32_t>& context, int k, std::vector<double>& gaps) {
    SequenceState s = model.new_sequence();
    Tensor wide;
    const BatchItem item{&s, std::span<const int32_t>(context.data(), context.size() - 1), LogitsMode::Last};
    model.forward_batch({&item, 1}, nullptr, {}, &wide);
    const std::vector<int32_t> next(context.begin() + 1, context.end());
    Model::MtpOutput o = model.mtp_forward(s, wide, next, LogitsMode::Last);
    std::vector<int32_t> d;
    gaps.clear();
    Tensor state = o.wide.rows(o.wide.dim(0) - 1, o.wide.dim(0));
    for (int i = 0; i < k; ++i) {
      if (i > 0) {
        o = model.mtp_forward(s, state, {&d.back(), 1});
        state = o.wide;
      }
      const std::vector<float> row = model.download(o.logits);
      d.push_back(argmax(row));
      std::vector<float> sorted = row;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      gaps.push_back(double(sorted[0]) - double(sorted[1]));
    }
    return d;
  };
  for (bool half : {false, true}) {
    for (int k : {1, 3, 8}) {
      SCOPED_TRACE(std::string(half ? "half accepted" : "all accepted") + " k " + std::to_string(k));
      SpeculativeDecoder sd(model, SpeculativeConfig{SpeculativeConfig::Method::Mtp, k});
      SequenceState seq = model.new_sequence();
      std::vector<int32_t> context = prompt;
      std::vector<float> first = sd.prefill(seq, prompt);
      context.push_back(argmax(first));
      int64_t compared = 0;
      for (int step = 0; step < 6; ++step) {
        std::vector<double> gaps;
        const std::vector<int32_t> want = scratch(context, k, gaps);
        size_t row = 0;
        const size_t keep = half ? size_t(k / 2) : size_t(k);
        const std::vector<int32_t> toks = sd.step(seq, context, [&](std::span<float> logits) {
          const std::vector<int32_t>& d = sd.last_drafts();
          const size_t i = row++;
          if (i < d.size()) return i < keep ? d[i] : int32_t((d[i] + 1) % V);
          return argmax(logits);
        });
        const std::vector<int32_t>& got = sd.last_drafts();
        ASSERT_EQ(got.size(), size_t(k));
        for (int i = 0; i < k; ++i) {
          if (i > 0 && got[size_t(i) - 1] != want[size_t(i) - 1]) break;  // the chains part ways
          if (gaps[size_t(i)] < 1e-4) continue;                           // a near-tie may go either way
          EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "step " << step << " draft " << i;
          ++compared;
        }
        EXPECT_EQ(toks.size(), keep + 1);
        context.insert(context.end(), toks.begin(), toks.end());
        EXPECT_EQ(seq.length, int64_t(context.size()) - 1);
        // The MTP layer covers the positions committed before this step; it catches up at the next propose.
        EXPECT_EQ(seq.mtp_length, int64_t(context.size()) - 1 - int64_t(toks.size()));
      }
      EXPECT_GT(compared, 6 * k / 2);
      EXPECT_EQ(sd.stats().accepted, 6 * int64_t(half ? k / 2 : k));
    }
  }
}

// Seeded sampling through the sampler directly, MTP drafts included (on tiny-mtp, whose drafts the sampled target
// sometimes takes): the same tokens as plain sampled decoding with the same seed.
TEST(Speculative, SeededSamplingWithMtpEqualsPlainSampling) {
  Model& model = test::shared_model(kTinyMtp, true);
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> prompt = prompt_for(model, 19, 7);
  const int n = 48;
  for (uint64_t seed : {11u, 12u}) {
    SamplingParams p;
    p.temperature = 1.5;  // flat enough that the target takes some drafts
    p.top_k = 4;
    p.seed = seed;
    std::vector<int32_t> plain;
    {
      Sampler smp(p, V, prompt);
      SequenceState seq = model.new_sequence();
      std::vector<float> row = model.forward(seq, prompt, LogitsMode::Last);
      while (int(plain.size()) < n) {
        plain.push_back(smp.sample(row));
        smp.accept(plain.back());
        if (int(plain.size()) < n) row = model.forward(seq, {&plain.back(), 1}, LogitsMode::Last);
      }
    }
    for (const char* spec : {"mtp:1", "mtp:4", "ngram:3"}) {
      SCOPED_TRACE(std::string(spec) + " seed " + std::to_string(seed));
      Sampler smp(p, V, prompt);
      SpeculativeDecoder sd(model, SpeculativeConfig::parse(spec));
      SequenceState seq = model.new_sequence();
      auto choose = [&](std::span<float> row) {
        const int32_t t = smp.sample(row);
        smp.accept(t);
        return t;
      };
      std::vector<float> first = sd.prefill(seq, prompt);
      std::vector<int32_t> context = prompt, out{choose(first)};
      context.push_back(out.back());
      while (int(out.size()) < n) {
        for (int32_t t : sd.step(seq, context, choose)) out.push_back(t), context.push_back(t);
      }
      out.resize(size_t(n));
      EXPECT_EQ(out, plain);
      if (std::string(spec) == "mtp:4")
        std::printf("[ spec ] tiny-mtp sampled T=1.5 top-k 4 %s seed %llu: drafted %lld, accepted %lld\n", spec,
                    (unsigned long long)seed, (long long)sd.stats().drafted, (long long)sd.stats().accepted);
    }
  }
}

/// softmax(logits / T) in double, by the sampler's rule (sampling.cpp draw_row: weights exp((l - max) * float(1 / T))
/// over the whole row when no filter is on).
std::vector<double> target_probs(std::span<const float> logits, double temperature) {
  const float inv_t = float(1.0 / temperature);
  const double lmax = double(*std::max_element(logits.begin(), logits.end()));
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp((double(logits[i]) - lmax) * double(inv_t));
  for (double& x : p) x /= z;
  return p;
}

/// The upper-`alpha` quantile of the standard normal: bisection on Q(z) = erfc(z / sqrt 2) / 2.
double normal_upper_quantile(double alpha) {
  double lo = 0, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

/// The upper-`alpha` quantile of chi-square with `df` degrees of freedom, by the Wilson-Hilferty approximation
/// (E. B. Wilson, M. M. Hilferty, "The distribution of chi-square", PNAS 17 (1931) 684-688; Abramowitz & Stegun
/// 26.4.17): (X / df)^(1/3) is nearly normal with mean 1 - 2 / (9 df) and variance 2 / (9 df), so the quantile is
/// df (1 - 2 / (9 df) + z sqrt(2 / (9 df)))^3 with z the normal's upper-alpha quantile. At alpha = 1e-4 it is above
/// the exact quantile by 7% at df = 1, 1.1% at df = 10, 0.07% at df = 100 (a slightly looser threshold).
double chi_square_upper_quantile(double alpha, int df) {
  const double z = normal_upper_quantile(alpha), v = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - v + z * std::sqrt(v), 3.0);
}

struct ChiSquare {
  double stat = 0;      ///< Pearson's sum of (observed - expected)^2 / expected over the bins
  int df = 0;           ///< bins - 1
  double critical = 0;  ///< the 1e-4 upper tail of chi-square with df degrees of freedom
};

/// Pearson's goodness-of-fit test of the token counts `counts` against `probs` (summing to 1): one bin per token
/// whose expected count is >= 5, the others pooled into one bin (merged into the smallest bin when the pool's
/// expected count is below 5).
ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<std::pair<double, int64_t>> bins;  // (expected, observed)
  double pool_e = 0;
  int64_t pool_o = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = double(n) * probs[i];
    if (e >= 5) {
      bins.emplace_back(e, counts[i]);
    } else {
      pool_e += e;
      pool_o += counts[i];
    }
  }
  if (pool_e >= 5 || bins.empty()) {
    bins.emplace_back(pool_e, pool_o);
  } else {
    auto& smallest = *std::min_element(bins.begin(), bins.end());
    smallest.first += pool_e;
    smallest.second += pool_o;
  }
  ChiSquare c;
  for (const auto& [e, o] : bins) {
    if (e > 0) c.stat += (double(o) - e) * (double(o) - e) / e;
    if (e == 0 && o > 0) c.stat = INFINITY;  // a token the distribution never gives
  }
  c.df = int(bins.size()) - 1;
  c.critical = c.df > 0 ? chi_square_upper_quantile(1e-4, c.df) : 0.0;
  return c;
}

/// N draws at one position against the target distribution `p`: the share that took the draft `d` (`took`: accepted
/// by the verify, or for plain sampling the token equals d) is p(d) within 4.5 binomial standard errors; the tokens
/// follow p; the tokens of the draws that did not take d follow p without d, normalised. Both histograms by
/// chi_square, below its 1e-4 tail.
void expect_target_distribution(const std::string& what, const std::vector<int32_t>& tokens,
                                const std::vector<bool>& took, const std::vector<double>& p, int32_t d) {
  SCOPED_TRACE(what);
  const int64_t n = int64_t(tokens.size());
  const int64_t hits = std::count(took.begin(), took.end(), true);
  const double pd = p[size_t(d)], rate = double(hits) / double(n), se = std::sqrt(pd * (1 - pd) / double(n));
  EXPECT_LE(std::fabs(rate - pd), 4.5 * se) << "took the draft " << hits << " of " << n << " times (" << rate
                                            << "), expected p(d) = " << pd << " within 4.5 x " << se;
  std::vector<int64_t> all(p.size()), rejected(p.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    ++all[size_t(tokens[i])];
    if (!took[i]) ++rejected[size_t(tokens[i])];
  }
  std::vector<double> residual = p;  // max(p - q, 0) normalised for the point mass q at d
  residual[size_t(d)] = 0;
  for (double& x : residual) x /= 1 - pd;
  const ChiSquare c_all = chi_square(all, p), c_rej = chi_square(rejected, residual);
  EXPECT_GE(c_all.df, 1) << "too few draws for a chi-square test: " << n;
  EXPECT_LT(c_all.stat, c_all.critical) << "emitted tokens against p: chi-square " << c_all.stat << " with " << c_all.df
                                        << " degrees of freedom, the 1e-4 tail is " << c_all.critical;
  EXPECT_GE(c_rej.df, 1) << "too few rejections for a chi-square test: " << n - hits;
  EXPECT_LT(c_rej.stat, c_rej.critical) << "tokens after a rejection against p without d: chi-square " << c_rej.stat
                                        << " with " << c_rej.df << " degrees of freedom, the 1e-4 tail is "
                                        << c_rej.critical;
  std::printf(
      "[ spec ] %s: took d %lld of %lld = %.4f (p(d) %.4f, 4.5 se %.4f); chi-square %.1f (df %d, 1e-4 tail %.1f), "
      "after rejection %.1f (df %d, tail %.1f)\n",
      what.c_str(), (long long)hits, (long long)n, rate, pd, 4.5 * se, c_all.stat, c_all.df, c_all.critical, c_rej.stat,
      c_rej.df, c_rej.critical);
}

// Sampled speculation keeps the target distribution (as vLLM's rejection-sampler tests check it): at the first
// generated position, with a proposer that always drafts the same token d (K = 1), N seeded requests accept d with
// probability p(d) (binomial, 4.5 standard errors), emit tokens distributed as p, and after a rejection as p without
// d normalised, the residual max(p - q, 0) of the rejection rule for the point mass q at d (Leviathan et al., "Fast
// Inference from Transformers via Speculative Decoding", 2023, Theorem 1; Chen et al., "Accelerating Large Language
// Model Decoding with Speculative Sampling", 2023). p is computed from the model's logits with the request's
// temperature; histograms by Pearson's chi-square below its 1e-4 tail. Two cases: d the argmax at T = 0.1 (random
// weights are flat: at T = 1 the argmax has p < 0.01), and an unlikely d (the median token) at T = 1. Plain
// sampling of the same position (other seeds) passes the same checks, so that a broken sampler fails the control
// rather than hiding behind it.
TEST(Speculative, SampledSpeculationKeepsTheTargetDistribution) {
  Model& model = test::shared_model(kTinyMtp, false);
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> prompt = prompt_for(model, 8, 4);
  const std::span<const int32_t> head(prompt.data(), prompt.size() - 1);  // the prefill; prompt.back() is verified
  const int n = 4000;
  std::vector<float> row;
  {
    SequenceState seq = model.new_sequence();
    row = model.forward(seq, prompt, LogitsMode::Last);
  }
  struct Case {
    const char* name;
    double temperature;
    bool unlikely;  // d = the median token, else the argmax
  };
  for (const Case c : {Case{"argmax draft, T = 0.1", 0.1, false}, Case{"median draft, T = 1", 1.0, true}}) {
    SCOPED_TRACE(c.name);
    const std::vector<double> p = target_probs(row, c.temperature);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
    const int32_t d = order[c.unlikely ? size_t(V / 2) : 0];
    if (!c.unlikely) {
      ASSERT_GT(p[size_t(d)], 0.1) << "the fixture's argmax is too unlikely for a sizeable p(d)";
    }
    SamplingParams sp;
    sp.temperature = c.temperature;

    std::vector<int32_t> tokens, plain_tokens;
    std::vector<bool> took, plain_took;
    int64_t mismatched = 0;  // requests whose first token is d but the draft was rejected, or the reverse
    for (int i = 0; i < n; ++i) {
      sp.seed = uint64_t(i) + 1;
      Sampler smp(sp, V, prompt);
      SpeculativeDecoder sd(model, 1, [d](std::span<const int32_t>, int) { return std::vector<int32_t>{d}; });
      SequenceState seq = model.new_sequence();
      sd.prefill(seq, head);
      const std::vector<int32_t> out = sd.step(seq, prompt, [&](std::span<float> logits) {
        const int32_t t = smp.sample(logits);
        smp.accept(t);
        return t;
      });
      const bool accepted = sd.stats().accepted == 1;
      ASSERT_EQ(sd.stats().drafted, 1);
      ASSERT_EQ(out.size(), accepted ? 2u : 1u) << "seed " << *sp.seed;
      mismatched += (out[0] == d) != accepted;
      tokens.push_back(out[0]);
      took.push_back(accepted);
    }
    EXPECT_EQ(mismatched, 0) << "of " << n << " requests, draft " << d;
    for (int i = 0; i < n; ++i) {  // the control: plain sampling, other seeds
      sp.seed = uint64_t(n + i) + 1;
      Sampler smp(sp, V, prompt);
      SequenceState seq = model.new_sequence();
      std::vector<float> logits = model.forward(seq, prompt, LogitsMode::Last);
      plain_tokens.push_back(smp.sample(logits));
      plain_took.push_back(plain_tokens.back() == d);
    }
    expect_target_distribution(std::string("tiny-mtp ") + c.name + " speculative", tokens, took, p, d);
    expect_target_distribution(std::string("tiny-mtp ") + c.name + " plain", plain_tokens, plain_took, p, d);
  }
}

// At the end of the context the drafts shrink (the verify must fit max_position_embeddings) down to none; the output
// is still the plain one up to the last position.
TEST(Speculative, DraftsShrinkAtTheContextLength) {
  for (bool mtp : {false, true}) {
    Model& model = test::shared_model(kTinyMtp, mtp);
    const int64_t max_pos = model.config().max_position_embeddings;
    std::vector<int32_t> prompt = prompt_for(model, int(max_pos - 9), 2);
    const int n = 9;  // prompt + n = max_pos; the last token is never fed
    const std::vector<int32_t> plain = plain_greedy(model, prompt, n);
    SpeculativeDecoder sd(
        model, SpeculativeConfig{mtp ? SpeculativeConfig::Method::Mtp : SpeculativeConfig::Method::Ngram, 8});
    SequenceState seq;
    EXPECT_EQ(spec_greedy(sd, model, prompt, n, &seq), plain);
    EXPECT_LE(seq.length, max_pos - 1);
  }
}

TEST(Speculative, MtpWithoutTheLayerFails) {
  Model& model = test::shared_model(kTinyA, false);
  try {
    SpeculativeDecoder sd(model, SpeculativeConfig::parse("mtp:2"));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative mtp:2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashnext
