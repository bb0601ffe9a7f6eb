// Prefix caching on the CPU oracle with the bundled model (models/tiny-b-random: GDN, QSA with a sparse indexer
// budget of 16 tokens, PLE): a request that resumes from cached blocks and a state snapshot gives the same greedy
// tokens and the same logits (within 1e-6; in fact bit for bit) as the same request prefilled without the cache,
// for prefixes shared by 0, 1, a block minus one, one block and many blocks, with requests batched together, and
// with blocks evicted by a small pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/fixture.h"
#include "engine/prefix_cache_test_util.h"
#include "engine/scheduler.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {
namespace {

Model& bundled_model() {
  static std::unique_ptr<Model> m = Model::load(kModelDir);
  return *m;
}

/// An engine over the bundled model.
struct BundledEngine : Engine {
  explicit BundledEngine(const EngineSetup& e) : Engine(bundled_model(), e) {}
};

TEST(PrefixCacheEngine, ASecondRequestSharingAPrefixGivesTheUncachedTokensAndLogits) {
  // C = S = 16: the chunks of a prefill resumed at a snapshot are the uncached prefill's.
  const auto first = prompt_ids(100, 1);
  for (int64_t shared : {int64_t(0), int64_t(1), kBlock - 1, kBlock, 5 * kBlock, int64_t(100)}) {
    const auto second = concat(std::vector<int32_t>(first.begin(), first.begin() + shared), prompt_ids(20, 2));
    auto make = [&] {
      return std::vector<Request>{greedy_request("first", first, 8), greedy_request("second", second, 8)};
    };
    BundledEngine plain({.prefix_caching = false});
    BundledEngine cached({.prefix_caching = true});
    const auto want = run_each(plain, make());
    const auto got = run_each(cached, make());
    EXPECT_EQ(got[0].tokens, want[0].tokens) << "shared " << shared;
    EXPECT_EQ(got[1].tokens, want[1].tokens) << "shared " << shared;
    EXPECT_EQ(got[0].cached_tokens, 0);
    EXPECT_EQ(got[1].cached_tokens, shared / kBlock * kBlock) << "shared " << shared;
    EXPECT_LE(max_abs_diff(cached.runner.logits, plain.runner.logits), 1e-6) << "shared " << shared;
    EXPECT_EQ(cached.runner.logits, plain.runner.logits) << "not bit for bit, shared " << shared;
    const SchedulerStats st = cached.sched->stats();
    EXPECT_EQ(st.prefix_cache_hits, shared / kBlock * kBlock);
    EXPECT_EQ(st.prefill_tokens, plain.sched->stats().prefill_tokens - shared / kBlock * kBlock);
  }
}

TEST(PrefixCacheEngine, TheSamePromptTwiceResumesBeforeItsLastBlock) {
  const auto prompt = prompt_ids(64, 3);  // 4 full blocks: resumes at 48 (the last token must be fed)
  BundledEngine plain({.prefix_caching = false});
  BundledEngine cached({.prefix_caching = true, .interval_blocks = 1});
  const auto want = run_each(plain, {greedy_request("a", prompt, 6), greedy_request("b", prompt, 6)});
  const auto got = run_each(cached, {greedy_request("a", prompt, 6), greedy_request("b", prompt, 6)});
  EXPECT_EQ(got[1].cached_tokens, 48);
  EXPECT_EQ(got[1].tokens, want[1].tokens);
  EXPECT_EQ(got[1].tokens, got[0].tokens);
  EXPECT_EQ(cached.runner.logits, plain.runner.logits);
}

TEST(PrefixCacheEngine, ChunksCutAtSnapshotsAreExactAgainstTheSameRuleAndMeasuredAgainstAnother) {
  // C = 40, S = 2 blocks = 32: with the cache the chunks also end at 32, 64, ...; a resumed request equals the same
  // request on an engine with the cache but nothing in it, bit for bit. Against the cache turned off (chunks at
  // multiples of 40 only) the GDN's chunked rule sums in another order: the difference is float rounding.
  const auto first = prompt_ids(120, 4);
  const auto second = concat(std::vector<int32_t>(first.begin(), first.begin() + 90), prompt_ids(30, 5));
  BundledEngine warm({.prefix_caching = true, .interval_blocks = 2, .chunk = 40});
  BundledEngine cold({.prefix_caching = true, .interval_blocks = 2, .chunk = 40});
  BundledEngine off({.prefix_caching = false, .chunk = 40});
  const auto hit = run_each(warm, {greedy_request("first", first, 8), greedy_request("second", second, 8)});
  const auto miss = run_each(cold, {greedy_request("second", second, 8)});
  const auto plain = run_each(off, {greedy_request("second", second, 8)});
  EXPECT_EQ(hit[1].cached_tokens, 64);
  EXPECT_EQ(miss[0].cached_tokens, 0);
  EXPECT_EQ(hit[1].tokens, miss[0].tokens);
  const std::vector<std::vector<float>> hit_rows(warm.runner.logits.begin() + 8, warm.runner.logits.end());
  EXPECT_EQ(hit_rows, cold.runner.logits);
  const double d = max_abs_diff(cold.runner.logits, off.runner.logits);
  RecordProperty("max_abs_logit_diff_other_chunking", std::to_string(d));
  std::printf("chunks cut at 32-multiples vs not: max |logit difference| %.3g\n", d);
  EXPECT_LT(d, 1e-5) << "more than float rounding";
  EXPECT_EQ(miss[0].tokens, plain[0].tokens);
}

TEST(PrefixCacheEngine, BatchedRequestsSharingAPrefixMatchTheUncachedEngine) {
  const auto root = prompt_ids(70, 6);
  auto make = [&] {
    std::vector<Request> rs;
    for (int i = 0; i < 4; ++i)
      rs.push_back(greedy_request(
          "b" + std::to_string(i),
          concat(std::vector<int32_t>(root.begin(), root.begin() + 20 + 15 * i), prompt_ids(9, 10 + i)), 10));
    return rs;
  };
  BundledEngine plain({.prefix_caching = false});
  BundledEngine cached({.prefix_caching = true});
  run_each(plain, {greedy_request("warm", root, 2)});
  run_each(cached, {greedy_request("warm", root, 2)});
  const auto want = run_together(plain, make());
  const auto got = run_together(cached, make());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    EXPECT_EQ(got[i].cached_tokens, (20 + 15 * int64_t(i)) / kBlock * kBlock) << i;
  }
}

