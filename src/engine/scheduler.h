// Continuous-batching scheduler with chunked prefill (the vLLM V1 / SGLang scheme), the memory planner it admits
// requests against, and the Runner interface through which it drives a model backend.
//
// One engine step:
//   1. new requests join the waiting queue (FCFS); cancelled requests are dropped and their memory freed;
//   2. running requests are served first, in admission order: a decode feeds 1 token, a prefill feeds its next
//      chunk; then waiting requests are admitted while there is a free sequence slot, memory and step budget.
//      Prefill and decode tokens mix in one step; the step feeds at most `max_num_batched_tokens` tokens;
//   3. the Runner runs the step; every sequence whose known tokens are now all fed samples its next token: on the
//      device when the Runner can (Runner::samples_on_device) and the request needs nothing but temperature, top-k,
//      top-p and min-p (no penalties, logit bias, min_tokens, constraint or logprobs), so only the token comes back;
//      else on the host from its logits.
// Order: FCFS (arrival order; a preempted request goes back to the front), or with SchedulingPolicy::Priority by
// (priority, arrival): the waiting queue is admitted and the running sequences are served in that order, and the
// victim of a preemption is the last of it (vLLM's priority policy, without preempting a running request for a
// waiting one of higher priority).
// n samples of one prompt (submit_group): the first request is prefilled alone; when its prompt is fed, the others
// are forked from it (Runner::copy_sequence: KV blocks and state slot copied) and draw their first token from the
// same logits with their own samplers. A fork that finds no free slot or blocks then, or a runner that cannot copy,
// is prefilled on its own instead (the same output, more work).
// Memory: a sequence holds one GDN/PLE state slot and ceil(fed tokens / block_size) KV blocks (each block holds
// K, V and indexer keys of every QSA layer for block_size positions). When a running sequence needs a block and
// none is free, the most recently admitted running sequence is preempted: its memory is freed and it goes back to
// the front of the waiting queue; when re-admitted it recomputes prompt + generated tokens (its sampler, RNG and
// output are kept), so a request is delayed, never dropped or mixed up.
//
// Batch invariance: a prefill chunk always covers [k*C, min((k+1)*C, end)) of the tokens still to feed, where C
// is `prefill_chunk_size`, and a chunk is never split to fit a step's remaining budget (it waits a step instead).
// So the chunks a sequence is fed — and therefore its logits, bit for bit on a deterministic backend — do not
// depend on what else is in the batch. C <= max_num_batched_tokens - max_num_seqs + 1 guarantees that the first
// prefilling sequence always fits next to the decodes of all others, so nothing starves.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/request.h"
#include "loader/memory_plan.h"
#include "ops/ops.h"

namespace flashnext {

class Model;
struct CachePool;

// ------------------------------------------------------------------------------------------------------------------
// Memory planner
// ------------------------------------------------------------------------------------------------------------------

/// Paged memory of the running sequences: KV blocks (K, V and raw indexer keys of every QSA layer for `block_size`
/// positions) and per-sequence state slots (GDN recurrent + conv state, PLE conv state + n-gram history), carved
/// out of one byte budget: slots first (one per sequence the scheduler may run), the rest in blocks.
/// Block and slot ids are handed out from free lists, so a paged backend can index its cache with them.
class MemoryPlanner {
 public:
  /// `plan`: bytes per token and per sequence (loader/memory_plan.h state_plan, at the backend's element sizes).
  /// Throws Error when block_size < 1, num_slots < 1, or the budget cannot hold the slots plus one block.
  MemoryPlanner(const StatePlan& plan, int64_t block_size, int64_t budget_bytes, int64_t num_slots);

  int64_t block_size() const { return block_size_; }
  int64_t block_bytes() const { return block_bytes_; }  ///< (KV + indexer bytes per token) * block_size
  int64_t slot_bytes() const { return slot_bytes_; }    ///< GDN + conv + PLE state bytes of one sequence
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t total_blocks() const { return int64_t(all_blocks_); }
  int64_t free_blocks() const { return int64_t(free_blocks_.size()); }
  int64_t total_slots() const { return int64_t(all_slots_); }
  int64_t free_slots() const { return int64_t(free_slots_.size()); }
  /// Fraction of KV blocks in use, in [0, 1].
  double usage() const { return total_blocks() ? double(total_blocks() - free_blocks()) / double(total_blocks()) : 0; }

