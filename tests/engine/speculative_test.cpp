// Speculative decoding (engine/speculative.h): greedy output equals decoding without speculation for K = 1..8 with
// both proposers on every fixture model, rollback after partial acceptance (an oracle proposer whose drafts go wrong
// half way), prompt-lookup drafts, the generator path against the reference's greedy tokens, seeded sampling, and
// the errors of --speculative.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

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
                st.mean_accepted_length(), (long long)st.refeeds);
        }
      }
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
        EXPECT_EQ(st.refeeds, spoil ? st.steps : 0);
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
