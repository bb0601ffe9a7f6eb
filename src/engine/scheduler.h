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
// K, V and indexer keys of every QSA layer for block_size positions; with prefix caching a block may be shared by
// several sequences, and cached blocks nobody holds count as free: they are evicted before anyone is preempted).
// When a running sequence needs a block and none is free, the most recently admitted running sequence is
// preempted: its memory is freed and it goes back to the front of the waiting queue; when re-admitted it recomputes
// prompt + generated tokens (its sampler, RNG and output are kept), so a request is delayed, never dropped or
// mixed up.
//
// Batch invariance: a prefill chunk always covers positions [k*C, min((k+1)*C, end)) of the sequence (absolute
// positions, so a prefill from 0 is cut at the multiples of C), where C is `prefill_chunk_size`; with prefix caching
// chunks also end at every multiple of the snapshot interval S (so the state there is what any prefill of those
// tokens computes, and a prefill resumed there is cut where the uncached one is). A chunk is never split to fit a
// step's remaining budget (it waits a step instead). So the chunks a sequence is fed — and therefore its logits, bit
// for bit on a deterministic backend — do not depend on what else is in the batch, nor on whether its prefix came
// from the cache. C <= max_num_batched_tokens - max_num_seqs + 1 guarantees that the first prefilling sequence
// always fits next to the decodes of all others, so nothing starves.
// Prefix caching (MemoryPlanner, PrefixCacheConfig; docs/ENGINE.md): a request is admitted with the cached blocks
// of the longest prefix of its tokens after which a snapshot of the state exists (capped so that one token is still
// fed), shared by reference, its state restored from the snapshot; it prefills only the rest. Blocks are
// registered when a prefill chunk fills them, snapshots taken when a prefill chunk ends on a multiple of S. Positions
// fed by decode steps are not cached (the GDN recurrence of one token rounds differently from a prefill chunk, so
// a cached decode would not match an uncached prefill of the same prompt bit for bit); requests with prompt
// log-probabilities neither look up nor register (their prompt rows must be computed).
// Speculative decoding (SchedulerConfig::speculative; docs/ENGINE.md "Speculative decoding in serve"): once a step
// is scheduled as above, each decoding sequence that speculates turns its decode into a verify item of 1 + k
// tokens (its last token and k drafts of the proposer; k bounded by its K, what it may still emit, the budget and
// the free blocks left, so drafts never preempt nor delay a prefill). Its sampler chooses the token at every row in
// order, drafts are accepted while they equal those choices; on a mismatch the runner rolls the sequence's state
// back to the verify's start and advances it over the accepted tokens from the inputs the verify kept
// (Runner::checkpoint / rollback; Model::replay_state), so the next step feeds the correction; a runner that cannot
// advance it has the next step feed the accepted tokens and the correction again as an ordinary item. Tokens are
// emitted one by one through the usual stop rules.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/request.h"
#include "engine/speculative.h"
#include "loader/memory_plan.h"
#include "ops/ops.h"

