// Scheduler and memory planner tests with a synthetic model whose logits depend on every token of the sequence,
// so that any mix-up of sequences, lost token or wrongly resumed state changes the output. Expected outputs come
// from running that model's definition directly (one sequence, token by token), not from the scheduler.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <span>

#include "engine/scheduler.h"

namespace flashnext {
namespace {

constexpr int64_t kVocab = 64;

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The synthetic model: the state is a hash of the whole history; logit v = a pseudo-random number of (state, v).
uint64_t feed(uint64_t h, int32_t token) {
  return mix(h ^ (uint64_t(token) * 0x100000001B3ull));
}
void logits_of(uint64_t h, std::span<float> out) {
  for (int64_t v = 0; v < kVocab; ++v) out[size_t(v)] = float(mix(h ^ uint64_t(v + 1) * 0x9E37ull) >> 40) / 1e6f;
}

// Greedy output of the synthetic model, computed directly (the reference for every test).
std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t eos = -1) {
  uint64_t h = 0;
  for (int32_t t : prompt) h = feed(h, t);
  std::vector<int32_t> out;
  std::vector<float> l(kVocab);
  while (int64_t(out.size()) < max_tokens) {
    logits_of(h, l);
    int32_t best = 0;
    for (int32_t v = 1; v < kVocab; ++v)
      if (l[size_t(v)] > l[size_t(best)]) best = v;
    out.push_back(best);
    if (best == eos) break;
    h = feed(h, best);
  }
  return out;
}

struct FakeSeq : RunnerSequence {
  uint64_t h = 0;
  int64_t length = 0;
  std::vector<int32_t> fed;    ///< every token fed so far
  std::vector<int32_t> table;  ///< the block table of its last step
  int id = 0;
  std::vector<std::pair<uint64_t, uint64_t>> draws;  ///< (seed, offset) of each device-sampled token
};

class FakeRunner : public Runner {
 public:
  int64_t vocab_size() const override { return kVocab; }
  std::unique_ptr<RunnerSequence> new_sequence(int32_t slot) override {
    EXPECT_GE(slot, 0);
    auto s = std::make_unique<FakeSeq>();
    s->id = next_id_++;
    return s;
  }
  void forward(std::span<Item> items) override {
    int64_t tokens = 0;
    bool prefill = false, decode = false;
    std::set<RunnerSequence*> seen;
    for (Item& it : items) {
      EXPECT_TRUE(seen.insert(it.seq).second) << "a sequence appears twice in one step";
      auto& s = static_cast<FakeSeq&>(*it.seq);
      tokens += int64_t(it.ids.size());
      (it.ids.size() > 1 ? prefill : decode) = true;
      if (std::find(it.ids.begin(), it.ids.end(), poison) != it.ids.end()) {
        it.error = "poisoned token";
        continue;
      }
      s.table.assign(it.block_table.begin(), it.block_table.end());
      for (size_t j = 0; j < it.ids.size(); ++j) {
        s.h = feed(s.h, it.ids[j]);
        s.fed.push_back(it.ids[j]);
        if (!it.all_logits.empty()) logits_of(s.h, it.all_logits.subspan(j * kVocab, kVocab));
      }
      if (!it.all_logits.empty()) ++all_logits_items;
      s.length += int64_t(it.ids.size());
      EXPECT_LE(s.length, int64_t(it.block_table.size()) * block_size) << "fed past the KV blocks assigned";
      EXPECT_GE(it.slot, 0);
      if (!it.logits.empty()) {
        logits_of(s.h, it.logits);
        ++host_logit_rows;
      }
      if (it.sampling) {  // the "device" sampler: greedy, or a draw that depends on (seed, offset, state)
        EXPECT_TRUE(device) << "device sampling asked of a host-sampling runner";
        EXPECT_TRUE(it.logits.empty()) << "logits asked together with device sampling";
        s.draws.push_back({it.sampling->seed, it.sampling->offset});
        std::vector<float> l(kVocab);
        logits_of(s.h, l);
        it.token = it.sampling->temperature <= 0.f
                       ? int32_t(std::max_element(l.begin(), l.end()) - l.begin())
                       : int32_t(mix(it.sampling->seed ^ (it.sampling->offset << 20) ^ s.h) % kVocab);
      }
    }
    max_step_tokens = std::max(max_step_tokens, tokens);
    if (prefill && decode) ++mixed_steps;
    ++steps;
  }
  bool samples_on_device() const override { return device; }
  bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) override {
    if (!can_copy) return false;
    auto& src = static_cast<const FakeSeq&>(from);
    auto& dst = static_cast<FakeSeq&>(to);
    EXPECT_EQ(dst.length, 0) << "copied into a used sequence";
    EXPECT_LE(src.length, int64_t(to_blocks.size()) * block_size) << "copied past the KV blocks assigned";
    dst.h = src.h;
    dst.length = src.length;
    dst.fed = src.fed;
    ++copies;
    return true;
  }
  bool device = false;  ///< answer Item::sampling (see forward) instead of only producing logits
  bool can_copy = true;
  int64_t copies = 0, all_logits_items = 0;
  int32_t poison = -1;
  int64_t block_size = 4;
  int64_t max_step_tokens = 0, mixed_steps = 0, steps = 0, host_logit_rows = 0;

 private:
  int next_id_ = 0;
};

// 16 bytes per token (10 KV + 6 indexer), 100 bytes of GDN/PLE state per sequence.
StatePlan test_plan() {
  StatePlan p;
  p.kv_bytes_per_token = 10;
  p.indexer_bytes_per_token = 6;
  p.gdn_state_bytes_per_sequence = 60;
  p.gdn_conv_state_bytes_per_sequence = 30;
  p.ple_state_bytes_per_sequence = 10;
  return p;
}

MemoryPlanner planner_with_blocks(int64_t blocks, int64_t slots, int64_t block_size = 4) {
  return MemoryPlanner(test_plan(), block_size, slots * 100 + blocks * 16 * block_size, slots);
}

Request greedy_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> make_prompt(int len, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) p[size_t(i)] = int32_t(mix(uint64_t(salt) * 1000 + uint64_t(i)) % kVocab);
  return p;
}

// Drains a stream after the scheduler ran to completion.
RequestStream::Update drain(RequestStream& s) {
  RequestStream::Update all;
  for (;;) {
    auto u = s.wait(std::chrono::milliseconds(0));
    all.tokens.insert(all.tokens.end(), u.tokens.begin(), u.tokens.end());
    for (auto& l : u.prompt_logprobs) all.prompt_logprobs.push_back(l);
    for (auto& l : u.logprobs) all.logprobs.push_back(l);
    if (u.scheduled) {
      all.scheduled = u.scheduled;
      all.cached_tokens = u.cached_tokens;
    }
    if (u.finish != EndReason::None) {
      all.finish = u.finish;
      all.stop_token = u.stop_token;
      all.error = u.error;
    }
    if (u.tokens.empty() && u.prompt_logprobs.empty() && u.finish == EndReason::None) return all;
  }
}

