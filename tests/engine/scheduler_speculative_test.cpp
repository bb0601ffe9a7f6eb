// Speculative decoding in the scheduler (`serve --speculative`, docs/ENGINE.md "Speculative decoding in serve") on
// the CPU oracle: a batch of mixed requests (some opted out, different prompt lengths, chunked prefill, preemption,
// prefix caching) gives the same greedy tokens as the same scheduler without speculation, for K = 1, 3, 8 with both
// proposers; an oracle proposer that knows the output and spoils every draft from K/2 on gives exactly the
// acceptance counts that follow from it; EOS / stop ids inside accepted drafts cut the output where decoding
// without speculation ends it; seeded sampling gives the tokens of plain sampling; bad settings are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/prefix_cache_test_util.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/fixture.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {
namespace {

const char* const kTinyA = "tests/data/fixtures/tiny-a/model";
const char* const kTinyMtp = "tests/data/fixtures/tiny-mtp/model";

struct SpecSetup {
  SpeculativeConfig spec{};
  Proposer proposer{};
  int64_t blocks = 256;  ///< KV blocks of kBlock positions
  bool prefix_caching = false;
  int64_t max_num_seqs = 6;
  int64_t max_num_batched_tokens = 64;
  int64_t chunk = 16;
  int64_t max_model_len = 256;
  /// Rollback states in the planner's checkpoint slots (as serve has them); false: a fresh copy per verify.
  bool checkpoint_slots = true;
};

/// A scheduler over a ModelRunner of `model` as serve builds it (float32 caches, host sampling).
struct SpecEngine {
  SpecEngine(Model& model, const SpecSetup& e) : planner(make_planner(model, e)), runner(model, planner, false) {
    sched = std::make_unique<Scheduler>(runner, planner,
                                        SchedulerConfig{.max_num_seqs = e.max_num_seqs,
                                                        .max_num_batched_tokens = e.max_num_batched_tokens,
                                                        .prefill_chunk_size = e.chunk,
                                                        .max_model_len = e.max_model_len,
                                                        .speculative = e.spec,
                                                        .proposer = e.proposer});
  }
  static MemoryPlanner make_planner(const Model& model, const SpecSetup& e) {
    const ModelConfig& cfg = model.config();
    StatePlan plan = state_plan(cfg, 1, 4, 4);
    plan.indexer_bytes_per_token += plan.indexer_bytes_per_token / cfg.indexer_compress_ratio;
    MemoryPlanner probe(plan, kBlock, int64_t(1) << 30, e.max_num_seqs);
    const int64_t snapshots = e.prefix_caching ? 16 : 0;
    const int64_t budget = (e.max_num_seqs + snapshots) * probe.slot_bytes() + e.blocks * probe.block_bytes();
    const int64_t checkpoints = e.spec.enabled() && e.checkpoint_slots ? e.max_num_seqs : 0;
    return MemoryPlanner(plan, kBlock, budget + checkpoints * probe.slot_bytes(), e.max_num_seqs,
                         {.enabled = e.prefix_caching, .snapshot_interval_blocks = 1, .num_snapshots = snapshots},
                         checkpoints);
  }
  MemoryPlanner planner;
  ModelRunner runner;
  std::unique_ptr<Scheduler> sched;
};

/// Ids in [0, vocab) with repeats (so that prompt lookup finds matches): a random head, then pieces of it again.
std::vector<int32_t> prompt_of(int64_t n, uint64_t salt, int64_t vocab) {
  std::vector<int32_t> p;
  uint64_t x = salt * 0x9E3779B97F4A7C15ull + 7;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  while (int64_t(p.size()) < n) {
    if (p.size() >= 8 && next() % 3 == 0) {  // repeat 3..6 earlier tokens
      const size_t from = size_t(next() % (p.size() - 6)), len = 3 + size_t(next() % 4);
      for (size_t i = 0; i < len && int64_t(p.size()) < n; ++i) p.push_back(p[from + i]);
    } else {
      p.push_back(int32_t(next() % uint64_t(vocab)));
    }
  }
  return p;
}

struct Spec {
  int64_t prompt_len, max_tokens;
  int speculative_tokens;  // -1: the server's K; 0: opted out
  int biased = 0;          // > 0: logit_bias +40 on this many tokens (see kMixed)
};
// Different prompt lengths (chunks of 16: one, several, a partial last), two opted out, one with fewer drafts. The
// random-weight models seldom repeat themselves, so prompt lookup finds little to draft: two requests bias the
// choice to 3 and 2 tokens (still the model's argmax among them), whose output then repeats, so that ngram drafts
// are accepted and rejected.
const std::vector<Spec> kMixed = {{5, 30, -1},  {23, 24, 0}, {40, 32, -1},    {3, 20, 2},
                                  {57, 28, -1}, {17, 36, 0}, {12, 40, -1, 3}, {33, 30, -1, 2}};

/// The requests of `specs` for a scheduler that drafts `k` tokens (their speculative_tokens at most k; k = 0: without
/// speculation, which takes only the opt-out).
std::vector<Request> mixed_requests(const Model& model, const std::vector<Spec>& specs = kMixed, int k = 8) {
  std::vector<Request> rs;
  for (size_t i = 0; i < specs.size(); ++i) {
    Request r = greedy_request("m" + std::to_string(i),
                               prompt_of(specs[i].prompt_len, 100 + i, model.config().vocab_size), specs[i].max_tokens);
    for (int j = 0; j < specs[i].biased; ++j) r.sampling.logit_bias.emplace_back(int32_t(11 + 29 * j), 40.f);
    const int want = specs[i].speculative_tokens;
    r.speculative_tokens = want <= 0 ? (k > 0 || want == 0 ? want : -1) : (k > 0 ? std::min(want, k) : -1);
    rs.push_back(std::move(r));
  }
  return rs;
}

/// Submits all requests, then runs them together.
std::vector<Outcome> together(Scheduler& s, std::vector<Request> requests) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (Request& r : requests) {
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  run_all(s);
  std::vector<Outcome> out;
  for (auto& st : streams) out.push_back(drain(*st));
  return out;
}

/// Runs the requests one after another, each to its end.
std::vector<Outcome> each(Scheduler& s, std::vector<Request> requests) {
  std::vector<Outcome> out;
  for (Request& r : requests) {
    auto st = r.stream;
    s.submit(std::move(r));
    run_all(s);
    out.push_back(drain(*st));
  }
  return out;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<Outcome>& o) {
  std::vector<std::vector<int32_t>> t;
  for (const Outcome& x : o) t.push_back(x.tokens);
  return t;
}

/// Checks the speculative totals against each other and the memory against its release.
void expect_consistent(const SchedulerStats& st) {
  EXPECT_GT(st.spec_verify_steps, 0);
  EXPECT_LE(st.spec_accepted, st.spec_drafted);
  EXPECT_GE(st.spec_drafted, st.spec_verify_steps);
  // Nothing cuts a verify here (max_tokens bounds the drafts, EOS is ignored): one token per step besides the
  // accepted drafts.
  EXPECT_EQ(st.spec_emitted, st.spec_verify_steps + st.spec_accepted);
  EXPECT_LE(st.spec_rollbacks, st.spec_verify_steps);
  int64_t per_pos = 0;
  for (int64_t a : st.spec_accepted_per_pos) per_pos += a;
  EXPECT_EQ(per_pos, st.spec_accepted);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
}

// Greedy: a mixed batch gives the tokens of the scheduler without speculation, K = 1, 3, 8, ngram on tiny-a and
// tiny-mtp, MTP on tiny-mtp.
TEST(SchedulerSpeculative, MixedGreedyBatchEqualsDecodingWithoutSpeculation) {
  struct Case {
    const char* model;
    bool mtp;
  };
  for (const Case c : {Case{kTinyA, false}, Case{kTinyMtp, true}}) {
    Model& model = shared_model(c.model, c.mtp);
    SpecEngine plain(model, {});
    const auto want = tokens_of(together(*plain.sched, mixed_requests(model, kMixed, 0)));
    for (size_t i = 0; i < kMixed.size(); ++i) ASSERT_EQ(int64_t(want[i].size()), kMixed[i].max_tokens);
    for (auto method : {SpeculativeConfig::Method::Ngram, SpeculativeConfig::Method::Mtp}) {
      if (method == SpeculativeConfig::Method::Mtp && !c.mtp) continue;
      for (int k : {1, 3, 8}) {
        const SpeculativeConfig cfg{method, k};
        SCOPED_TRACE(std::string(c.model) + " " + cfg.str());
        SpecEngine spec(model, {.spec = cfg, .checkpoint_slots = k != 3});  // K = 3: fresh copies of the state
        EXPECT_EQ(spec.planner.pool_slots(), 6 + (k != 3 ? 6 : 0));
        EXPECT_EQ(tokens_of(together(*spec.sched, mixed_requests(model, kMixed, k))), want);
        const SchedulerStats st = spec.sched->stats();
        expect_consistent(st);
        if (method == SpeculativeConfig::Method::Ngram) {  // the biased requests repeat themselves
          EXPECT_GT(st.spec_accepted, 0);
          EXPECT_GT(st.spec_rollbacks, 0);
        }
        std::printf("[ spec ] %s %s: %lld verify steps, drafted %lld, accepted %lld, %lld rollbacks, %lld steps\n",
                    c.model, cfg.str().c_str(), (long long)st.spec_verify_steps, (long long)st.spec_drafted,
                    (long long)st.spec_accepted, (long long)st.spec_rollbacks, (long long)st.steps);
      }
    }
  }
}

/// Per request (by prompt length): the greedy output without speculation; the proposer drafts from it.
struct Oracle {
  std::map<size_t, std::vector<int32_t>> truth;
  int k = 0;
  bool spoil = false;
  int64_t vocab = 0;
  std::vector<int> calls;  // max_drafts of every call
  Proposer proposer() {
    return [this](std::span<const int32_t> context, int max_drafts) {
      calls.push_back(max_drafts);
      for (const auto& [plen, t] : truth) {
        if (context.size() < plen || context.size() - plen > t.size()) continue;
        // The request whose prompt has this length: the output so far must be a prefix of its truth.
        const size_t at = context.size() - plen;
        if (!std::equal(t.begin(), t.begin() + int64_t(at), context.begin() + int64_t(plen))) continue;
        std::vector<int32_t> d;
        for (int i = 0; i < max_drafts; ++i) {
          const int32_t x = t[std::min(at + size_t(i), t.size() - 1)];
          d.push_back(spoil && i >= k / 2 ? int32_t((x + 1) % vocab) : x);
        }
        return d;
      }
      ADD_FAILURE() << "the oracle knows no request of this context";
      return std::vector<int32_t>{};
    };
  }
};

// An oracle proposer: every verify accepts exactly min(K/2, drafts) drafts when spoiled from K/2 on (rolling back
// when it drafted more), all of them otherwise; the output is the plain one either way. Preemption by a small pool.
TEST(SchedulerSpeculative, OracleDraftsGiveTheAcceptanceTheyImplyAndTheSameTokens) {
  Model& model = shared_model(kTinyA, false);
  const std::vector<Spec> specs = {{5, 30, -1}, {23, 24, -1}, {40, 32, -1}, {3, 20, -1}, {57, 28, -1}, {17, 36, -1}};
  SpecEngine plain(model, {.max_model_len = 96});
  const auto want = tokens_of(together(*plain.sched, mixed_requests(model, specs)));
  for (int64_t blocks : {int64_t(256), int64_t(14)}) {  // 14 blocks of 16 for 6 sequences of up to 85 positions
    for (bool spoil : {true, false}) {
      for (int k : {1, 3, 8}) {
        SCOPED_TRACE("k " + std::to_string(k) + (spoil ? " spoiled" : " exact") + " blocks " + std::to_string(blocks));
        Oracle oracle;
        for (size_t i = 0; i < specs.size(); ++i) oracle.truth[size_t(specs[i].prompt_len)] = want[i];
        oracle.k = k;
        oracle.spoil = spoil;
        oracle.vocab = model.config().vocab_size;
        SpecEngine spec(model, {.spec = {SpeculativeConfig::Method::Custom, k},
                                .proposer = oracle.proposer(),
                                .blocks = blocks,
                                .max_model_len = 96});
        EXPECT_EQ(tokens_of(together(*spec.sched, mixed_requests(model, specs))), want);
        const SchedulerStats st = spec.sched->stats();
        expect_consistent(st);
        int64_t drafted = 0, accepted = 0, rollbacks = 0;
        for (int m : oracle.calls) {
          EXPECT_GE(m, 1);
          EXPECT_LE(m, k);
          drafted += m;
          const int a = spoil ? std::min(m, k / 2) : m;
          accepted += a;
          rollbacks += a < m;
        }
        EXPECT_EQ(st.spec_verify_steps, int64_t(oracle.calls.size()));
        EXPECT_EQ(st.spec_drafted, drafted);
        EXPECT_EQ(st.spec_accepted, accepted);
        EXPECT_EQ(st.spec_rollbacks, rollbacks);
        if (blocks < 256) {
          EXPECT_GT(st.preemptions, 0);
        }
      }
    }
  }
}

// EOS and stop token ids inside a run of accepted drafts end the output exactly where decoding without speculation
// ends it (the stop token included, nothing after it).
TEST(SchedulerSpeculative, StopTokensInsideAcceptedDraftsCutTheOutputExactly) {
  Model& model = shared_model(kTinyA, false);
  const std::vector<Spec> specs = {{9, 40, -1}, {31, 40, -1}};
  SpecEngine plain(model, {});
  const auto full = tokens_of(together(*plain.sched, mixed_requests(model, specs)));
  for (bool via_eos : {true, false}) {
    for (size_t cut : {size_t(0), size_t(5), size_t(17)}) {
      SCOPED_TRACE(std::string(via_eos ? "eos" : "stop_token_ids") + " at " + std::to_string(cut));
      auto make = [&] {
        std::vector<Request> rs = mixed_requests(model, specs);
        for (size_t i = 0; i < rs.size(); ++i) {
          const int64_t stop = full[i][cut];
          rs[i].sampling.ignore_eos = false;
          (via_eos ? rs[i].eos_token_ids : rs[i].sampling.stop_token_ids).push_back(stop);
        }
        return rs;
      };
      SpecEngine base(model, {});
      const auto want = tokens_of(together(*base.sched, make()));
      for (size_t i = 0; i < specs.size(); ++i) {
        // The first occurrence of the stop token ends it.
        const auto end = std::find(full[i].begin(), full[i].end(), full[i][cut]);
        ASSERT_EQ(want[i], std::vector<int32_t>(full[i].begin(), end + 1));
      }
      Oracle oracle;
      for (size_t i = 0; i < specs.size(); ++i) oracle.truth[size_t(specs[i].prompt_len)] = full[i];
      oracle.k = 8;
      oracle.vocab = model.config().vocab_size;
      SpecEngine spec(model, {.spec = {SpeculativeConfig::Method::Custom, 8}, .proposer = oracle.proposer()});
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (Request& r : make()) {
        streams.push_back(r.stream);
        spec.sched->submit(std::move(r));
      }
      run_all(*spec.sched);
      for (size_t i = 0; i < specs.size(); ++i) {
        std::vector<int32_t> got;
        EndReason end = EndReason::None;
        std::optional<int32_t> stop_token;
        for (;;) {
          auto u = streams[i]->wait(std::chrono::milliseconds(0));
          got.insert(got.end(), u.tokens.begin(), u.tokens.end());
          if (u.finish != EndReason::None) {
            end = u.finish;
            stop_token = u.stop_token;
            break;
          }
          ASSERT_FALSE(u.tokens.empty()) << "the request did not finish";
        }
        EXPECT_EQ(got, want[i]);
        EXPECT_EQ(end, EndReason::Stop);
        EXPECT_EQ(stop_token, full[i][cut]);
      }
      const SchedulerStats st = spec.sched->stats();
      EXPECT_EQ(st.kv_blocks_used, 0);
      // A cut inside a verify emits fewer tokens than it accepted: emitted = steps + accepted only without cuts.
      EXPECT_LE(st.spec_emitted, st.spec_verify_steps + st.spec_accepted);
    }
  }
}

// The context length and max_tokens bound the drafts: a request that ends at max_model_len or at max_tokens gives
// the tokens of plain decoding (and never feeds a position past max_model_len).
TEST(SchedulerSpeculative, ContextLengthAndMaxTokensEndTheOutputAsWithoutSpeculation) {
  Model& model = shared_model(kTinyA, false);
  const std::vector<Spec> specs = {{40, 24, -1}, {45, 19, -1}, {10, 7, -1}};  // the first two end at 64 tokens
  SpecEngine plain(model, {.max_model_len = 64});
  const auto want = tokens_of(together(*plain.sched, mixed_requests(model, specs)));
  EXPECT_EQ(want[0].size(), 24u);
  EXPECT_EQ(want[1].size(), 19u);
  Oracle oracle;
  for (size_t i = 0; i < specs.size(); ++i) oracle.truth[size_t(specs[i].prompt_len)] = want[i];
  oracle.k = 8;
  oracle.vocab = model.config().vocab_size;
  SpecEngine spec(model,
                  {.spec = {SpeculativeConfig::Method::Custom, 8}, .proposer = oracle.proposer(), .max_model_len = 64});
  EXPECT_EQ(tokens_of(together(*spec.sched, mixed_requests(model, specs))), want);
  expect_consistent(spec.sched->stats());
  // The last verify of each request drafts only what it can still emit: max_drafts + 1 <= tokens left.
  EXPECT_LE(*std::max_element(oracle.calls.begin(), oracle.calls.end()), 8);
}

// Seeded sampling: one draw per emitted token in order, so a seeded request gives the tokens it gives without
// speculation (the rejection rule for point-mass drafts), with drafts that are all right, half wrong, or ngram's.
TEST(SchedulerSpeculative, SeededSamplingEqualsSamplingWithoutSpeculation) {
  Model& model = shared_model(kTinyA, false);
  auto make = [&](bool spec) {
    std::vector<Request> rs = mixed_requests(model, kMixed, spec ? 3 : 0);
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i].sampling.temperature = 0.8;
      rs[i].sampling.top_p = 0.95;
      rs[i].sampling.repetition_penalty = 1.05;
      rs[i].sampling.seed = 7 + i;
    }
    return rs;
  };
  SpecEngine plain(model, {});
  const auto want = tokens_of(together(*plain.sched, make(false)));
  {
    SpecEngine again(model, {});
    ASSERT_EQ(tokens_of(together(*again.sched, make(false))), want);  // the seed fixes the draws
  }
  for (bool spoil : {false, true}) {
    Oracle oracle;
    for (size_t i = 0; i < kMixed.size(); ++i) oracle.truth[size_t(kMixed[i].prompt_len)] = want[i];
    oracle.k = 3;
    oracle.spoil = spoil;
    oracle.vocab = model.config().vocab_size;
    SpecEngine spec(model, {.spec = {SpeculativeConfig::Method::Custom, 3}, .proposer = oracle.proposer()});
    EXPECT_EQ(tokens_of(together(*spec.sched, make(true))), want) << (spoil ? "spoiled" : "exact");
    const SchedulerStats st = spec.sched->stats();
    expect_consistent(st);
    if (!spoil) {
      EXPECT_EQ(st.spec_accepted, st.spec_drafted);
    }
  }
  SpecEngine ngram(model, {.spec = SpeculativeConfig::parse("ngram:3")});
  EXPECT_EQ(tokens_of(together(*ngram.sched, make(true))), want);
  // n = 3 samples of one prompt (prefilled once, forked), one with log-probabilities (host sampling either way).
  auto group = [&] {
    std::vector<Request> g;
    for (int i = 0; i < 3; ++i) {
      Request r = greedy_request("g" + std::to_string(i), prompt_of(29, 5, model.config().vocab_size), 25);
      r.sampling.temperature = 0.9;
      r.sampling.seed = 50 + i;
      if (i == 1) r.top_logprobs = 2;
      g.push_back(std::move(r));
    }
    return g;
  };
  auto run_group = [&](SpecEngine& e) {
    std::vector<Request> g = group();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto& r : g) streams.push_back(r.stream);
    e.sched->submit_group(std::move(g));
    run_all(*e.sched);
    std::vector<std::vector<int32_t>> out;
    for (auto& st : streams) out.push_back(drain(*st).tokens);
    return out;
  };
  SpecEngine plain_group(model, {});
  const auto want_group = run_group(plain_group);
  EXPECT_NE(want_group[0], want_group[1]);  // different seeds, different samples
  // The three share a prompt: the drafts come from the first sample's tokens, right for it, mostly wrong for the
  // others.
  SpecEngine spec_group(model, {.spec = {SpeculativeConfig::Method::Custom, 3}, .proposer = [&](auto c, int m) {
                                  std::vector<int32_t> d;
                                  const size_t at = c.size() - 29;
                                  for (int i = 0; i < m; ++i)
                                    d.push_back(want_group[0][std::min(at + size_t(i), want_group[0].size() - 1)]);
                                  return d;
                                }});
  EXPECT_EQ(run_group(spec_group), want_group);
  EXPECT_GT(spec_group.sched->stats().spec_accepted, 0);
}