  /// Blocks that `tokens` positions occupy.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  /// Grows `table` so that it covers `tokens` positions. Returns false, changing nothing, when too few blocks are free.
  bool try_grow(std::vector<int32_t>& table, int64_t tokens);
  /// A free state slot id, or nullopt when all are taken.
  std::optional<int32_t> acquire_slot();
  /// Returns the blocks of `table` (left empty) and `slot` (when >= 0) to the free lists.
  void release(std::vector<int32_t>& table, int32_t slot);

 private:
  int64_t block_size_, block_bytes_, slot_bytes_, budget_bytes_;
  size_t all_blocks_ = 0, all_slots_ = 0;
  std::vector<int32_t> free_blocks_, free_slots_;  // stacks; lowest id on top
};

// ------------------------------------------------------------------------------------------------------------------
// Runner: the model backend as the scheduler sees it
// ------------------------------------------------------------------------------------------------------------------

/// Opaque per-sequence state owned by a Runner.
class RunnerSequence {
 public:
  virtual ~RunnerSequence() = default;
};

/// Runs engine steps for a model backend.
class Runner {
 public:
  /// One sequence's part of a step.
  struct Item {
    RunnerSequence* seq = nullptr;
    std::span<const int32_t> ids;          ///< tokens to feed: a prefill chunk or one decode token
    std::span<const int32_t> block_table;  ///< KV blocks assigned to the sequence (paged backends)
    int32_t slot = -1;                     ///< state slot of the sequence (paged backends)
    std::span<float> logits;               ///< [vocab] out: next-token logits after the last id; empty: not wanted
    /// [ids.size() * vocab] out: the logits after every id, row-major (prompt log-probabilities); empty: not wanted.
    std::span<float> all_logits;
    /// When set (only if samples_on_device()), the next token is sampled on the device under these parameters and
    /// returned in `token` instead of the logits (`logits` is then left alone).
    const TokenSampling* sampling = nullptr;
    int32_t token = -1;  ///< out: the token sampled on the device
    std::string error;   ///< out: set when this item failed (its sequence is then unchanged)
  };

  virtual ~Runner() = default;
  virtual int64_t vocab_size() const = 0;
  /// State of a fresh, empty sequence that lives in state slot `slot` (from the MemoryPlanner).
  virtual std::unique_ptr<RunnerSequence> new_sequence(int32_t slot) = 0;
  /// Runs one step over `items` (distinct sequences). A failure of one item is reported in its `error` and must not
  /// affect the others.
  virtual void forward(std::span<Item> items) = 0;
  /// Makes `to` (fresh, in its own slot) remember what `from` remembers, its KV rows copied into `to_blocks`
  /// (covering from's length). Returns false when the runner cannot copy sequences (the caller then feeds `to`
  /// itself); throws Error when the copy fails.
  virtual bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) {
    (void)from, (void)to, (void)to_blocks;
    return false;
  }
  /// PLE table rows gathered so far (monotonic; 0 for a model without PLE).
  virtual int64_t ple_rows_fetched() const { return 0; }
  /// Whether items may ask for device sampling (Item::sampling): then only the sampled token comes back.
  virtual bool samples_on_device() const { return false; }
};

/// Runner over a flashnext::Model: one Model::forward_batch per step over a cache pool with the planner's blocks
/// and slots (the items' block tables and slots index it directly). Items that fail Model::validate get their
/// error and are left out of the step; a failure of the step itself is reported on every item of it.
/// PLE rows counted: per token fed, (ngram_size - 1) * heads_per_ngram rows in each PLE layer (docs MODEL.md, PLE).
class ModelRunner : public Runner {
 public:
  /// Allocates the pool: planner.total_blocks() blocks of planner.block_size() positions, total_slots() slots.
  /// `device_sampling`: let plain requests sample on the device when the backend can (Ops::samples_on_device);
  /// false: every request samples on the host (engine/sampling.h, the same seeded draws on every backend).
  ModelRunner(Model& model, const MemoryPlanner& planner, bool device_sampling = true);
  int64_t vocab_size() const override;
  std::unique_ptr<RunnerSequence> new_sequence(int32_t slot) override;
  void forward(std::span<Item> items) override;
  bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) override;
  int64_t ple_rows_fetched() const override { return ple_rows_; }
  bool samples_on_device() const override;

 private:
  Model& model_;
  std::shared_ptr<CachePool> cache_;
  bool device_sampling_;
  int64_t ple_rows_per_token_;
  int64_t ple_rows_ = 0;
};

// ------------------------------------------------------------------------------------------------------------------
// Scheduler
// ------------------------------------------------------------------------------------------------------------------

/// The order in which requests are admitted and served (vLLM's --scheduling-policy).
enum class SchedulingPolicy {
  Fcfs,      ///< arrival order
  Priority,  ///< by Request::priority (lower first), then arrival
};