void run_to_end(Scheduler& s) {
  int i = 0;
  for (; i < 100000 && s.step(); ++i) {
  }
  if (i == 100000) ADD_FAILURE() << "the scheduler still had work after 100000 steps";
}

TEST(MemoryPlanner, CarvesSlotsThenBlocks) {
  // budget 1000: 3 slots of 100 bytes, then (1000 - 300) / (16 * 4) = 10 blocks of 64 bytes.
  MemoryPlanner m(test_plan(), 4, 1000, 3);
  EXPECT_EQ(m.block_bytes(), 64);
  EXPECT_EQ(m.slot_bytes(), 100);
  EXPECT_EQ(m.total_blocks(), 10);
  EXPECT_EQ(m.total_slots(), 3);
  EXPECT_EQ(m.blocks_for(0), 0);
  EXPECT_EQ(m.blocks_for(4), 1);
  EXPECT_EQ(m.blocks_for(5), 2);
  std::vector<int32_t> a, b;
  EXPECT_TRUE(m.try_grow(a, 9));  // 3 blocks
  EXPECT_EQ(a.size(), 3u);
  EXPECT_FALSE(m.try_grow(b, 30));  // 8 blocks > 7 free: nothing taken
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(m.free_blocks(), 7);
  EXPECT_TRUE(m.try_grow(b, 28));
  EXPECT_EQ(m.free_blocks(), 0);
  std::set<int32_t> ids(a.begin(), a.end());
  ids.insert(b.begin(), b.end());
  EXPECT_EQ(ids.size(), 10u) << "a block was handed out twice";
  EXPECT_DOUBLE_EQ(m.usage(), 1.0);
  auto s0 = m.acquire_slot(), s1 = m.acquire_slot(), s2 = m.acquire_slot();
  EXPECT_FALSE(m.acquire_slot().has_value());
  m.release(a, *s1);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(m.free_blocks(), 3);
  EXPECT_EQ(m.free_slots(), 1);
  EXPECT_EQ(*m.acquire_slot(), *s1);
  (void)s0;
  (void)s2;
}

// The default snapshot count (serve's prefix cache): slots of 100 B, blocks of 4 tokens x 16 B = 64 B; 3 sequence
// slots and one sequence of 40 tokens (10 blocks, 640 B) need 300 + 640 = 940 B before any snapshot.
TEST(MemoryPlanner, DefaultSnapshotsLeaveRoomForTheSlotsAndOneLongSequence) {
  const StatePlan p = test_plan();
  EXPECT_EQ(MemoryPlanner::default_snapshots(p, 4, 940, 3, 0, 40), 0);   // nothing spare
  EXPECT_EQ(MemoryPlanner::default_snapshots(p, 4, 1140, 3, 0, 40), 2);  // 200 B spare, a quarter is 285
  EXPECT_EQ(MemoryPlanner::default_snapshots(p, 4, 1240, 3, 1, 40), 2);  // a checkpoint slot takes 100 more
  EXPECT_EQ(MemoryPlanner::default_snapshots(p, 4, 2000, 3, 0, 40), 3);  // a quarter (500 B): 5, at most 3 (slots)
  EXPECT_EQ(MemoryPlanner::default_snapshots(p, 4, 1600, 8, 0, 40), 1);  // 800 + 640 needed: 160 spare, quarter 400
  // The count it gives always fits the planner with the slots and a max_model_len sequence left.
  MemoryPlanner m(p, 4, 1140, 3, {.enabled = true, .snapshot_interval_blocks = 1, .num_snapshots = 2});
  EXPECT_GE(m.total_blocks(), 10);
}

TEST(MemoryPlanner, RejectsBudgetWithoutRoom) {
  EXPECT_THROW(MemoryPlanner(test_plan(), 4, 300 + 63, 3), Error);  // slots fit, not one block
  EXPECT_THROW(MemoryPlanner(test_plan(), 0, 10000, 3), Error);
  EXPECT_THROW(MemoryPlanner(test_plan(), 4, 10000, 0), Error);
}

TEST(Scheduler, RejectsInvalidConfig) {
  FakeRunner runner;
  auto make = [&](SchedulerConfig c) { Scheduler s(runner, planner_with_blocks(100, 4), c); };
  EXPECT_THROW(make({.max_num_seqs = 0, .max_model_len = 64}), Error);
  EXPECT_THROW(make({.max_num_seqs = 8, .max_num_batched_tokens = 4, .max_model_len = 64}), Error);
  // C must leave room for the decodes of the other max_num_seqs - 1 sequences: 16 - 4 + 1 = 13.
  EXPECT_THROW(make({.max_num_seqs = 4, .max_num_batched_tokens = 16, .prefill_chunk_size = 14, .max_model_len = 64}),
               Error);
  EXPECT_NO_THROW(
      make({.max_num_seqs = 4, .max_num_batched_tokens = 16, .prefill_chunk_size = 13, .max_model_len = 64}));
  // 100 blocks of 4 tokens hold 400 positions: max_model_len 401 can never fit.
  EXPECT_THROW(make({.max_num_seqs = 4, .max_model_len = 401}), Error);
}

TEST(Scheduler, LengthCheckDoesNotOverflow) {
  // prompt + max_tokens near 2^63 wrapped negative and passed the check; it is compared without forming the sum.
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  for (int64_t max_tokens : {INT64_MAX, INT64_MAX - 5, int64_t(128)}) {
    try {
      s.submit(greedy_request("big", make_prompt(10, 1), max_tokens));
      ADD_FAILURE() << "max_tokens " << max_tokens << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(max_tokens)), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("is -"), std::string::npos) << "a wrapped sum: " << e.what();
    }
  }
  EXPECT_NO_THROW(s.submit(greedy_request("fits", make_prompt(10, 1), 118)));
}

TEST(Scheduler, SingleGreedyRequestMatchesTheModel) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  auto prompt = make_prompt(37, 1);  // 37 > chunk size 13: three prefill chunks
  Request r = greedy_request("a", prompt, 20);
  auto stream = r.stream;
  s.submit(std::move(r));
  run_to_end(s);
  auto u = drain(*stream);
  EXPECT_EQ(u.tokens, reference_greedy(prompt, 20));
  EXPECT_EQ(u.finish, EndReason::Length);
  auto st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
  EXPECT_EQ(st.prefill_tokens, 37);
  EXPECT_EQ(st.decode_tokens, 19);  // the 20th token is sampled but never fed
}