// Prefix caching and speculation together: requests that share a cached prefix give the tokens of the engine with
// neither (verify positions lie past the prompt, which alone is cached).
TEST(SchedulerSpeculative, PrefixCachingAndSpeculationTogetherGiveTheSameTokens) {
  for (bool mtp : {false, true}) {
    Model& model = shared_model(mtp ? kTinyMtp : kTinyA, mtp);
    const auto root = prompt_of(48, 9, model.config().vocab_size);
    auto make = [&] {
      std::vector<Request> rs;
      for (int i = 0; i < 4; ++i)
        rs.push_back(greedy_request("p" + std::to_string(i),
                                    concat(root, prompt_of(5 + 3 * i, 60 + i, model.config().vocab_size)), 24));
      return rs;
    };
    SpecEngine plain(model, {});
    const auto want = tokens_of(each(*plain.sched, make()));
    SpecEngine both(model, {.spec = {mtp ? SpeculativeConfig::Method::Mtp : SpeculativeConfig::Method::Ngram, 4},
                            .prefix_caching = true});
    EXPECT_EQ(tokens_of(each(*both.sched, make())), want) << (mtp ? "mtp" : "ngram");
    const SchedulerStats st = both.sched->stats();
    EXPECT_GE(st.prefix_cache_hits, 3 * 48);
    EXPECT_GT(st.spec_verify_steps, 0);
  }
}