/// Limits of the scheduler (vLLM's names).
struct SchedulerConfig {
  int64_t max_num_seqs = 64;              ///< most sequences running at once
  int64_t max_num_batched_tokens = 2048;  ///< most tokens fed in one step (>= max_num_seqs)
  /// Prefill chunk length C (see "Batch invariance"); 0: max_num_batched_tokens - max_num_seqs + 1.
  int64_t prefill_chunk_size = 0;
  int64_t max_model_len = 0;  ///< most tokens (prompt + output) of a sequence; required, >= 2
  int64_t max_waiting = 256;  ///< most requests waiting for admission; submit() beyond it throws QueueFullError
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
};

/// submit() when the waiting queue is full (the server answers 503).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

/// A snapshot of the scheduler for metrics and logs.
struct SchedulerStats {
  int64_t running = 0, waiting = 0;  ///< requests in each state (waiting includes preempted ones)
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, slots_total = 0, slots_used = 0;
  double kv_usage = 0;                            ///< kv_blocks_used / kv_blocks_total
  int64_t preemptions = 0;                        ///< total so far
  int64_t steps = 0;                              ///< total so far
  int64_t prefill_tokens = 0, decode_tokens = 0;  ///< totals fed so far (recomputation included)
  int64_t ple_rows_fetched = 0;
};

/// Continuous-batching scheduler (see the top of this file). Thread-safe: submit() and stats() may be called from
/// any thread while the engine thread (start()) runs steps.
class Scheduler {
 public:
  /// Throws Error on an invalid config: max_num_seqs < 1, max_num_batched_tokens < max_num_seqs, a chunk size
  /// above max_num_batched_tokens - max_num_seqs + 1, max_model_len < 2, or a planner that cannot hold one
  /// sequence of max_model_len tokens.
  Scheduler(Runner& runner, MemoryPlanner planner, SchedulerConfig config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerConfig& config() const { return config_; }
  const MemoryPlanner& planner() const { return planner_; }
  /// Vocabulary size of the model (logit rows; bounds token ids).
  int64_t vocab_size() const { return runner_.vocab_size(); }

  /// Checks `r` and queues it. Throws Error (bad request) when the prompt is empty, holds an id outside the
  /// vocabulary, prompt + max_tokens exceeds max_model_len, a sampling value is out of range or top_logprobs is
  /// outside [-1, 20], prompt_logprobs outside [-1, 20], or a priority other than 0 under FCFS; QueueFullError when
  /// `max_waiting` requests already wait. Its stream receives the tokens.
  void submit(Request r);
  /// Submits n >= 1 samples of one prompt (the n choices of an OpenAI request; all `group` prompts must be equal):
  /// the prompt is prefilled once and the others fork from it (see the top of this file). Each request keeps its
  /// own stream and sampling parameters (give them different seeds). Throws like submit() for any of them, before
  /// any is queued; QueueFullError when the queue cannot take all of them.
  void submit_group(std::vector<Request> group);

  /// Starts the engine thread, which runs steps while there is work.
  void start();
  /// Stops the engine thread; every unfinished request ends with EndReason::Abort.
  void stop();
  /// Runs one step on the calling thread (tests and tools; not while the engine thread runs). Returns false when
  /// there was nothing to do.
  bool step();

  SchedulerStats stats() const;

 private:
  struct Seq;
  void loop();
  bool step_impl();
  std::unique_ptr<Seq> make_seq(Request r) const;
  void finish(Seq& s, EndReason reason, std::optional<int32_t> stop_token = {}, std::string error = {});
  void emit(Seq& s, std::span<float> logits, int32_t device_token, Clock::time_point now);
  void fork(Seq& parent, std::span<const float> logits, Clock::time_point now);
  void order_by_priority();
  void preempt(Seq& s);
  int64_t next_chunk(const Seq& s) const;
  void publish_stats();

  Runner& runner_;
  MemoryPlanner planner_;
  SchedulerConfig config_;

  // Shared with other threads (mutex_).
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> inbox_;
  int64_t inbox_waiting_ = 0;  // requests in inbox_, forks counted
  int64_t arrivals_ = 0;
  bool stopping_ = false;
  SchedulerStats stats_;

  // Engine thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order (Priority: sorted by priority each step)
  std::vector<std::unique_ptr<Seq>> orphans_;  // forks whose parent ended first: they join waiting_ next step
  int64_t admissions_ = 0;
  SchedulerStats counters_;
  std::vector<std::vector<float>> logits_buf_;
  std::thread thread_;
};

}  // namespace flashnext