namespace flashnext {

class Model;
struct CachePool;

// ------------------------------------------------------------------------------------------------------------------
// Memory planner
// ------------------------------------------------------------------------------------------------------------------

/// Prefix caching (issue 19; docs/ENGINE.md, "Prefix caching"). Off: blocks are private to a sequence.
struct PrefixCacheConfig {
  bool enabled = false;
  /// A snapshot of the per-sequence state (GDN conv + recurrent, PLE conv + n-gram history) is taken every
  /// `snapshot_interval_blocks` blocks of prefilled positions; a request resumes only at a snapshot. >= 1.
  int64_t snapshot_interval_blocks = 16;  // serve's default (docs/ENGINE.md: measured on the H200)
  /// Snapshot slots, carved out of the budget next to the sequence slots (each slot_bytes()); >= 1 when enabled.
  int64_t num_snapshots = 0;
};

/// A prefix of a prompt found in the prefix cache (MemoryPlanner::match).
struct PrefixMatch {
  std::vector<int32_t> blocks;  ///< cached blocks of positions [0, tokens), in order
  int32_t snapshot = -1;        ///< the pool slot holding the state after `tokens` positions; -1: no match
  int64_t tokens = 0;           ///< matched positions: a multiple of the snapshot interval, 0 when none
};

/// Where a sequence's blocks stand in the prefix cache (MemoryPlanner::cache_blocks); kept by the scheduler.
struct PrefixCursor {
  int64_t blocks = 0;   ///< leading blocks of the sequence registered (or found) in the cache
  int32_t parent = -1;  ///< the cached block that holds the content of the last of them; -1: none yet
  uint32_t parent_generation = 0;
  bool broken = false;  ///< its parent was evicted under it: nothing more of this sequence is cached
};

/// Paged memory of the running sequences: KV blocks (K, V and raw indexer keys of every QSA layer for `block_size`
/// positions) and per-sequence state slots (GDN recurrent + conv state, PLE conv state + n-gram history), carved
/// out of one byte budget: slots first (one per sequence the scheduler may run, then the prefix cache's snapshot
/// slots), the rest in blocks. Block and slot ids are handed out from free lists, so a paged backend can index its
/// cache with them.
///
/// With prefix caching, blocks are reference-counted: a full block of prefilled positions is registered under its
/// block hash (the content: its tokens, and the cached block before it, checked exactly on lookup, so a hash
/// collision never matches), shared by reference between sequences whose prompts begin alike, and when no sequence
/// holds it any more it stays cached on an LRU list until try_grow needs room (evicted least recently released
/// first; a sequence releases its tail first, so chains shrink from the end). A snapshot belongs to the cached block
/// it follows and goes with it; snapshots are evicted LRU among themselves when a new one needs a slot.
class MemoryPlanner {
 public:
  /// `plan`: bytes per token and per sequence (loader/memory_plan.h state_plan, at the backend's element sizes).
  /// `checkpoint_slots` (speculative decoding: 0 or num_slots): one more state slot per sequence slot, where a
  /// verify's rollback state is kept (checkpoint_slot()). Throws Error when block_size < 1, num_slots < 1, the budget
  /// cannot hold the slots (snapshot and checkpoint slots too) plus one block, or the prefix cache config is invalid
  /// (interval < 1, no snapshot slot), naming the serve flag.
  MemoryPlanner(const StatePlan& plan, int64_t block_size, int64_t budget_bytes, int64_t num_slots,
                PrefixCacheConfig prefix = {}, int64_t checkpoint_slots = 0);

  int64_t block_size() const { return block_size_; }
  int64_t block_bytes() const { return block_bytes_; }  ///< (KV + indexer bytes per token) * block_size
  int64_t slot_bytes() const { return slot_bytes_; }    ///< GDN + conv + PLE state bytes of one sequence
  /// Bytes of one sequence's state slot under `plan`: GDN recurrent + GDN conv + PLE state (what slot_bytes() is).
  static int64_t state_slot_bytes(const StatePlan& plan) {
    return plan.gdn_state_bytes_per_sequence + plan.gdn_conv_state_bytes_per_sequence +
           plan.ple_state_bytes_per_sequence;
  }
  /// Bytes of one KV block of `block_size` tokens under `plan`: K, V and indexer keys (what block_bytes() is).
  static int64_t kv_block_bytes(const StatePlan& plan, int64_t block_size) {
    return (plan.kv_bytes_per_token + plan.indexer_bytes_per_token) * block_size;
  }
  /// The default --prefix-cache-snapshots: one per sequence slot, but snapshots take at most a quarter of
  /// `budget_bytes` and never what the constructor's other reservations need — the `num_slots` sequence slots, the
  /// `checkpoint_slots` and the blocks of one `max_model_len` sequence — so that the cache on by default cannot make a
  /// configuration fail that starts without it. 0 when not even one fits.
  static int64_t default_snapshots(const StatePlan& plan, int64_t block_size, int64_t budget_bytes, int64_t num_slots,
                                   int64_t checkpoint_slots, int64_t max_model_len);
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t total_blocks() const { return int64_t(all_blocks_); }
  /// Blocks a sequence can get: free ones plus cached ones no sequence holds (evictable).
  int64_t free_blocks() const { return int64_t(free_blocks_.size() + lru_.size()); }
  int64_t total_slots() const { return int64_t(all_slots_); }  ///< sequence slots (ids 0 .. total_slots()-1)
  int64_t free_slots() const { return int64_t(free_slots_.size()); }
  /// Fraction of KV blocks held by sequences, in [0, 1] (cached blocks nobody holds count as free).
  double usage() const { return total_blocks() ? double(total_blocks() - free_blocks()) / double(total_blocks()) : 0; }