TEST(Scheduler, ConcurrentGreedyRequestsMatchTheirSoloOutput) {
  FakeRunner runner;
  const SchedulerConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 24, .max_model_len = 256};
  Scheduler s(runner, planner_with_blocks(1000, 8), cfg);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> max_tokens;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 32; ++i) {
    prompts.push_back(make_prompt(1 + (i * 7) % 60, 100 + i));
    max_tokens.push_back(1 + (i * 5) % 23);
    Request r = greedy_request("r" + std::to_string(i), prompts.back(), max_tokens.back());
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  int64_t max_running = 0;
  int steps = 0;
  for (; steps < 100000 && s.step(); ++steps) max_running = std::max(max_running, s.stats().running);
  ASSERT_LT(steps, 100000) << "the scheduler never ran out of work";
  for (int i = 0; i < 32; ++i) {
    auto u = drain(*streams[size_t(i)]);
    EXPECT_EQ(u.tokens, reference_greedy(prompts[size_t(i)], max_tokens[size_t(i)])) << "request " << i;
    EXPECT_EQ(u.finish, EndReason::Length);
  }
  EXPECT_LE(runner.max_step_tokens, cfg.max_num_batched_tokens);
  EXPECT_EQ(max_running, cfg.max_num_seqs);
  EXPECT_GT(runner.mixed_steps, 0) << "prefill and decode never shared a step";
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

TEST(Scheduler, PrefillChunksDoNotDependOnTheBatch) {
  // Chunk size C = 24 - 8 + 1 = 17: a 60-token prompt is always fed as 17 + 17 + 17 + 9, starting at 0, 17, 34, 51.
  class Recording : public FakeRunner {
   public:
    void forward(std::span<Item> items) override {
      for (auto& it : items) {
        auto& fs = static_cast<FakeSeq&>(*it.seq);
        if (fs.length < 60) starts[fs.id].push_back(fs.length);  // every feed inside the prompt
      }
      FakeRunner::forward(items);
    }
    std::map<int, std::vector<int64_t>> starts;
  } rec;
  Scheduler s2(rec, planner_with_blocks(1000, 8),
               {.max_num_seqs = 8, .max_num_batched_tokens = 24, .max_model_len = 256});
  for (int i = 0; i < 8; ++i) s2.submit(greedy_request("r" + std::to_string(i), make_prompt(60, i), 5));
  run_to_end(s2);
  ASSERT_EQ(rec.starts.size(), 8u);
  for (auto& [id, starts] : rec.starts) EXPECT_EQ(starts, (std::vector<int64_t>{0, 17, 34, 51})) << "sequence " << id;
}

TEST(Scheduler, PreemptsWhenMemoryRunsOutAndStillMatches) {
  // 24 blocks of 4 tokens = 96 positions shared by up to 6 sequences that each grow to ~60: preemption is needed.
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(24, 6),
              {.max_num_seqs = 6, .max_num_batched_tokens = 32, .max_model_len = 96});
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(make_prompt(20 + i * 3, 300 + i));
    Request r = greedy_request("p" + std::to_string(i), prompts.back(), 30);
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  run_to_end(s);
  for (int i = 0; i < 12; ++i) {
    auto u = drain(*streams[size_t(i)]);
    EXPECT_EQ(u.tokens, reference_greedy(prompts[size_t(i)], 30)) << "request " << i;
    EXPECT_EQ(u.finish, EndReason::Length);
  }
  auto st = s.stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
}

TEST(Scheduler, SeededSamplingSurvivesPreemption) {
  // The same seeded request alone (no memory pressure) and under pressure gives the same tokens.
  auto run = [](int64_t blocks, int64_t* preemptions, bool device) {
    FakeRunner runner;
    runner.device = device;
    Scheduler s(runner, planner_with_blocks(blocks, 4),
                {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 64});
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 4; ++i) {
      Request r = greedy_request("s" + std::to_string(i), make_prompt(10 + i, 500 + i), 40);
      r.sampling.temperature = 0.8;
      r.sampling.seed = 1234 + uint64_t(i);
      streams.push_back(r.stream);
      s.submit(std::move(r));
    }
    run_to_end(s);
    *preemptions = s.stats().preemptions;
    std::vector<std::vector<int32_t>> out;
    for (auto& st : streams) out.push_back(drain(*st).tokens);
    return out;
  };
  for (bool device : {false, true}) {
    int64_t p_free = 0, p_tight = 0;
    auto free_run = run(1000, &p_free, device);
    auto tight_run = run(16, &p_tight, device);
    EXPECT_EQ(p_free, 0);
    EXPECT_GT(p_tight, 0);
    EXPECT_EQ(free_run, tight_run) << (device ? "device" : "host") << " sampling";
  }
}

// A Runner that samples on the device gets the sampling parameters instead of giving logits, for requests that need
// nothing else: greedy ones (temperature 0: the same tokens as the host's greedy) and seeded ones (the request's
// seed, offset = tokens generated so far); requests with penalties or logprobs still sample on the host.
TEST(Scheduler, DeviceSamplingForPlainRequestsHostForTheRest) {
  FakeRunner runner;
  runner.device = true;
  Scheduler s(runner, planner_with_blocks(1000, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_model_len = 128});
  const auto p0 = make_prompt(20, 900), p1 = make_prompt(9, 901), p2 = make_prompt(13, 902);
  Request greedy = greedy_request("greedy", p0, 12);
  Request seeded = greedy_request("seeded", p1, 12);
  seeded.sampling.temperature = 0.7;
  seeded.sampling.seed = 77;
  Request penalised = greedy_request("penalised", p2, 12);
  penalised.sampling.repetition_penalty = 1.5;
  auto sg = greedy.stream, ss = seeded.stream, sp = penalised.stream;
  s.submit(std::move(greedy));
  s.submit(std::move(seeded));
  s.submit(std::move(penalised));
  run_to_end(s);
  EXPECT_EQ(drain(*sg).tokens, reference_greedy(p0, 12));
  // The seeded request's tokens are the fake device draws of seed 77 at offsets 0..11 along its own history.
  std::vector<int32_t> want;
  uint64_t h = 0;
  for (int32_t t : p1) h = feed(h, t);
  for (uint64_t k = 0; k < 12; ++k) {
    want.push_back(int32_t(mix(77 ^ (k << 20) ^ h) % kVocab));
    h = feed(h, want.back());
  }
  EXPECT_EQ(drain(*ss).tokens, want);
  // Only the penalised request asked for logits (one row per generated token), and it got what a host-sampling
  // runner gives it.
  EXPECT_EQ(runner.host_logit_rows, 12);
  FakeRunner host_runner;
  Scheduler h2(host_runner, planner_with_blocks(1000, 4),
               {.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_model_len = 128});
  Request again = greedy_request("penalised", p2, 12);
  again.sampling.repetition_penalty = 1.5;
  auto sa = again.stream;
  h2.submit(std::move(again));
  run_to_end(h2);
  EXPECT_EQ(drain(*sp).tokens, drain(*sa).tokens);
}