// Tensor parallelism (serve --tp 2 and 4 on the CPU): checkpoints and rollbacks copy every rank's state slot; the
// oracle's half-spoiled drafts give TP N's own tokens without speculation.
TEST(SchedulerSpeculative, TensorParallelRanksRollBackTogether) {
  for (int tp : {2, 4}) {
    ModelOptions o;
    o.tp = tp;
    auto model = Model::load(std::string(FLASHNEXT_SOURCE_DIR) + "/" + kTinyA, o);
    SpecEngine plain(*model, {});
    const auto want = tokens_of(together(*plain.sched, mixed_requests(*model, kMixed, 0)));
    for (bool slots : {true, false}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + (slots ? " checkpoint slots" : " fresh copies"));
      Oracle oracle;
      for (size_t i = 0; i < kMixed.size(); ++i) oracle.truth[size_t(kMixed[i].prompt_len)] = want[i];
      oracle.k = 4;
      oracle.spoil = true;
      oracle.vocab = model->config().vocab_size;
      SpecEngine spec(
          *model,
          {.spec = {SpeculativeConfig::Method::Custom, 4}, .proposer = oracle.proposer(), .checkpoint_slots = slots});
      EXPECT_EQ(tokens_of(together(*spec.sched, mixed_requests(*model, kMixed, 4))), want);
      const SchedulerStats st = spec.sched->stats();
      expect_consistent(st);
      EXPECT_GT(st.spec_rollbacks, 0);
    }
  }
}