TEST(PrefixCacheEngine, PreemptedRequestsSharingAPrefixKeepTheirSoloTokens) {
  // 16 blocks for 4 sequences of 7 blocks that share 3 (a 60-token prefix): sequences are preempted and re-admitted
  // (finding their prefixes cached) and still give the tokens each gives alone without the cache (as the serve
  // test of preemption, this relies on the greedy choice surviving the recompute's float rounding: a preempted
  // sequence recomputes its generated tokens as a prefill).
  const auto root = prompt_ids(60, 50);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(concat(root, prompt_ids(10, 51 + i)));
  auto make = [&] {
    std::vector<Request> rs;
    for (size_t i = 0; i < prompts.size(); ++i) rs.push_back(greedy_request("p" + std::to_string(i), prompts[i], 40));
    return rs;
  };
  std::vector<Outcome> solo;
  for (auto& r : make()) {
    BundledEngine alone({.prefix_caching = false});
    solo.push_back(run_each(alone, {std::move(r)})[0]);
  }
  BundledEngine cached({.prefix_caching = true, .blocks = 16});
  cached.sched->submit(greedy_request("warm", root, 1));
  run_all(*cached.sched);
  const auto got = run_together(cached, make());
  for (size_t i = 0; i < solo.size(); ++i) EXPECT_EQ(got[i].tokens, solo[i].tokens) << i;
  const SchedulerStats st = cached.sched->stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GE(st.prefix_cache_hits, 6 * 48);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
}

TEST(PrefixCacheEngine, EvictionByASmallPoolKeepsEveryOutputExact) {
  // 24 blocks of 16 and 8 snapshots for requests of up to 8 blocks each, run one after another: cached blocks and
  // snapshots are evicted (least recently used) while later requests look for their prefixes.
  const auto r0 = prompt_ids(90, 20), r1 = prompt_ids(90, 21), r2 = prompt_ids(90, 22);
  auto head = [](const std::vector<int32_t>& r, int64_t n) { return std::vector<int32_t>(r.begin(), r.begin() + n); };
  auto make = [&] {
    const std::vector<std::vector<int32_t>> prompts = {
        concat(r0, prompt_ids(25, 30)),           concat(head(r0, 50), prompt_ids(25, 31)),
        concat(r1, prompt_ids(25, 32)),           concat(r2, prompt_ids(25, 33)),
        concat(r0, prompt_ids(25, 34)),           concat(head(r1, 70), prompt_ids(25, 35)),
        concat(head(r2, 33), prompt_ids(25, 36)), concat(r2, prompt_ids(25, 37))};
    std::vector<Request> rs;
    for (size_t i = 0; i < prompts.size(); ++i) rs.push_back(greedy_request("e" + std::to_string(i), prompts[i], 6));
    return rs;
  };
  BundledEngine plain({.prefix_caching = false, .blocks = 24});
  BundledEngine cached({.prefix_caching = true, .snapshots = 8, .blocks = 24});
  const auto want = run_each(plain, make());
  const auto got = run_each(cached, make());
  int64_t hits = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    hits += got[i].cached_tokens;
  }
  EXPECT_EQ(got[1].cached_tokens, 48);
  EXPECT_EQ(cached.runner.logits, plain.runner.logits);
  const SchedulerStats st = cached.sched->stats();
  EXPECT_GT(st.prefix_cache_evictions, 0);
  EXPECT_EQ(st.prefix_cache_hits, hits);
  EXPECT_LE(st.prefix_cache_snapshots, 8);
  EXPECT_EQ(st.kv_blocks_used, 0);
  std::printf("cached tokens per request:");
  for (const auto& o : got) std::printf(" %lld", static_cast<long long>(o.cached_tokens));
  std::printf("; %lld blocks evicted\n", static_cast<long long>(st.prefix_cache_evictions));
}

}  // namespace
}  // namespace flashnext::test