TEST(Scheduler, EosStopsWithItsToken) {
  auto prompt = make_prompt(5, 7);
  auto ref = reference_greedy(prompt, 10);
  const int32_t eos = ref[3];  // make the 4th token (or an earlier equal one) the EOS
  auto expected = reference_greedy(prompt, 10, eos);
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 2),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 64});
  Request r = greedy_request("e", prompt, 10);
  r.eos_token_ids = {eos};
  auto stream = r.stream;
  s.submit(std::move(r));
  run_to_end(s);
  auto u = drain(*stream);
  EXPECT_EQ(u.tokens, expected);
  EXPECT_EQ(u.finish, EndReason::Stop);
  ASSERT_TRUE(u.stop_token.has_value());
  EXPECT_EQ(*u.stop_token, eos);

  // ignore_eos keeps going; a stop token id still stops.
  Request r2 = greedy_request("e2", prompt, 10);
  r2.eos_token_ids = {eos};
  r2.sampling.ignore_eos = true;
  auto st2 = r2.stream;
  s.submit(std::move(r2));
  run_to_end(s);
  EXPECT_EQ(drain(*st2).tokens, ref);
  Request r3 = greedy_request("e3", prompt, 10);
  r3.sampling.stop_token_ids = {ref[1]};
  auto st3 = r3.stream;
  s.submit(std::move(r3));
  run_to_end(s);
  auto u3 = drain(*st3);
  EXPECT_EQ(u3.finish, EndReason::Stop);
  EXPECT_EQ(u3.tokens, reference_greedy(prompt, 10, ref[1]));
}

TEST(Scheduler, CancelFreesEverything) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 128});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {  // two run, two wait
    Request r = greedy_request("c" + std::to_string(i), make_prompt(8, 700 + i), 50);
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  for (int i = 0; i < 5; ++i) s.step();
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_EQ(s.stats().waiting, 2);
  streams[0]->cancel();  // running
  streams[3]->cancel();  // waiting
  s.step();
  EXPECT_EQ(drain(*streams[0]).finish, EndReason::Abort);
  EXPECT_EQ(drain(*streams[3]).finish, EndReason::Abort);
  streams[1]->cancel();
  streams[2]->cancel();
  EXPECT_FALSE(s.step() && s.step());
  auto st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
}

TEST(Scheduler, RejectsBadRequestsAndFullQueue) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 2),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 32, .max_waiting = 2});
  EXPECT_THROW(s.submit(greedy_request("empty", {}, 4)), Error);
  EXPECT_THROW(s.submit(greedy_request("oov", {1, int32_t(kVocab)}, 4)), Error);
  EXPECT_THROW(s.submit(greedy_request("long", make_prompt(30, 1), 3)), Error);  // 30 + 3 > 32
  Request bad = greedy_request("temp", {1, 2}, 4);
  bad.sampling.top_p = 0;
  EXPECT_THROW(s.submit(std::move(bad)), Error);
  Request lp = greedy_request("lp", {1, 2}, 4);
  lp.top_logprobs = 21;
  EXPECT_THROW(s.submit(std::move(lp)), Error);
  s.submit(greedy_request("q1", {1, 2}, 4));
  s.submit(greedy_request("q2", {1, 2}, 4));
  EXPECT_THROW(s.submit(greedy_request("q3", {1, 2}, 4)), QueueFullError);
  run_to_end(s);
  EXPECT_NO_THROW(s.submit(greedy_request("q4", {1, 2}, 4)));  // room again
}

TEST(Scheduler, AFailingRequestDoesNotAffectOthers) {
  // The runner fails any item that feeds the poison token; pick one the good request never feeds.
  auto good = make_prompt(9, 11);
  auto ref = reference_greedy(good, 6);
  int32_t poison = 0;
  auto used = [&](int32_t v) {
    return std::find(good.begin(), good.end(), v) != good.end() || std::find(ref.begin(), ref.end(), v) != ref.end();
  };
  while (used(poison)) ++poison;
  FakeRunner runner;
  runner.poison = poison;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 64});
  Request a = greedy_request("good", good, 6), b = greedy_request("bad", {1, poison, 2}, 6);
  auto sa = a.stream, sb = b.stream;
  s.submit(std::move(a));
  s.submit(std::move(b));
  run_to_end(s);
  auto ua = drain(*sa), ub = drain(*sb);
  EXPECT_EQ(ua.tokens, ref);
  EXPECT_EQ(ua.finish, EndReason::Length);
  EXPECT_TRUE(ub.tokens.empty());
  EXPECT_EQ(ub.finish, EndReason::Error);
  EXPECT_EQ(ub.error, "poisoned token");
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

TEST(Scheduler, LogprobsAreLogSoftmaxOfTheRawLogits) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 2),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 64});
  auto prompt = make_prompt(6, 3);
  Request r = greedy_request("lp", prompt, 1);
  r.top_logprobs = 3;
  auto stream = r.stream;
  s.submit(std::move(r));
  run_to_end(s);
  auto u = drain(*stream);
  ASSERT_EQ(u.logprobs.size(), 1u);
  uint64_t h = 0;
  for (int32_t t : prompt) h = feed(h, t);
  std::vector<float> l(kVocab);
  logits_of(h, l);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  std::vector<std::pair<double, int32_t>> sorted;
  for (int32_t v = 0; v < kVocab; ++v) sorted.push_back({-double(l[size_t(v)]), v});
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(u.tokens[0], sorted[0].second);
  EXPECT_NEAR(u.logprobs[0].logprob, double(l[size_t(sorted[0].second)]) - std::log(z), 1e-5);
  ASSERT_EQ(u.logprobs[0].top.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(u.logprobs[0].top[size_t(k)].first, sorted[size_t(k)].second);
    EXPECT_NEAR(u.logprobs[0].top[size_t(k)].second, -sorted[size_t(k)].first - std::log(z), 1e-5);
  }
}

TEST(Scheduler, EngineThreadServesConcurrentSubmitters) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(1000, 8),
              {.max_num_seqs = 8, .max_num_batched_tokens = 32, .max_model_len = 128});
  s.start();
  std::vector<std::thread> clients;
  std::vector<int> ok(16, 0);
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      auto prompt = make_prompt(3 + i, 900 + i);
      Request r = greedy_request("t" + std::to_string(i), prompt, 12);
      auto stream = r.stream;
      s.submit(std::move(r));
      std::vector<int32_t> got;
      // A deadline: a scheduler that stops serving fails the test instead of hanging it.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool finished = false;
      while (!finished && std::chrono::steady_clock::now() < deadline) {
        auto u = stream->wait(std::chrono::milliseconds(100));
        got.insert(got.end(), u.tokens.begin(), u.tokens.end());
        finished = u.finish != EndReason::None;
      }
      if (!finished) stream->cancel();
      ok[size_t(i)] = finished && got == reference_greedy(prompt, 12);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(ok[size_t(i)]) << "request " << i;
  s.stop();
  EXPECT_EQ(s.stats().running, 0);
}