// A runner over a synthetic model (the state is a hash of the tokens fed; the logits, and the "device" draws, a
// function of it) that samples on the "device", to check what the scheduler asks of a device-sampling runner: every
// verify row sampled with offset num_output + r, checkpoints and rollbacks, and KV blocks for every position fed.
constexpr int64_t kFakeVocab = 16;
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct FakeSeq : RunnerSequence {
  uint64_t h = 0;
  int64_t length = 0;
  std::optional<std::pair<uint64_t, int64_t>> saved;
  std::vector<int32_t> verified;  // the ids of the verify after the checkpoint (a replaying runner's kept inputs)
};
class DeviceFakeRunner : public Runner {
 public:
  int64_t vocab_size() const override { return kFakeVocab; }
  std::unique_ptr<RunnerSequence> new_sequence(int32_t) override { return std::make_unique<FakeSeq>(); }
  bool samples_on_device() const override { return true; }
  bool checkpoint(RunnerSequence& seq) override {
    auto& s = static_cast<FakeSeq&>(seq);
    EXPECT_FALSE(s.saved) << "a checkpoint is still held";
    s.saved = {s.h, s.length};
    return true;
  }
  // `replays`: the state is advanced over the accepted tokens (as ModelRunner does); otherwise the scheduler feeds
  // them again.
  explicit DeviceFakeRunner(bool replays = false) : replays_(replays) {}
  int64_t rollback(RunnerSequence& seq, int64_t keep) override {
    auto& s = static_cast<FakeSeq&>(seq);
    EXPECT_TRUE(s.saved);
    EXPECT_GE(keep, 1);
    EXPECT_LT(keep, int64_t(s.verified.size())) << "a rollback keeps fewer tokens than the verify fed";
    std::tie(s.h, s.length) = *s.saved;
    s.saved.reset();
    ++rollbacks;
    if (!replays_) return 0;
    for (int64_t j = 0; j < keep; ++j) feed(s, s.verified[size_t(j)]);
    return keep;
  }
  void release_checkpoint(RunnerSequence& seq) override { static_cast<FakeSeq&>(seq).saved.reset(); }
  // Greedy: the largest of a pseudo-random row; sampled: a draw of (seed, offset, state).
  static int32_t choose(uint64_t h, const TokenSampling& t, uint64_t offset) {
    if (t.temperature > 0) return int32_t(mix64(t.seed ^ (offset << 20) ^ h) % kFakeVocab);
    int32_t best = 0;
    for (int32_t v = 1; v < kFakeVocab; ++v)
      if (mix64(h ^ uint64_t(v + 1)) > mix64(h ^ uint64_t(best + 1))) best = v;
    return best;
  }
  static void feed(FakeSeq& s, int32_t id) {
    s.h = mix64(s.h ^ (uint64_t(id) * 0x100000001B3ull));
    ++s.length;
  }
  void forward(std::span<Item> items) override {
    for (Item& it : items) {
      auto& s = static_cast<FakeSeq&>(*it.seq);
      EXPECT_TRUE(it.sampling || it.logits.empty()) << "host logits asked of a device-sampling request";
      if (s.saved) s.verified.assign(it.ids.begin(), it.ids.end());
      for (size_t j = 0; j < it.ids.size(); ++j) {
        feed(s, it.ids[j]);
        if (!it.row_tokens.empty()) it.row_tokens[j] = choose(s.h, *it.sampling, it.sampling->offset + j);
      }
      EXPECT_LE(s.length, int64_t(it.block_table.size()) * kBlock) << "fed past the KV blocks assigned";
      if (it.sampling) it.token = choose(s.h, *it.sampling, it.sampling->offset);
      if (!it.row_tokens.empty()) it.token = it.row_tokens.back();
      verify_items += !it.row_tokens.empty();
    }
  }
  int64_t verify_items = 0, rollbacks = 0;

