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
#include "engine/scheduler.h"
#include "loader/memory_plan.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {
namespace {

constexpr int64_t kBlock = 16;

Model& bundled_model() {
  static std::unique_ptr<Model> m = Model::load(kModelDir);
  return *m;
}

/// A Runner that forwards to a ModelRunner and keeps the logits rows it hands back (in step order).
class RecordingRunner : public Runner {
 public:
  RecordingRunner(Model& model, const MemoryPlanner& planner) : inner_(model, planner, /*device_sampling=*/false) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::unique_ptr<RunnerSequence> new_sequence(int32_t slot) override { return inner_.new_sequence(slot); }
  void forward(std::span<Item> items) override {
    inner_.forward(items);
    for (const Item& it : items)
      if (!it.logits.empty() && it.error.empty()) logits.emplace_back(it.logits.begin(), it.logits.end());
  }
  bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) override {
    return inner_.copy_sequence(from, to, to_blocks);
  }
  bool save_snapshot(const RunnerSequence& seq, int32_t snapshot) override {
    return inner_.save_snapshot(seq, snapshot);
  }
  void restore_snapshot(int32_t snapshot, RunnerSequence& seq, int64_t length) override {
    inner_.restore_snapshot(snapshot, seq, length);
  }
  std::vector<std::vector<float>> logits;

 private:
  ModelRunner inner_;
};

struct EngineSetup {
  bool prefix_caching = false;
  int64_t interval_blocks = 1;
  int64_t snapshots = 16;
  int64_t blocks = 256;  ///< KV blocks of kBlock positions
  int64_t chunk = 16;    ///< prefill chunk size C
};

/// A scheduler over the bundled model as `serve` builds it (float32 caches, pooled keys counted).
struct Engine {
  explicit Engine(const EngineSetup& e) : planner(make_planner(e)), runner(bundled_model(), planner) {
    sched = std::make_unique<Scheduler>(
        runner, planner,
        SchedulerConfig{
            .max_num_seqs = 4, .max_num_batched_tokens = 64, .prefill_chunk_size = e.chunk, .max_model_len = 256});
  }
  static MemoryPlanner make_planner(const EngineSetup& e) {
    const ModelConfig& cfg = bundled_model().config();
    StatePlan plan = state_plan(cfg, 1, 4, 4);
    plan.indexer_bytes_per_token += plan.indexer_bytes_per_token / cfg.indexer_compress_ratio;
    MemoryPlanner probe(plan, kBlock, int64_t(1) << 30, 4);
    const int64_t slots = 4 + (e.prefix_caching ? e.snapshots : 0);
    const int64_t budget = slots * probe.slot_bytes() + e.blocks * probe.block_bytes();
    return MemoryPlanner(
        plan, kBlock, budget, 4,
        {.enabled = e.prefix_caching, .snapshot_interval_blocks = e.interval_blocks, .num_snapshots = e.snapshots});
  }
  MemoryPlanner planner;
  RecordingRunner runner;
  std::unique_ptr<Scheduler> sched;
};

Request greedy(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::vector<int32_t> prompt_ids(int64_t n, uint64_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
  for (auto& t : p) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = int32_t(x % 151000);
  }
  return p;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  std::vector<int32_t> tokens;
  int64_t cached_tokens = 0;
};

Outcome drain(RequestStream& st) {
  Outcome o;
  for (;;) {
    auto u = st.wait(std::chrono::milliseconds(0));
    EXPECT_TRUE(u.error.empty()) << u.error;
    o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.scheduled) o.cached_tokens = u.cached_tokens;
    if (u.finish != EndReason::None) return o;
    if (u.tokens.empty() && !u.scheduled) {
      ADD_FAILURE() << "the request did not finish";
      return o;
    }
  }
}

void run_all(Scheduler& s) {
  for (int i = 0; i < 100000 && s.step(); ++i) {
  }
}

/// Runs the requests one after another, each to its end.
std::vector<Outcome> run_each(Engine& e, std::vector<Request> requests) {
  std::vector<Outcome> out;
  for (Request& r : requests) {
    auto st = r.stream;
    e.sched->submit(std::move(r));
    run_all(*e.sched);
    out.push_back(drain(*st));
  }
  return out;
}

/// Submits all requests, then runs them together.
std::vector<Outcome> run_together(Engine& e, std::vector<Request> requests) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (Request& r : requests) {
    streams.push_back(r.stream);
    e.sched->submit(std::move(r));
  }
  run_all(*e.sched);
  std::vector<Outcome> out;
  for (auto& st : streams) out.push_back(drain(*st));
  return out;
}

double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    for (size_t j = 0; j < std::min(a[i].size(), b[i].size()); ++j)
      d = std::max(d, double(std::fabs(a[i][j] - b[i][j])));
  }
  return d;
}

TEST(PrefixCacheEngine, ASecondRequestSharingAPrefixGivesTheUncachedTokensAndLogits) {
  // C = S = 16: the chunks of a prefill resumed at a snapshot are the uncached prefill's.
  const auto first = prompt_ids(100, 1);
  for (int64_t shared : {int64_t(0), int64_t(1), kBlock - 1, kBlock, 5 * kBlock, int64_t(100)}) {
    const auto second = concat(std::vector<int32_t>(first.begin(), first.begin() + shared), prompt_ids(20, 2));
    auto make = [&] { return std::vector<Request>{greedy("first", first, 8), greedy("second", second, 8)}; };
    Engine plain({.prefix_caching = false});
    Engine cached({.prefix_caching = true});
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
  Engine plain({.prefix_caching = false});
  Engine cached({.prefix_caching = true, .interval_blocks = 1});
  const auto want = run_each(plain, {greedy("a", prompt, 6), greedy("b", prompt, 6)});
  const auto got = run_each(cached, {greedy("a", prompt, 6), greedy("b", prompt, 6)});
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
  Engine warm({.prefix_caching = true, .interval_blocks = 2, .chunk = 40});
  Engine cold({.prefix_caching = true, .interval_blocks = 2, .chunk = 40});
  Engine off({.prefix_caching = false, .chunk = 40});
  const auto hit = run_each(warm, {greedy("first", first, 8), greedy("second", second, 8)});
  const auto miss = run_each(cold, {greedy("second", second, 8)});
  const auto plain = run_each(off, {greedy("second", second, 8)});
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
      rs.push_back(greedy("b" + std::to_string(i),
                          concat(std::vector<int32_t>(root.begin(), root.begin() + 20 + 15 * i), prompt_ids(9, 10 + i)),
                          10));
    return rs;
  };
  Engine plain({.prefix_caching = false});
  Engine cached({.prefix_caching = true});
  run_each(plain, {greedy("warm", root, 2)});
  run_each(cached, {greedy("warm", root, 2)});
  const auto want = run_together(plain, make());
  const auto got = run_together(cached, make());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    EXPECT_EQ(got[i].cached_tokens, (20 + 15 * int64_t(i)) / kBlock * kBlock) << i;
  }
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
    for (size_t i = 0; i < prompts.size(); ++i) rs.push_back(greedy("e" + std::to_string(i), prompts[i], 6));
    return rs;
  };
  Engine plain({.prefix_caching = false, .blocks = 24});
  Engine cached({.prefix_caching = true, .snapshots = 8, .blocks = 24});
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