Request sampled_request(std::string id, std::vector<int32_t> prompt, int64_t max_tokens, uint64_t seed) {
  Request r = greedy_request(std::move(id), std::move(prompt), max_tokens);
  r.sampling.temperature = 1.0;
  r.sampling.seed = seed;
  return r;
}

// The tokens `r` gets when it runs alone in a fresh scheduler.
std::vector<int32_t> solo_tokens(Request r) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  r.stream = std::make_shared<RequestStream>();
  auto stream = r.stream;
  s.submit(std::move(r));
  run_to_end(s);
  return drain(*stream).tokens;
}

TEST(Scheduler, AGroupOfSamplesPrefillsOnceAndEachMatchesItsSoloRun) {
  for (bool can_copy : {true, false}) {
    FakeRunner runner;
    runner.can_copy = can_copy;
    Scheduler s(runner, planner_with_blocks(100, 4),
                {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
    const auto prompt = make_prompt(30, 9);
    std::vector<Request> group;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (uint64_t i = 0; i < 3; ++i) {
      group.push_back(sampled_request("n" + std::to_string(i), prompt, 12, 100 + i));
      streams.push_back(group.back().stream);
    }
    s.submit_group(group);
    EXPECT_EQ(s.stats().waiting, 3);
    run_to_end(s);
    std::set<std::vector<int32_t>> distinct;
    for (uint64_t i = 0; i < 3; ++i) {
      const auto u = drain(*streams[i]);
      EXPECT_EQ(u.finish, EndReason::Length);
      EXPECT_EQ(u.tokens, solo_tokens(sampled_request("solo", prompt, 12, 100 + i))) << "sample " << i;
      distinct.insert(u.tokens);
    }
    EXPECT_EQ(distinct.size(), 3u) << "different seeds gave the same sample";
    const auto st = s.stats();
    EXPECT_EQ(st.prefill_tokens, can_copy ? 30 : 90) << "can_copy " << can_copy;
    EXPECT_EQ(runner.copies, can_copy ? 2 : 0);
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_EQ(st.slots_used, 0);
    EXPECT_EQ(st.waiting, 0);
  }
}

TEST(Scheduler, AGroupWithoutFreeSlotsPrefillsTheRestLaterWithTheSameOutput) {
  FakeRunner runner;
  runner.device = true;  // greedy requests sample on the device, except the parent's first token
  Scheduler s(runner, planner_with_blocks(100, 1),
              {.max_num_seqs = 1, .max_num_batched_tokens = 16, .max_model_len = 128});
  const auto prompt = make_prompt(21, 4);
  std::vector<Request> group;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    group.push_back(greedy_request("g" + std::to_string(i), prompt, 7));
    streams.push_back(group.back().stream);
  }
  s.submit_group(group);
  run_to_end(s);
  for (auto& st : streams) EXPECT_EQ(drain(*st).tokens, reference_greedy(prompt, 7));
  EXPECT_EQ(runner.copies, 0);
  EXPECT_EQ(s.stats().prefill_tokens, 63);
}

TEST(Scheduler, ACancelledForkEndsAloneAndAnEndedParentLeavesItsForksToRun) {
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  const auto prompt = make_prompt(9, 2);
  std::vector<Request> group;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    group.push_back(greedy_request("c" + std::to_string(i), prompt, 5));
    streams.push_back(group.back().stream);
  }
  s.submit_group(group);
  streams[0]->cancel();  // the parent
  streams[2]->cancel();  // a fork
  run_to_end(s);
  EXPECT_EQ(drain(*streams[0]).finish, EndReason::Abort);
  EXPECT_EQ(drain(*streams[2]).finish, EndReason::Abort);
  const auto u = drain(*streams[1]);
  EXPECT_EQ(u.finish, EndReason::Length);
  EXPECT_EQ(u.tokens, reference_greedy(prompt, 5));
  EXPECT_EQ(s.stats().slots_used, 0);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

TEST(Scheduler, PromptLogprobsScoreEveryPromptTokenAfterTheFirst) {
  FakeRunner runner;
  runner.device = true;  // a request with prompt log-probabilities samples on the host anyway
  Scheduler s(runner, planner_with_blocks(100, 2),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 64});
  const auto prompt = make_prompt(37, 5);  // three chunks of 15
  for (int64_t max_tokens : {0, 3}) {
    Request r = greedy_request("p", prompt, max_tokens);
    r.prompt_logprobs = 2;
    auto stream = r.stream;
    s.submit(std::move(r));
    run_to_end(s);
    const auto u = drain(*stream);
    EXPECT_EQ(u.finish, EndReason::Length);
    EXPECT_EQ(u.tokens, reference_greedy(prompt, max_tokens));
    ASSERT_EQ(u.prompt_logprobs.size(), prompt.size() - 1);
    uint64_t h = 0;
    std::vector<float> l(kVocab);
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      h = feed(h, prompt[i]);
      logits_of(h, l);
      const TokenLogprobs want = compute_logprobs(l, prompt[i + 1], 2);
      EXPECT_EQ(u.prompt_logprobs[i].logprob, want.logprob) << "position " << i + 1;
      EXPECT_EQ(u.prompt_logprobs[i].top, want.top) << "position " << i + 1;
    }
  }
  EXPECT_EQ(runner.all_logits_items, 6);  // 3 chunks, twice
}

TEST(Scheduler, PriorityPolicyAdmitsLowerValuesFirstAndFcfsRejectsPriorities) {
  FakeRunner runner;
  Scheduler fcfs(runner, planner_with_blocks(100, 1),
                 {.max_num_seqs = 1, .max_num_batched_tokens = 16, .max_model_len = 64});
  Request bad = greedy_request("x", make_prompt(3, 1), 2);
  bad.priority = 1;
  try {
    fcfs.submit(std::move(bad));
    ADD_FAILURE() << "FCFS took a priority";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scheduling-policy priority"), std::string::npos) << e.what();
  }
  Scheduler s(runner, planner_with_blocks(100, 1),
              {.max_num_seqs = 1, .max_num_batched_tokens = 16, .max_model_len = 64,
               .policy = SchedulingPolicy::Priority});
  std::vector<std::pair<std::string, int64_t>> reqs = {{"a", 5}, {"b", 0}, {"c", 5}, {"d", -3}};
  std::map<std::string, std::shared_ptr<RequestStream>> streams;
  for (const auto& [id, prio] : reqs) {
    Request r = greedy_request(id, make_prompt(3, int(prio) + 10), 2);
    r.priority = prio;
    streams[id] = r.stream;
    s.submit(std::move(r));
  }
  std::vector<std::string> order;  // the order in which they end (one runs at a time)
  while (s.step()) {
    for (auto& [id, st] : streams) {
      if (st->finished() && std::find(order.begin(), order.end(), id) == order.end()) order.push_back(id);
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"d", "b", "a", "c"}));
}