  const PrefixCacheConfig& prefix_config() const { return prefix_; }
  bool prefix_caching() const { return prefix_.enabled; }
  /// Positions between two snapshots (snapshot_interval_blocks * block_size); 0 without prefix caching.
  int64_t snapshot_interval() const { return prefix_.enabled ? prefix_.snapshot_interval_blocks * block_size_ : 0; }
  /// Slots of the cache pool: the sequence slots, the snapshot slots (ids total_slots() ..), then the checkpoint
  /// slots.
  int64_t pool_slots() const { return int64_t(all_slots_) + prefix_.num_snapshots + checkpoint_slots_; }
  /// The pool slot that holds the speculative checkpoint of the sequence in slot `slot`; -1 without checkpoint slots.
  int32_t checkpoint_slot(int32_t slot) const {
    return checkpoint_slots_ > 0 ? int32_t(int64_t(all_slots_) + prefix_.num_snapshots + slot) : -1;
  }
  int64_t cached_blocks() const { return int64_t(by_hash_.size()); }  ///< blocks registered in the prefix cache
  int64_t cached_snapshots() const { return prefix_.num_snapshots - int64_t(free_snapshots_.size()); }
  int64_t evicted_blocks() const { return evicted_blocks_; }  ///< cached blocks evicted for room so far

  /// Blocks that `tokens` positions occupy.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  /// Grows `table` so that it covers `tokens` positions, from the free blocks first, then by evicting cached blocks
  /// nobody holds (LRU). Returns false, changing nothing, when too few blocks are free or evictable.
  bool try_grow(std::vector<int32_t>& table, int64_t tokens);
  /// A free state slot id, or nullopt when all are taken.
  std::optional<int32_t> acquire_slot();
  /// Drops one reference to each block of `table` (left empty; a block nobody holds is freed, or kept on the LRU
  /// list when cached) and returns `slot` (when >= 0) to the free list.
  void release(std::vector<int32_t>& table, int32_t slot);

  /// The longest prefix of `tokens` whose blocks are cached and after which a snapshot exists, capped so that at
  /// least one token is left to feed (positions < tokens.size()). Changes nothing (share() takes it).
  PrefixMatch match(std::span<const int32_t> tokens) const;
  /// Appends the match's blocks to `table` (empty), one reference each, marks its snapshot recently used and points
  /// `cursor` after them.
  void share(const PrefixMatch& m, std::vector<int32_t>& table, PrefixCursor& cursor);
  /// Appends `blocks` (held by another sequence) to `table`, one more reference each: the full blocks a fork shares
  /// with its parent (its last, partial block is copied instead: copy-on-write). Needs prefix caching (refcounts).
  void share_held(std::span<const int32_t> blocks, std::vector<int32_t>& table);
  /// Registers the full blocks of `table` that cover positions [cursor.blocks * block_size, fed) — `tokens` being
  /// the sequence's tokens — under their block hashes (a block whose content is already cached is left private and
  /// the cursor follows the cached one). Returns the cached block that holds positions [fed - block_size, fed) when
  /// `fed` is a positive multiple of block_size and that block is now cached, else -1.
  int32_t cache_blocks(std::span<const int32_t> tokens, const std::vector<int32_t>& table, int64_t fed,
                       PrefixCursor& cursor);
  /// Whether cached block `block` already has a snapshot.
  bool has_snapshot(int32_t block) const { return snapshot_of_[size_t(block)] >= 0; }
  /// A snapshot slot for cached block `block` (a free one, else the least recently used one, taken from its block).
  /// The caller fills it (Runner::save_snapshot) or gives it back with drop_snapshot.
  int32_t attach_snapshot(int32_t block);
  /// Detaches and frees the snapshot of `block` (when it has one).
  void drop_snapshot(int32_t block);

