// Test helpers for prefix caching on a real model (CPU and CUDA engine tests): a Runner that records the logits a
// ModelRunner hands back, a scheduler built as `serve` builds it with or without the prefix cache, and request
// helpers (greedy requests, seeded prompt ids, running requests one after another or together).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "engine/scheduler_test_util.h"
#include "loader/memory_plan.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {

inline constexpr int64_t kBlock = 16;  ///< positions per KV block of the test engines

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

/// A scheduler over `model` as `serve` builds it (float32 caches, pooled keys counted): 4 sequences, steps of 64
/// tokens, max_model_len 256.
struct Engine {
  Engine(Model& model, const EngineSetup& e) : planner(make_planner(model, e)), runner(model, planner) {
    sched = std::make_unique<Scheduler>(
        runner, planner,
        SchedulerConfig{
            .max_num_seqs = 4, .max_num_batched_tokens = 64, .prefill_chunk_size = e.chunk, .max_model_len = 256});
  }
  static MemoryPlanner make_planner(const Model& model, const EngineSetup& e) {
    const ModelConfig& cfg = model.config();
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

inline std::vector<int32_t> prompt_ids(int64_t n, uint64_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
  for (auto& t : p) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = int32_t(x % 151000);
  }
  return p;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  std::vector<int32_t> tokens;
  int64_t cached_tokens = 0;
};

inline Outcome drain(RequestStream& st) {
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

inline void run_all(Scheduler& s) {
  for (int i = 0; i < 100000 && s.step(); ++i) {
  }
}

/// Runs the requests one after another, each to its end.
inline std::vector<Outcome> run_each(Engine& e, std::vector<Request> requests) {
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
inline std::vector<Outcome> run_together(Engine& e, std::vector<Request> requests) {
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

inline double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    for (size_t j = 0; j < std::min(a[i].size(), b[i].size()); ++j)
      d = std::max(d, double(std::fabs(a[i][j] - b[i][j])));
  }
  return d;
}

}  // namespace flashnext::test