TEST(Scheduler, MarksTheFirstAdmissionOnceForTheQueueTime) {
  // Two sequence slots for four requests (two wait), and memory for fewer tokens than they grow to (preemptions):
  // each stream reports its first admission exactly once, not again when it is re-admitted; a request cancelled
  // while it waits reports none.
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(12, 2),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 48});
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<Clock::time_point> arrivals;
  for (int i = 0; i < 5; ++i) {
    Request r = greedy_request("q" + std::to_string(i), make_prompt(6, 900 + i), 20);
    arrivals.push_back(r.arrival);
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  std::vector<int> marks(5, 0);
  std::vector<Clock::time_point> when(5);
  auto collect = [&] {
    for (size_t i = 0; i < streams.size(); ++i) {
      auto u = streams[i]->wait(std::chrono::milliseconds(0));
      if (u.scheduled) {
        ++marks[i];
        when[i] = *u.scheduled;
      }
    }
  };
  s.step();
  collect();
  EXPECT_EQ(marks, (std::vector<int>{1, 1, 0, 0, 0}));  // two slots: the others wait
  streams[4]->cancel();
  for (int i = 0; i < 100000 && s.step(); ++i) collect();
  collect();
  EXPECT_GT(s.stats().preemptions, 0);
  EXPECT_EQ(marks, (std::vector<int>{1, 1, 1, 1, 0}));
  for (size_t i = 0; i < 4; ++i) EXPECT_GE(when[i], arrivals[i]) << "request " << i;
}

TEST(Scheduler, TheSamplesOfAGroupShareTheirFirstAdmission) {
  // n = 3 samples of one prompt: the forks ride on the parent's prefill, so they were admitted when it was.
  FakeRunner runner;
  Scheduler s(runner, planner_with_blocks(100, 4),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  std::vector<Request> group;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t i = 0; i < 3; ++i) {
    group.push_back(sampled_request("g" + std::to_string(i), make_prompt(20, 3), 4, 7 + i));
    streams.push_back(group.back().stream);
  }
  s.submit_group(group);
  std::vector<std::vector<Clock::time_point>> marks(3);
  while (s.step()) {
    for (size_t i = 0; i < 3; ++i) {
      if (auto u = streams[i]->wait(std::chrono::milliseconds(0)); u.scheduled) marks[i].push_back(*u.scheduled);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    if (auto u = streams[i]->wait(std::chrono::milliseconds(0)); u.scheduled) marks[i].push_back(*u.scheduled);
  }
  ASSERT_EQ(marks[0].size(), 1u);
  EXPECT_EQ(marks[1], marks[0]);
  EXPECT_EQ(marks[2], marks[0]);
}

// ---------------------------------------------------------------------------------------------------------------
// Prefix caching
// ---------------------------------------------------------------------------------------------------------------

/// A FakeRunner with paged "KV" memory (the token written at each position of each block) and state snapshots.
/// Before every feed it checks that the sequence's block table holds its own history at every position already fed
/// (a wrongly shared, overwritten or evicted block fails the test), and a restored snapshot must hold the length
/// asked for.
class PagedFakeRunner : public FakeRunner {
 public:
  void forward(std::span<Item> items) override {
    for (Item& it : items) {
      auto& s = static_cast<FakeSeq&>(*it.seq);
      for (int64_t p = 0; p < s.length; ++p)
        ASSERT_EQ(at(it.block_table, p), s.fed[size_t(p)]) << "position " << p << " of sequence " << s.id;
    }
    std::vector<int64_t> before;
    for (Item& it : items) before.push_back(static_cast<FakeSeq&>(*it.seq).length);
    FakeRunner::forward(items);
    for (size_t k = 0; k < items.size(); ++k) {
      auto& s = static_cast<FakeSeq&>(*items[k].seq);
      for (int64_t p = before[k]; p < s.length; ++p) at(items[k].block_table, p) = s.fed[size_t(p)];
    }
  }
  bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) override {
    auto& src = static_cast<const FakeSeq&>(from);
    for (int64_t p = 0; p < src.length; ++p) at(to_blocks, p) = at(src.table, p);
    return FakeRunner::copy_sequence(from, to, to_blocks);
  }
  bool save_snapshot(const RunnerSequence& seq, int32_t snapshot) override {
    EXPECT_GE(snapshot, slots) << "a snapshot in a sequence slot";
    snapshots[snapshot] = static_cast<const FakeSeq&>(seq);
    ++saves;
    return true;
  }
  void restore_snapshot(int32_t snapshot, RunnerSequence& seq, int64_t length) override {
    auto& s = static_cast<FakeSeq&>(seq);
    ASSERT_EQ(s.length, 0) << "restored into a used sequence";
    const FakeSeq& snap = snapshots.at(snapshot);
    ASSERT_EQ(snap.length, length);
    s.h = snap.h;
    s.length = snap.length;
    s.fed = snap.fed;
    ++restores;
  }
  int32_t& at(std::span<const int32_t> table, int64_t p) {
    auto& b = pool[table[size_t(p / block_size)]];
    b.resize(size_t(block_size), -1);
    return b[size_t(p % block_size)];
  }
  int64_t slots = 0;  ///< sequence slots: snapshots live above them
  std::map<int32_t, std::vector<int32_t>> pool;
  std::map<int32_t, FakeSeq> snapshots;
  int64_t saves = 0, restores = 0;
};

/// `blocks` blocks of 4 tokens, `slots` sequence slots, `snapshots` snapshot slots, a snapshot every
/// `interval` blocks.
MemoryPlanner prefix_planner(int64_t blocks, int64_t slots, int64_t snapshots, int64_t interval) {
  PrefixCacheConfig pc{.enabled = true, .snapshot_interval_blocks = interval, .num_snapshots = snapshots};
  return MemoryPlanner(test_plan(), 4, (slots + snapshots) * 100 + blocks * 64, slots, pc);
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PrefixCache, PlannerRejectsInvalidConfigNamingTheFlag) {
  auto make = [](int64_t interval, int64_t snapshots) {
    PrefixCacheConfig pc{.enabled = true, .snapshot_interval_blocks = interval, .num_snapshots = snapshots};
    MemoryPlanner m(test_plan(), 4, 10000, 2, pc);
  };
  try {
    make(0, 2);
    ADD_FAILURE() << "interval 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--prefix-cache-snapshot-interval"), std::string::npos) << e.what();
  }
  try {
    make(1, 0);
    ADD_FAILURE() << "no snapshot slot accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--prefix-cache-snapshots"), std::string::npos) << e.what();
  }
  // The snapshots come out of the budget: 2 slots + 3 snapshots of 100 bytes, then (1000 - 500) / 64 = 7 blocks.
  PrefixCacheConfig pc{.enabled = true, .snapshot_interval_blocks = 2, .num_snapshots = 3};
  MemoryPlanner m(test_plan(), 4, 1000, 2, pc);
  EXPECT_EQ(m.total_blocks(), 7);
  EXPECT_EQ(m.total_slots(), 2);
  EXPECT_EQ(m.pool_slots(), 5);
  EXPECT_EQ(m.snapshot_interval(), 8);
}