 private:
  struct CachedBlock {
    uint64_t hash = 0;
    int32_t parent = -1;
    uint32_t parent_generation = 0;
    std::vector<int32_t> tokens;
  };
  uint64_t block_hash(int32_t parent, uint32_t parent_generation, std::span<const int32_t> tokens) const;
  /// The cached block of content (parent, tokens), or -1.
  int32_t find(int32_t parent, uint32_t parent_generation, std::span<const int32_t> tokens) const;
  void uncache(int32_t block);  // removes it from the cache (its snapshot too); its generation moves on

  int64_t block_size_, block_bytes_, slot_bytes_, budget_bytes_;
  size_t all_blocks_ = 0, all_slots_ = 0;
  int64_t checkpoint_slots_ = 0;
  PrefixCacheConfig prefix_;
  std::vector<int32_t> free_blocks_, free_slots_;  // stacks; lowest id on top
  // Prefix cache (per block id): references, registration, the LRU list of cached blocks nobody holds.
  std::vector<int32_t> refs_;
  std::vector<uint32_t> generation_;
  std::vector<std::optional<CachedBlock>> cached_;
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;  // front: evicted first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<int32_t> snapshot_of_;  // per block: its snapshot slot or -1
  std::vector<int32_t> free_snapshots_;
  std::list<int32_t> snapshot_lru_;  // snapshot slots in use, front: evicted first
  std::vector<std::list<int32_t>::iterator> snapshot_pos_;
  std::vector<int32_t> snapshot_block_;  // per snapshot (slot - total_slots()): its block
  int64_t evicted_blocks_ = 0;
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
    /// Speculative verify with device sampling (needs `sampling`): [ids.size()] out, the token sampled after every
    /// id, row r under `sampling` with offset sampling->offset + r (`token` is then the last of them). Empty: only
    /// the last row is sampled.
    std::span<int32_t> row_tokens;
    /// MTP proposer: keep the trunk's pre-mixer wide residual rows of this item in the sequence for propose_mtp.
    bool keep_hidden = false;
    std::string error;  ///< out: set when this item failed (its sequence is then unchanged)
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
  /// Prefix cache: copies the per-sequence state of `seq` that is not per-token (GDN conv + recurrent state, PLE
  /// conv state and n-gram history, and its length) into pool slot `snapshot` (MemoryPlanner::attach_snapshot).
  /// Returns false when the runner cannot take snapshots (no prefix cache hits then); throws Error when it fails.
  virtual bool save_snapshot(const RunnerSequence& seq, int32_t snapshot) {
    (void)seq, (void)snapshot;
    return false;
  }
  /// Prefix cache: makes `seq` (fresh, in its own slot) resume from snapshot `snapshot`: the state saved there and
  /// its length, which must be `length`; its first blocks (shared, read only) hold the KV rows of those positions.
  /// Throws Error when the snapshot does not hold `length` positions or the copy fails.
  virtual void restore_snapshot(int32_t snapshot, RunnerSequence& seq, int64_t length) {
    (void)snapshot, (void)seq, (void)length;
    fail("restore_snapshot: this runner takes no snapshots");
  }
  /// Speculative decoding (docs/ENGINE.md "Speculative decoding in serve"): saves the per-sequence recurrent state
  /// of `seq` (GDN conv + recurrent, PLE conv tails and n-gram history, its lengths) inside it, before a verify
  /// step, for one rollback(). Returns false when the runner cannot (the scheduler then does not speculate).
  virtual bool checkpoint(RunnerSequence& seq) {
    (void)seq;
    return false;
  }
  /// Puts the state saved by checkpoint() back into `seq` and, where the runner kept the verify's state inputs,
  /// advances it over the verify's first `keep` tokens (the accepted ones) without feeding them again; forgets the
  /// checkpoint. Returns the tokens the state now holds past the checkpoint: `keep`, or 0 when the runner cannot
  /// advance it (the scheduler then feeds those tokens again). KV rows past the new length stay and are overwritten
  /// when those positions are fed again; hidden rows kept past it are dropped. Throws Error when there is no
  /// checkpoint.
  virtual int64_t rollback(RunnerSequence& seq, int64_t keep) {
    (void)seq, (void)keep;
    fail("rollback: this runner takes no checkpoints");
  }
  /// Forgets the checkpoint of `seq` (all drafts were accepted), if any.
  virtual void release_checkpoint(RunnerSequence& seq) { (void)seq; }
  /// Whether propose_mtp works (the model's MTP layer is loaded).
  virtual bool has_mtp() const { return false; }
  /// MTP drafts for `seq`: first catches the MTP layer up over the trunk rows kept from its items
  /// (Item::keep_hidden) at positions mtp_length .. length-1, pairing row p with tokens[p + 1] (`tokens`: the
  /// sequence's tokens, at least length + 1 of them), then chains the MTP layer greedily for up to `max_drafts`
  /// draft tokens (fewer at max_position_embeddings). Draft positions' MTP K/V lie in `block_table` (the
  /// sequence's KV blocks, as for its next step), which must cover length + max_drafts positions. No drafts when no
  /// rows were kept (a forked sequence before its first decode). Throws Error without an MTP layer.
  virtual std::vector<int32_t> propose_mtp(RunnerSequence& seq, std::span<const int32_t> block_table,
                                           std::span<const int32_t> tokens, int max_drafts) {
    (void)seq, (void)block_table, (void)tokens, (void)max_drafts;
    fail("propose_mtp: this runner has no MTP layer");
  }
  /// One sequence's part of propose_mtp_batch: propose_mtp's arguments.
  struct MtpRequest {
    RunnerSequence* seq = nullptr;
    std::span<const int32_t> block_table, tokens;
    int max_drafts = 0;
  };
  /// propose_mtp for several distinct sequences, their drafts in request order, each equal to propose_mtp's for it.
  /// This default runs propose_mtp one request after another; ModelRunner batches the MTP steps of all of them (one
  /// per catch-up round and per draft position). Throws Error as propose_mtp; then no request's drafts are given,
  /// and (ModelRunner) every sequence's MTP layer and kept rows are as before the call, so each can draft alone.
  virtual std::vector<std::vector<int32_t>> propose_mtp_batch(std::span<const MtpRequest> requests) {
    std::vector<std::vector<int32_t>> drafts;
    for (const MtpRequest& r : requests) drafts.push_back(propose_mtp(*r.seq, r.block_table, r.tokens, r.max_drafts));
    return drafts;
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
  /// Allocates the pool: planner.total_blocks() blocks of planner.block_size() positions, pool_slots() slots.
  /// Speculative checkpoints go to the planner's checkpoint slots when it has them (a device copy into memory of the
  /// budget), else to a fresh copy of the state per verify (Model::snapshot_state).
  /// `device_sampling`: let plain requests sample on the device when the backend can (Ops::samples_on_device);
  /// false: every request samples on the host (engine/sampling.h, the same seeded draws on every backend).
  ModelRunner(Model& model, const MemoryPlanner& planner, bool device_sampling = true);
  int64_t vocab_size() const override;
  std::unique_ptr<RunnerSequence> new_sequence(int32_t slot) override;
  void forward(std::span<Item> items) override;
  bool copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) override;
  bool save_snapshot(const RunnerSequence& seq, int32_t snapshot) override;
  void restore_snapshot(int32_t snapshot, RunnerSequence& seq, int64_t length) override;
  int64_t ple_rows_fetched() const override { return ple_rows_; }
  bool samples_on_device() const override;
  bool checkpoint(RunnerSequence& seq) override;
  int64_t rollback(RunnerSequence& seq, int64_t keep) override;
  void release_checkpoint(RunnerSequence& seq) override;
  bool has_mtp() const override;
  std::vector<int32_t> propose_mtp(RunnerSequence& seq, std::span<const int32_t> block_table,
                                   std::span<const int32_t> tokens, int max_drafts) override;
  std::vector<std::vector<int32_t>> propose_mtp_batch(std::span<const MtpRequest> requests) override;
  /// Rows of one batched MTP catch-up step at most (a single larger chunk runs alone, as it did before batching).
  static constexpr int64_t kMtpCatchUpRows = 1024;