 private:
  bool replays_ = false;
};

TEST(SchedulerSpeculative, DeviceSamplingVerifiesEveryRowWithTheOffsetsOfPlainDecoding) {
  auto make = [](bool sampled) {
    std::vector<Request> rs;
    for (int i = 0; i < 5; ++i) {
      Request r = greedy_request("d" + std::to_string(i), prompt_of(4 + 9 * i, 40 + i, kFakeVocab), 30 + 3 * i);
      if (sampled) {
        r.sampling.temperature = 0.9;
        r.sampling.seed = 100 + i;
      }
      rs.push_back(std::move(r));
    }
    return rs;
  };
  auto run = [&](bool sampled, const SpeculativeConfig& spec, Proposer proposer, DeviceFakeRunner& runner) {
    StatePlan plan;
    plan.kv_bytes_per_token = 4;
    MemoryPlanner planner(plan, kBlock, 4 * kBlock * 64, 4);
    Scheduler s(runner, std::move(planner),
                {.max_num_seqs = 4,
                 .max_num_batched_tokens = 40,
                 .prefill_chunk_size = 8,
                 .max_model_len = 128,
                 .speculative = spec,
                 .proposer = std::move(proposer)});
    auto out = tokens_of(together(s, make(sampled)));
    EXPECT_EQ(s.stats().kv_blocks_used, 0);
    return std::make_pair(out, s.stats());
  };
  for (bool sampled : {false, true}) {
    DeviceFakeRunner plain_runner;
    const auto want = run(sampled, {}, {}, plain_runner).first;
    EXPECT_EQ(plain_runner.verify_items, 0);
    for (auto [spoil, replays] : {std::pair{false, false}, {true, false}, {true, true}}) {
      SCOPED_TRACE(std::string(sampled ? "sampled" : "greedy") + (spoil ? " spoiled" : " exact") +
                   (replays ? ", rollbacks replay the accepted tokens" : ", rollbacks feed them again"));
      Oracle oracle;
      const auto rs = make(sampled);
      for (size_t i = 0; i < rs.size(); ++i) oracle.truth[rs[i].prompt.size()] = want[i];
      oracle.k = 4;
      oracle.spoil = spoil;
      oracle.vocab = kFakeVocab;
      DeviceFakeRunner runner(replays);
      const auto [got, st] = run(sampled, {SpeculativeConfig::Method::Custom, 4}, oracle.proposer(), runner);
      EXPECT_EQ(got, want);
      EXPECT_EQ(runner.verify_items, st.spec_verify_steps);
      EXPECT_EQ(runner.rollbacks, st.spec_rollbacks);
      EXPECT_EQ(st.spec_rollbacks, spoil ? st.spec_verify_steps -
                                               int64_t(std::count(oracle.calls.begin(), oracle.calls.end(), 1)) -
                                               int64_t(std::count(oracle.calls.begin(), oracle.calls.end(), 2))
                                         : 0);
      EXPECT_EQ(st.spec_emitted, st.spec_verify_steps + st.spec_accepted);
    }
  }
}