TEST(PrefixCache, PlannerMatchesExactContentUpToTheDeepestSnapshotAndLeavesOneTokenToFeed) {
  MemoryPlanner m = prefix_planner(16, 2, 4, 1);
  const std::vector<int32_t> a = make_prompt(13, 1);  // blocks [0,4) [4,8) [8,12), one token in a fourth
  std::vector<int32_t> table;
  ASSERT_TRUE(m.try_grow(table, 13));
  PrefixCursor cursor;
  // Fed 6: block 0 registered; 6 is not a block boundary, so no block to snapshot after.
  EXPECT_EQ(m.cache_blocks(a, table, 6, cursor), -1);
  EXPECT_EQ(cursor.blocks, 1);
  EXPECT_EQ(m.cache_blocks(a, table, 8, cursor), table[1]);
  m.attach_snapshot(table[1]);
  EXPECT_EQ(m.cache_blocks(a, table, 13, cursor), -1);  // block 2 registered, not at a boundary
  EXPECT_EQ(m.cached_blocks(), 3);
  EXPECT_EQ(m.match(a).tokens, 8);  // blocks 0..2 cached, the snapshot after block 1
  const int32_t snap2 = m.attach_snapshot(table[2]);
  const PrefixMatch all = m.match(a);
  EXPECT_EQ(all.tokens, 12);
  EXPECT_EQ(all.snapshot, snap2);
  EXPECT_EQ(all.blocks, std::vector<int32_t>(table.begin(), table.begin() + 3));
  // The same 12 tokens alone: capped at 11 positions, so only the snapshot after 8.
  EXPECT_EQ(m.match(std::span(a).first(12)).tokens, 8);
  EXPECT_EQ(m.match(std::span(a).first(8)).tokens, 0);  // 7 positions: block 0 only, which has no snapshot
  // One token different in block 1: only block 0 matches, which has no snapshot.
  std::vector<int32_t> b = a;
  b[5] = (b[5] + 1) % kVocab;
  EXPECT_EQ(m.match(b).tokens, 0);
  EXPECT_EQ(m.match(b).snapshot, -1);
  // A different first block with the same later blocks matches nothing (the parent is part of the key).
  std::vector<int32_t> c = a;
  c[0] = (c[0] + 1) % kVocab;
  EXPECT_EQ(m.match(c).tokens, 0);
}

TEST(PrefixCache, PlannerSharesByReferenceAndEvictsTheLeastRecentlyReleasedTailFirst) {
  MemoryPlanner m = prefix_planner(4, 2, 4, 1);
  const std::vector<int32_t> a = make_prompt(13, 2);
  std::vector<int32_t> ta;
  ASSERT_TRUE(m.try_grow(ta, 12));  // 3 blocks, all registered with snapshots
  PrefixCursor ca;
  for (int64_t fed : {4, 8, 12}) m.attach_snapshot(m.cache_blocks(a, ta, fed, ca));
  EXPECT_EQ(m.cached_snapshots(), 3);
  // A second sequence shares two of them: three references held, one block free.
  PrefixMatch hit = m.match(std::span(a).first(9));
  ASSERT_EQ(hit.tokens, 8);
  std::vector<int32_t> tb;
  PrefixCursor cb;
  m.share(hit, tb, cb);
  EXPECT_EQ(tb, std::vector<int32_t>(ta.begin(), ta.begin() + 2));
  EXPECT_EQ(cb.blocks, 2);
  EXPECT_EQ(m.free_blocks(), 1);
  m.release(ta, -1);  // block 2 nobody holds now: evictable; blocks 0, 1 still held by the second
  EXPECT_EQ(m.free_blocks(), 2);
  EXPECT_DOUBLE_EQ(m.usage(), 0.5);
  EXPECT_EQ(m.match(a).tokens, 12) << "a released cached block stays matchable";
  // Taking two blocks uses the free one, then evicts block 2 (with its snapshot).
  std::vector<int32_t> tc;
  ASSERT_TRUE(m.try_grow(tc, 8));
  EXPECT_EQ(m.cached_blocks(), 2);
  EXPECT_EQ(m.cached_snapshots(), 2);
  EXPECT_EQ(m.match(a).tokens, 8);
  EXPECT_FALSE(m.try_grow(tc, 12)) << "held blocks are never evicted";
  m.release(tc, -1);
  m.release(tb, -1);  // released tail first: block 1 is evicted before block 0
  std::vector<int32_t> td;
  ASSERT_TRUE(m.try_grow(td, 12));
  EXPECT_EQ(m.match(a).tokens, 4);
  ASSERT_TRUE(m.try_grow(td, 16));
  EXPECT_EQ(m.match(a).tokens, 0);
  EXPECT_EQ(m.cached_blocks(), 0);
  EXPECT_EQ(m.cached_snapshots(), 0);
  m.release(td, -1);
  EXPECT_EQ(m.free_blocks(), 4);
}

TEST(PrefixCache, PlannerEvictsSnapshotsLruAndARegisteredDuplicateFollowsTheCachedBlock) {
  MemoryPlanner m = prefix_planner(16, 2, 1, 1);  // one snapshot slot
  const std::vector<int32_t> a = make_prompt(9, 3), b = make_prompt(9, 4);
  std::vector<int32_t> ta, tb;
  ASSERT_TRUE(m.try_grow(ta, 8));
  ASSERT_TRUE(m.try_grow(tb, 8));
  PrefixCursor ca, cb;
  m.attach_snapshot(m.cache_blocks(a, ta, 8, ca));
  EXPECT_EQ(m.match(a).tokens, 8);
  m.attach_snapshot(m.cache_blocks(b, tb, 8, cb));  // takes the only snapshot slot from a's block
  EXPECT_EQ(m.match(a).tokens, 0);
  EXPECT_EQ(m.match(b).tokens, 8);
  // A second sequence that computed a's blocks itself: its blocks stay private, its cursor follows a's.
  std::vector<int32_t> ta2;
  ASSERT_TRUE(m.try_grow(ta2, 8));
  PrefixCursor ca2;
  EXPECT_EQ(m.cache_blocks(a, ta2, 8, ca2), ta[1]);
  EXPECT_EQ(m.cached_blocks(), 4);
  m.release(ta2, -1);
  EXPECT_EQ(m.free_blocks(), 16 - 4) << "a private duplicate is freed, not cached";
}

/// Runs `requests` one after another (each to its end) on `s`; returns each one's drained stream.
std::vector<RequestStream::Update> run_each(Scheduler& s, std::vector<Request> requests) {
  std::vector<RequestStream::Update> out;
  for (Request& r : requests) {
    auto stream = r.stream;
    s.submit(std::move(r));
    run_to_end(s);
    out.push_back(drain(*stream));
  }
  return out;
}