 private:
  Model& model_;
  std::shared_ptr<CachePool> cache_;
  bool device_sampling_;
  int64_t ple_rows_per_token_;
  int64_t ple_rows_ = 0;
  /// Per pool slot: what a snapshot saved there remembers besides the slot's tensors (length; -1: none).
  struct SnapshotMeta {
    int64_t length = -1;
    std::vector<std::vector<int64_t>> ple_history;
  };
  std::vector<SnapshotMeta> snapshots_;
  /// Speculative checkpoints in pool slots (MemoryPlanner::checkpoint_slot) instead of fresh copies; -1: none.
  std::vector<int32_t> checkpoint_slot_of_;  // per sequence slot
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
  /// Speculative decoding of the running sequences (`serve --speculative mtp:K | ngram:K`; docs/ENGINE.md): each
  /// decoding sequence that speculates gets a verify item of 1 + up to K tokens. Method::None: off.
  SpeculativeConfig speculative{};
  /// The drafts of Method::Custom (tests, external draft models): called with the sequence's tokens so far.
  Proposer proposer{};
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
  /// Prefix cache totals (vLLM's prefix_cache_queries / _hits): prompt tokens of admissions looked up, and of them
  /// the tokens found cached (not fed); now: blocks registered, snapshots held.
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
  int64_t prefix_cache_blocks = 0, prefix_cache_snapshots = 0;
  int64_t prefix_cache_evictions = 0;  ///< cached blocks evicted for room so far
  /// Speculative decoding totals (SpeculativeStats' meaning, over every request): verify steps (items with at least
  /// one draft), draft tokens proposed, drafts accepted (one equal to the token that ends its request included),
  /// tokens the verify steps emitted (accepted + one each, less what a stop condition cut), rollbacks (partial
  /// acceptance: state restored, the accepted tokens fed again).
  int64_t spec_verify_steps = 0, spec_drafted = 0, spec_accepted = 0, spec_emitted = 0, spec_rollbacks = 0;
  /// Accepted drafts by position in the draft (index 0: the first draft), vLLM's num_accepted_tokens_per_pos.
  std::vector<int64_t> spec_accepted_per_pos;
};

/// Continuous-batching scheduler (see the top of this file). Thread-safe: submit() and stats() may be called from
/// any thread while the engine thread (start()) runs steps.
class Scheduler {
 public:
  /// Throws Error on an invalid config: max_num_seqs < 1, max_num_batched_tokens < max_num_seqs, a chunk size
  /// above max_num_batched_tokens - max_num_seqs + 1, max_model_len < 2, a planner that cannot hold one
  /// sequence of max_model_len tokens, speculation with K outside 1..8, Method::Mtp over a runner without an MTP
  /// layer, or Method::Custom without a proposer (each naming --speculative).
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
  /// outside [-1, 20], prompt_logprobs outside [-1, 20], a priority other than 0 under FCFS, or speculative_tokens
  /// above 0 without speculation or above its K (Request::speculative_tokens); QueueFullError when
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
  bool emit_one(Seq& s, std::span<float> logits, int32_t device_token, Clock::time_point now);
  std::vector<int32_t> propose(Seq& s, int max_drafts);
  /// Drafts cut to max_drafts; Error naming a token outside the vocabulary.
  std::vector<int32_t> checked_drafts(std::vector<int32_t> d, int max_drafts) const;
  void verify(Seq& s, int64_t drafts, Runner::Item& it, Clock::time_point now);
  void order_by_priority();
  void preempt(Seq& s);
  int64_t next_chunk(const Seq& s) const;
  int64_t chunk_from(const Seq& s, int64_t from) const;
  void cache_prefix(Seq& s);
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
  bool snapshots_ok_ = true;  // false once the runner said it takes no snapshots (Runner::save_snapshot)
  std::thread thread_;
};

}  // namespace flashnext