// ModelRunner::propose_mtp_batch: the batched MTP drafts of two sequences (two kept chunks each, so two catch-up
// rounds) equal each one's propose_mtp on a twin fed the same; a batch that fails in its second round (a token id
// outside the vocabulary there) leaves every sequence's MTP layer and kept rows as they were, so each then drafts
// alone exactly as its twin.
TEST(SchedulerSpeculative, BatchedMtpDraftsEqualOneByOneAndAFailedBatchLeavesNoTrace) {
  Model& model = shared_model(kTinyMtp, true);
  const int64_t V = model.config().vocab_size;
  SpecEngine e(model, {.spec = {SpeculativeConfig::Method::Mtp, 3}});
  ModelRunner& runner = e.runner;
  const std::vector<std::vector<int32_t>> prompts{prompt_of(9, 1, V), prompt_of(14, 2, V)};
  // Sequences 0, 1 (batched) and their twins 2, 3 (one by one), each fed its prompt in two chunks, rows kept.
  std::vector<std::unique_ptr<RunnerSequence>> seqs;
  std::vector<std::vector<int32_t>> tables;
  for (int32_t i = 0; i < 4; ++i) {
    seqs.push_back(runner.new_sequence(i));
    tables.push_back({2 * i, 2 * i + 1});
  }
  for (int64_t part = 0; part < 2; ++part) {
    std::vector<Runner::Item> items;
    for (size_t i = 0; i < 4; ++i) {
      const std::vector<int32_t>& p = prompts[i % 2];
      const size_t half = p.size() / 2, a = part ? half : 0, b = part ? p.size() : half;
      Runner::Item it;
      it.seq = seqs[i].get();
      it.ids = std::span<const int32_t>(p).subspan(a, b - a);
      it.block_table = tables[i];
      it.slot = int32_t(i);
      it.keep_hidden = true;
      items.push_back(it);
    }
    runner.forward(items);
    for (const Runner::Item& it : items) ASSERT_TRUE(it.error.empty()) << it.error;
  }
  // Each sequence's tokens: its prompt and one more (the token the MTP layer pairs with its last row).
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& p : prompts) {
    tokens.push_back(p);
    tokens.back().push_back(int32_t(7 % V));
  }
  // A failing batch: sequence 1's tokens of its second chunk hold an id outside the vocabulary.
  std::vector<int32_t> bad = tokens[1];
  bad[bad.size() - 2] = int32_t(V + 5);
  const Runner::MtpRequest failing[2] = {{seqs[0].get(), tables[0], tokens[0], 3}, {seqs[1].get(), tables[1], bad, 3}};
  try {
    runner.propose_mtp_batch(failing);
    ADD_FAILURE() << "a token id outside the vocabulary was drafted from";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("outside the vocabulary"), std::string::npos) << err.what();
  }
  // The same two batched, then their twins one by one: the same drafts.
  const Runner::MtpRequest batched[2] = {{seqs[0].get(), tables[0], tokens[0], 3},
                                         {seqs[1].get(), tables[1], tokens[1], 2}};
  const auto got = runner.propose_mtp_batch(batched);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], runner.propose_mtp(*seqs[2], tables[2], tokens[0], 3));
  EXPECT_EQ(got[1], runner.propose_mtp(*seqs[3], tables[3], tokens[1], 2));
  EXPECT_EQ(got[0].size(), 3u);
  EXPECT_EQ(got[1].size(), 2u);
  // Caught up: no kept rows left, so no drafts until the sequences are fed again.
  EXPECT_EQ(runner.propose_mtp_batch(batched), (std::vector<std::vector<int32_t>>{{}, {}}));
}