TEST(PrefixCache, ASecondPromptResumesAtTheDeepestSnapshotOfItsSharedPrefixAndMatchesTheModel) {
  // Blocks of 4, a snapshot every 2 blocks (S = 8), chunks of C = 13: chunks end at the multiples of 8 and 13.
  const auto first = make_prompt(40, 7);
  for (int shared : {0, 1, 3, 4, 7, 8, 9, 16, 39, 40}) {
    PagedFakeRunner runner;
    runner.slots = 4;
    Scheduler s(runner, prefix_planner(200, 4, 8, 2),
                {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
    const auto second = concat(std::vector<int32_t>(first.begin(), first.begin() + shared), make_prompt(11, 8));
    const auto got = run_each(s, {greedy_request("first", first, 6), greedy_request("second", second, 6)});
    EXPECT_EQ(got[0].tokens, reference_greedy(first, 6)) << shared;
    EXPECT_EQ(got[1].tokens, reference_greedy(second, 6)) << shared;
    const int64_t want_hit = shared / 8 * 8;  // the snapshots of the first prompt: 8, 16, 24, 32, 40
    EXPECT_EQ(got[0].cached_tokens, 0);
    EXPECT_EQ(got[1].cached_tokens, want_hit) << shared;
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.prefix_cache_queries, int64_t(first.size() + second.size()));
    EXPECT_EQ(st.prefix_cache_hits, want_hit);
    EXPECT_EQ(st.prefill_tokens, int64_t(first.size() + second.size()) - want_hit) << shared;
    EXPECT_EQ(runner.restores, want_hit > 0 ? 1 : 0);
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_EQ(st.slots_used, 0);
  }
}

TEST(PrefixCache, TheSamePromptAgainIsCappedSoItsLastTokenIsFed) {
  PagedFakeRunner runner;
  runner.slots = 2;
  Scheduler s(runner, prefix_planner(100, 2, 4, 1),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 64});
  const auto prompt = make_prompt(16, 9);  // exactly 4 blocks
  const auto got = run_each(s, {greedy_request("a", prompt, 4), greedy_request("b", prompt, 4)});
  EXPECT_EQ(got[1].tokens, reference_greedy(prompt, 4));
  EXPECT_EQ(got[1].cached_tokens, 12);  // 15 positions at most: the snapshot after block 3 (12)
  EXPECT_EQ(s.stats().prefill_tokens, 16 + 4);
}

TEST(PrefixCache, DecodedPositionsAndPromptLogprobRequestsAreNotCached) {
  PagedFakeRunner runner;
  runner.slots = 2;
  Scheduler s(runner, prefix_planner(100, 2, 8, 1),
              {.max_num_seqs = 2, .max_num_batched_tokens = 16, .max_model_len = 64});
  const auto prompt = make_prompt(8, 10);
  const auto got = run_each(s, {greedy_request("a", prompt, 12)});
  // Only the prompt's two blocks were registered (the 11 decoded positions are not); their two snapshots.
  EXPECT_EQ(s.stats().prefix_cache_blocks, 2);
  EXPECT_EQ(s.stats().prefix_cache_snapshots, 2);
  // The prompt followed by its own output: resumes at 8, not later.
  const auto next = concat(prompt, got[0].tokens);
  Request scored = greedy_request("scored", next, 2);
  scored.prompt_logprobs = 0;
  const auto again = run_each(s, {greedy_request("b", next, 3), std::move(scored)});
  EXPECT_EQ(again[0].cached_tokens, 8);
  EXPECT_EQ(again[0].tokens, reference_greedy(next, 3));
  EXPECT_EQ(again[1].cached_tokens, 0) << "prompt log-probabilities need every prompt row";
  EXPECT_EQ(again[1].prompt_logprobs.size(), next.size() - 1);
}

TEST(PrefixCache, ManyRequestsWithSharedPrefixesUnderEvictionAndPreemptionMatchTheModel) {
  // 30 blocks of 4 for up to 6 sequences growing to ~50 positions, 3 snapshots: blocks and snapshots are evicted
  // and sequences preempted while prefixes are shared.
  PagedFakeRunner runner;
  runner.slots = 6;
  Scheduler s(runner, prefix_planner(30, 6, 3, 1),
              {.max_num_seqs = 6, .max_num_batched_tokens = 32, .max_model_len = 120});
  const std::vector<std::vector<int32_t>> roots = {make_prompt(24, 11), make_prompt(17, 12), make_prompt(9, 13)};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 30; ++i) {
    const auto& root = roots[size_t(i % 3)];
    prompts.push_back(concat(std::vector<int32_t>(root.begin(), root.begin() + (i * 5) % int(root.size() + 1)),
                             make_prompt(3 + i % 7, 400 + i)));
    Request r = greedy_request("m" + std::to_string(i), prompts.back(), 20);
    streams.push_back(r.stream);
    s.submit(std::move(r));
    if (i % 4 == 3) {  // let some finish first, so that later ones find their prefixes cached
      for (int k = 0; k < 12 && s.step(); ++k) {
      }
    }
  }
  run_to_end(s);
  int64_t hits = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto u = drain(*streams[i]);
    EXPECT_EQ(u.tokens, reference_greedy(prompts[i], 20)) << "request " << i;
    EXPECT_EQ(u.finish, EndReason::Length);
    hits += u.cached_tokens;
  }
  const SchedulerStats st = s.stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(runner.restores, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GE(st.prefix_cache_hits, hits) << "re-admissions after a preemption count again";
  EXPECT_GT(runner.saves, 3) << "no snapshot was evicted for a newer one";
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.slots_used, 0);
  EXPECT_LE(st.prefix_cache_snapshots, 3);
}

TEST(PrefixCache, ForksShareTheFullBlocksAndCopyTheLastPartialOne) {
  PagedFakeRunner runner;
  runner.slots = 4;
  Scheduler s(runner, prefix_planner(100, 4, 4, 1),
              {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128});
  const auto prompt = make_prompt(30, 9);  // 7 full blocks + 2 positions
  std::vector<Request> group;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t i = 0; i < 3; ++i) {
    group.push_back(sampled_request("n" + std::to_string(i), prompt, 12, 100 + i));
    streams.push_back(group.back().stream);
  }
  s.submit_group(group);
  // Step until the forks exist: 3 sequences hold 7 shared full blocks + a partial block each.
  while (s.stats().running < 3 && s.step()) {
  }
  EXPECT_EQ(s.stats().kv_blocks_used, 7 + 3);
  run_to_end(s);
  for (uint64_t i = 0; i < 3; ++i)
    EXPECT_EQ(drain(*streams[i]).tokens, solo_tokens(sampled_request("solo", prompt, 12, 100 + i))) << i;
  EXPECT_EQ(runner.copies, 2);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace flashnext