TEST(SchedulerSpeculative, BadSettingsAreErrorsNamingThem) {
  Model& model = shared_model(kTinyA, false);
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // MTP over a model loaded without its layer.
  EXPECT_NE(message([&] {
              SpecEngine e(model, {.spec = SpeculativeConfig::parse("mtp:2")});
            }).find("--speculative mtp:2: the model was loaded without its MTP layer"),
            std::string::npos);
  SpecEngine off(model, {});
  Request r = greedy_request("x", {1, 2, 3}, 4);
  r.speculative_tokens = 2;
  EXPECT_NE(message([&] { off.sched->submit(r); }).find("num_speculative_tokens 2 asks for speculative decoding"),
            std::string::npos);
  r.speculative_tokens = 0;  // opting out is always allowed
  EXPECT_EQ(message([&] { off.sched->submit(r); }), "no error");
  // Checkpoint slots: one per sequence slot, after the sequence (and snapshot) slots, out of the same budget.
  StatePlan plan;
  plan.kv_bytes_per_token = 4;
  plan.gdn_state_bytes_per_sequence = 1000;
  const MemoryPlanner with(plan, 16, 6000 + 64 * 10, 3, {}, 3), without(plan, 16, 6000 + 64 * 10, 3);
  EXPECT_EQ(with.pool_slots(), 6);
  EXPECT_EQ(with.checkpoint_slot(0), 3);
  EXPECT_EQ(with.checkpoint_slot(2), 5);
  EXPECT_EQ(without.checkpoint_slot(2), -1);
  EXPECT_EQ(with.total_blocks(), 10);  // 3000 bytes of checkpoints fewer for blocks of 64 bytes
  EXPECT_EQ(without.total_blocks(), 10 + 3000 / 64);
  EXPECT_NE(message([&] { MemoryPlanner(plan, 16, 1 << 20, 3, {}, 2); }).find("one per sequence slot"),
            std::string::npos);
  EXPECT_NE(message([&] { MemoryPlanner(plan, 16, 6000, 3, {}, 3); }).find("3 speculative checkpoints"),
            std::string::npos);
  SpecEngine on(model, {.spec = SpeculativeConfig::parse("ngram:3")});
  r.speculative_tokens = 4;
  EXPECT_NE(message([&] { on.sched->submit(r); }).find("num_speculative_tokens 4 is more than the server drafts"),
            std::string::npos);
}

}  // namespace
}  // namespace flashnext::test
