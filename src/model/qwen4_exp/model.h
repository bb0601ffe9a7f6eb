// qwen4_exp (Qwen3.8-Flash-Next) language model: loading and the incremental forward.
//
// Usage:
//   auto model = flashnext::Model::load("models/tiny-b-random");
//   flashnext::SequenceState seq = model->new_sequence();
//   std::vector<float> logits = model->forward(seq, prompt_ids);           // [T * vocab], one row per prompt token
//   int next = argmax(last row); model->forward(seq, {&next, 1}, ...);     // decode: one token at a time
//
// A SequenceState holds everything the model remembers about one sequence (QSA K/V and raw indexer keys, GDN conv
// tails and recurrent states, PLE token history and conv tails, the number of tokens seen), in paged cache memory
// (state.h). Feeding a prompt in chunks of any size, then single tokens, gives the same logits as one forward over
// everything (up to float rounding).
//
// Batched steps (the serving engine): sequences of one shared CachePool (new_cache + new_sequence(cache, slot), their
// block tables set by the caller) are fed together with forward_batch: prefill chunks and decode tokens of different
// sequences in one step; every token-wise computation (projections, MoE, norms) runs once over all rows. The math is
// the reference's (transformers `models/qwen4_exp`, docs MODEL.md); every computation goes through the ops interface
// (ops/ops.h), so the same model code runs on every backend.
//
// Tensor parallelism (ModelOptions::tp > 1): the model is split over `tp` ranks as loader/sharding.h plans it, each
// rank with its own backend, weights and caches; a step runs on all ranks at once (one thread per rank, rank 0 on the
// caller's thread) in lock step through their collectives (parallel/communicator.h). Callers see one model: the
// logits, hidden states and ops() are rank 0's, and every rank holds the same logits.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loader/config.h"
#include "model/qwen4_exp/moe.h"
#include "model/qwen4_exp/state.h"
#include "ops/ops.h"

namespace flashnext {

struct ModelWeights;
class Communicator;
class NodeGroup;
class RankThreads;
class TpPlan;

/// Called while Model::load converts the checkpoint: bytes of checkpoint tensors consumed so far and the bytes of
/// all the tensors the model uses (vision and MTP tensors, which the model does not load, left out); the last call
/// has done == total. Called from the loading thread.
using LoadProgress = std::function<void(int64_t done_bytes, int64_t total_bytes)>;

/// Options of Model::load.
struct ModelOptions {
  /// Backend to run on; null: the float32 CPU backend with `threads` threads.
  std::shared_ptr<Ops> ops;
  /// CPU threads when `ops` is null; 0: hardware concurrency.
  int threads = 0;
  /// Load progress (optional). Under tensor parallelism: the ranks' bytes summed, called from the ranks' loading
  /// threads one at a time.
  LoadProgress progress;
  /// Tensor-parallel degree (loader/sharding.h); 1: no tensor parallelism. A degree that the config's heads or
  /// intermediate widths do not allow is an Error naming the field, before anything is loaded.
  int tp = 1;
  /// The backend of rank r (say one CUDA device each); null: the float32 CPU backend with max(1, threads / tp)
  /// threads per rank. With tp > 1 `ops` must be null; with tp 1 `ops` wins over it.
  std::function<std::shared_ptr<Ops>(int rank)> rank_ops;
  /// The group's communicators, one per rank, given the ranks' backends (NCCL for CUDA); null: the CPU
  /// communicator (parallel/communicator.h), which needs CPU backends, or with tp 1 the identity. With tp 1 a factory
  /// makes a group of one (the NCCL code path on one GPU).
  using CommunicatorFactory =
      std::function<std::vector<std::shared_ptr<Communicator>>(const std::vector<std::shared_ptr<Ops>>&)>;
  CommunicatorFactory communicators;
  /// With tp > 1: seconds after which a step that has not finished aborts the group and fails with an Error
  /// (parallel/rank_threads.h; a rank that hangs must not hang the server); 0: never. The CLI reads
  /// FLASHNEXT_TP_TIMEOUT.
  double tp_timeout_s = 600;
  /// Also load the MTP layer (mtp.*, docs MODEL.md "MTP") for Model::mtp_forward, and give every cache pool one more
  /// QSA layer for it. Off: the mtp.* tensors are skipped and cost nothing. Throws Error (before the trunk loads)
  /// when the checkpoint has no mtp.* tensors or the config no MTP layer, and over several nodes (not implemented).
  /// Under tensor parallelism every rank holds its part of the layer (load_mtp_weights with the plan).
  bool load_mtp = false;
  /// Tensor parallelism over several processes (parallel/node_group.h, from rendezvous with world = tp): this process
  /// makes, loads and drives only its node's ranks (nodes->first_rank() onwards; rank_ops and the communicator
  /// factory get those ranks only, rank_ops with their global rank). The leader's model (node 0) sends each of its
  /// calls that touch the ranks to the other nodes before it runs them; the other nodes' models run Model::follow.
  /// Null (or one node): every rank is in this process. Throws Error when the group's world is not tp, and with
  /// load_mtp.
  std::shared_ptr<NodeGroup> nodes;
};

struct RandomWeightsReport;

/// Which logits forward() returns.
enum class LogitsMode {
  All,   ///< one row per input token: [T, vocab]
  Last,  ///< only the last token's row: [1, vocab] (what decoding needs; skips T-1 lm_head rows)
};

/// One sequence's part of a batched step (Model::forward_batch).
struct BatchItem {
  SequenceState* seq = nullptr;        ///< the sequence fed (updated by the step)
  std::span<const int32_t> ids;        ///< the next tokens of the sequence (>= 1)
  LogitsMode mode = LogitsMode::Last;  ///< which of its logits rows the step returns
  /// Optional (a speculative verify): receives the inputs of the item's recurrent state (state.h StateInputs), for
  /// Model::replay_state after a partial acceptance. Ignored (left empty) where the model cannot replay
  /// (Model::replays_state false: over several nodes).
  StateInputs* keep_inputs = nullptr;
};

/// Called during forward with the wide residual stream: index 0 is the embedding repeated into the hc streams
/// [T, S*H], index i (1 <= i < L) the stream after layer i-1, index L the output of the final hyper-connection
/// mixer [T, H] (input of lm_head); the same numbering as the reference's `output_hidden_states`. The tensor is on
/// the backend's device: use Model::download to read it.
using HiddenHook = std::function<void(int index, const Tensor& hidden)>;

class Model {
 public:
  /// Loads config.json and the safetensors weights of the model folder `dir` (qwen4_exp or qwen4_exp_text); with
  /// options.tp > 1 every rank's part of them (read in place from the mapped checkpoint, ranks loading in parallel).
  /// Throws Error naming the file/tensor when the config is invalid or a tensor is missing or mis-shaped, and
  /// naming the config field when options.tp does not fit the model (loader/sharding.h TpPlan::make).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& options = {});
  /// A model of `config`'s geometry with pseudo-random weights made on the backend's device (weights.h
  /// random_weights: how they are scaled, and the FP8 PLE tables in host memory filled by host threads), for
  /// `flashnext bench` without a checkpoint. Deterministic in `seed`. `report` (optional) receives the build times
  /// (under tensor parallelism rank 0's, with every rank's PLE bytes). With options.tp > 1 each rank makes its own
  /// part in parallel (random_weights with the plan: replicated weights equal on every rank, sharded ones random
  /// tensors of the shard's shape, so the model is one for timing, not TP 1's model split). options.load_mtp: with a
  /// random MTP layer too (`bench --speculative mtp:K`). Throws Error when the backend cannot hold the weights and
  /// when options.tp does not fit the config (TpPlan::make).
  static std::unique_ptr<Model> random(const ModelConfig& config, const ModelOptions& options, uint64_t seed,
                                       RandomWeightsReport* report = nullptr);
  ~Model();

  const ModelConfig& config() const { return config_; }
  /// The loaded weights (cost.h counts their bytes); rank 0's part under tensor parallelism.
  const ModelWeights& weights() const;
  /// The backend (rank 0's under tensor parallelism: the one that holds the logits forward returns).
  Ops& ops() const;
  /// Tensor-parallel degree (1: none), the ranks of every node.
  int tp() const { return tp_; }
  /// Whether this process runs the model's calls itself: true unless it is a follower node of a group over several
  /// processes (ModelOptions::nodes), which runs follow() instead.
  bool leads() const;
  /// Whether the ranks are spread over several processes (ModelOptions::nodes with more than one node).
  bool spans_nodes() const { return nodes_ != nullptr; }
  /// A follower node's loop: receives the leader's calls (cache pools made and released, sequences made and copied,
  /// batched steps) and runs them on this node's ranks, in lock step with the other nodes through their collectives,
  /// until the leader's model is destroyed (returns) or the connection to it breaks (throws Error naming it). Throws
  /// Error at once on the leader and without a node group. A call that fails here (a backend error, a collective
  /// that another node ended) throws its Error: the group has failed and every node must be restarted.
  void follow();
  /// Why this model cannot run steps any more (empty: it can): set when a tensor-parallel group over several nodes
  /// failed (a step that failed on any node, a node that is gone), which is final. Thread-safe.
  std::string failure() const;
  /// What the ranks' collectives go through (Communicator::kind: "single", "cpu threads", "nccl", ...).
  std::string communicator_kind() const;
  /// Calls `observer` with every MoE block's router choice of the steps that follow (empty: none); a measurement
  /// hook (model/qwen4_exp/moe.h RouterObserver), not for serving.
  void set_router_observer(RouterObserver observer) { router_observer_ = std::move(observer); }

  /// A fresh, empty sequence with a private cache that grows on demand (position 0, zero states, PLE history =
  /// boundary token).
  SequenceState new_sequence() const;
  /// A cache pool for sequences fed together: `num_blocks` KV blocks of `block_size` positions and `num_slots` state
  /// slots (block and slot ids as the scheduler's MemoryPlanner hands them out). Throws Error for sizes < 1 or when
  /// the backend cannot allocate it.
  std::shared_ptr<CachePool> new_cache(int64_t num_blocks, int64_t block_size, int64_t num_slots) const;
  /// A fresh sequence in slot `slot` of `cache` (the slot's state is zeroed); its block_table starts empty and is
  /// the caller's to fill before each forward. Throws Error for a slot outside the pool.
  SequenceState new_sequence(std::shared_ptr<CachePool> cache, int32_t slot) const;
  /// A deep copy of `seq` with a private cache (prefix reuse, speculative branches).
  SequenceState clone_sequence(const SequenceState& seq) const;
  /// Copies everything `from` remembers into `to`: its KV, indexer-key and pooled-key rows (through both block
  /// tables), its GDN and PLE state slots, PLE history and length. `to` must be fresh (length 0), have a slot other
  /// than from's, and a block table covering from.length positions (n > 1 samples of one prompt, batched decode
  /// from one prefilled prompt in `bench`). Throws Error when the sequences do not fit.
  void copy_sequence(const SequenceState& from, SequenceState& to) const;
  /// Copies the per-sequence state tensors of slot `from` into slot `to` of `cache` on every rank: GDN conv and
  /// recurrent states, PLE conv states (the KV blocks, the PLE n-gram history and the length are not in a slot).
  /// The prefix cache's snapshot save and restore (engine/scheduler.h); a device copy on every backend
  /// (Ops::copy_rows). Throws Error for slots outside the pool or equal slots.
  void copy_state_slot(CachePool& cache, int32_t from, int32_t to) const;

  /// Feeds `ids` (the next tokens of the sequence) through the model, updating `seq`, and returns the next-token
  /// logits as a device tensor F32 [T, vocab] (LogitsMode::All) or [1, vocab] (Last).
  /// Throws Error (leaving `seq` unchanged) for an empty `ids`, a token id outside [0, vocab_size), or when the
  /// sequence would exceed max_position_embeddings.
  Tensor forward_tensor(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode = LogitsMode::All,
                        const HiddenHook& hook = {});
  /// forward_tensor, with the logits copied to the host: row-major [rows * vocab].
  std::vector<float> forward(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode = LogitsMode::All,
                             const HiddenHook& hook = {});

  /// One step over several sequences (distinct, all in the same CachePool, each with a block table covering its new
  /// length; a sequence with a private cache must be alone). Returns the logits of every item, stacked in item
  /// order: T_i rows for LogitsMode::All, 1 for Last; `row_offsets` (if given) receives each item's first row.
  /// Each sequence ends as if it had been fed alone: bit for bit on the CPU backend, up to float rounding on the GPU
  /// (its GEMM algorithms and attention splits depend on the batch size). Throws Error naming the item, leaving
  /// every sequence unchanged, when an item is invalid (see validate()); after a failure while the step runs (a
  /// backend error) the sequences' states are unspecified and must be discarded.
  /// `wide_residual` (optional) receives the trunk's wide residual after the last layer, before the final
  /// hyper_connection_mixer: F32 [T, S*H] on the device, all rows of the step (the MTP layer's input).
  Tensor forward_batch(std::span<const BatchItem> items, std::vector<int64_t>* row_offsets = nullptr,
                       const HiddenHook& hook = {}, Tensor* wide_residual = nullptr);

  /// True when the MTP layer was loaded (ModelOptions::load_mtp).
  bool has_mtp() const;
  /// The MTP layer's output for one sequence (Model::mtp_forward).
  struct MtpOutput {
    Tensor logits;  ///< draft logits F32 [T, vocab] (LogitsMode::All) or [1, vocab] (Last), on the device
    Tensor wide;    ///< the MTP layer's own wide state before mtp.hyper_connection_mixer, F32 [T, S*H], all rows:
                    ///< the `hidden` of the next draft step
  };
  /// The MTP layer (docs MODEL.md "MTP"; ARTIFACTS.md 2.5 wiring of SGLang/vLLM) over T positions of `seq`,
  /// starting at seq.mtp_length: row i pairs `hidden` row i (the trunk's pre-mixer wide residual at position
  /// mtp_length + i, from forward_batch's wide_residual, or the `wide` of the previous draft step) with `next_ids[i]`,
  /// the token at the position after it:
  ///   e = fc_embedding(ZC-RMSNorm(embed_tokens[next])); X_b = fc_hidden(ZC-RMSNorm_{S*H}(hidden))_b + e per stream;
  ///   X = QSA decoder layer (own HC, MoE; its K/V and indexer keys at those positions in the layer after the
  ///   trunk's in the cache pool); logits = lm_head(mtp.hyper_connection_mixer(X)).
  /// Advances seq.mtp_length by T (the caller sets it back to discard draft positions: KV beyond it is overwritten).
  /// Throws Error (leaving `seq` unchanged) when the MTP layer is not loaded, `hidden` is not F32 [T, S*H] with
  /// T = next_ids.size() >= 1, an id is outside the vocabulary, the positions pass max_position_embeddings, or (in a
  /// shared pool) the block table does not cover them. Over several nodes the leader sends the call to the other
  /// nodes first (their ranks add zeros for `hidden`), as forward_batch does.
  MtpOutput mtp_forward(SequenceState& seq, const Tensor& hidden, std::span<const int32_t> next_ids,
                        LogitsMode mode = LogitsMode::All);
  /// One sequence's part of mtp_forward_batch: mtp_forward's arguments.
  struct MtpItem {
    SequenceState* seq = nullptr;
    Tensor hidden;                      ///< F32 [T_i, S*H]
    std::span<const int32_t> next_ids;  ///< T_i >= 1 ids
    LogitsMode mode = LogitsMode::All;
  };
  /// mtp_forward for several sequences in one step of the MTP layer (the batched drafts of a server step): item i's
  /// output equals mtp_forward(*items[i].seq, ...) alone, bit for bit on the CPU backend, up to float rounding on
  /// the GPU. Its logits and wide rows are views of the step's outputs. The sequences must be distinct and share one
  /// cache pool; private caches, and several nodes, run the items one after another. Throws Error naming the item
  /// (mtp_forward's checks) before anything runs.
  std::vector<MtpOutput> mtp_forward_batch(std::span<const MtpItem> items);

  /// A copy of the per-sequence recurrent state of `seq` (GDN conv + recurrent, PLE conv tails and n-gram history,
  /// length and mtp_length) in fresh device memory, for an exact rollback after a speculative verify; KV and indexer
  /// keys are not copied (positions past the restored length are overwritten when fed again). Cost: the state slot
  /// (113 MB of GDN state per sequence at the released size), not the context.
  struct StateSnapshot {
    int64_t length = 0, mtp_length = 0;
    std::vector<std::vector<int64_t>> ple_history;
    std::vector<std::vector<Tensor>> tensors;  ///< per rank of this process: conv, recurrent, ple_conv of every
                                               ///< layer, [1, ...] each
    /// Over several nodes: the id under which the other nodes keep their ranks' part, told to let go of it with
    /// the leader's next call once the last copy of this snapshot is gone.
    std::shared_ptr<const uint64_t> remote;
  };
  /// Over several nodes the leader sends the call first: every node copies its ranks' state.
  StateSnapshot snapshot_state(const SequenceState& seq) const;
  /// Puts `snap` (from snapshot_state of the same sequence) back into `seq`'s state slot (on every node). Throws
  /// Error when it does not belong to a sequence of this model's layout.
  void restore_state(SequenceState& seq, const StateSnapshot& snap) const;

  /// Whether forward_batch keeps BatchItem::keep_inputs and replay_state can use them: every process but one whose
  /// ranks span several nodes (there a rollback feeds the accepted tokens again).
  bool replays_state() const { return !spans_nodes(); }
  /// Advances `seq` over the first `tokens` tokens of a verify item from the state that item started from (the
  /// caller put it back: restore_state, or copy_state_slot from a checkpoint slot, and seq.length == in.start): the
  /// GDN conv and gated delta rule and the PLE conv of every layer over the kept rows, the PLE histories from the
  /// kept ids; seq.length += tokens. The state equals feeding those tokens again (the same ops on the same inputs; on
  /// the GPU up to the rounding of a different batch shape) at the cost of those ops alone. KV and indexer keys of
  /// the positions are the verify's (the causal attention wrote the same values). Throws Error when `in` was not
  /// kept by this model (or a layer with state lacks its rows), seq.length != in.start, its PLE history differs from
  /// the kept one, or tokens is outside 1 .. in.ids.size(); over several nodes (replays_state() false).
  void replay_state(SequenceState& seq, const StateInputs& in, int64_t tokens);

  /// Checks that `ids` can be fed to `seq`: non-empty, every id in [0, vocab_size), the new length within
  /// max_position_embeddings, the state made by this model; in a shared pool also its slot, and a block table that
  /// covers the new length with block ids inside the pool. Throws Error saying what is wrong.
  void validate(const SequenceState& seq, std::span<const int32_t> ids) const;

  /// Copies a float32 device tensor (of rank 0's backend) to a host vector.
  std::vector<float> download(const Tensor& t) const;

  /// What became of the decode steps that could be recorded (one process, one rank, on a backend that records
  /// steps: Ops::captures_steps; docs/ENGINE.md "CUDA graphs"): the first step of a shape runs plainly (its warm-up),
  /// the second is recorded and replayed, the later ones are replayed.
  struct StepGraphStats {
    int64_t plain = 0;     ///< recordable steps run without a graph (warm-ups, and shapes that failed to record)
    int64_t captured = 0;  ///< steps recorded (then replayed)
    int64_t replayed = 0;  ///< steps run by replaying a recorded one (the recorded ones included)
    int64_t failed = 0;    ///< recordings that failed (the step then ran plainly, and so do the later steps of its
                           ///< shape; spdlog warns of the first)
  };
  StepGraphStats step_graph_stats() const { return graph_stats_; }

 private:
  struct Rank;   // one tensor-parallel rank: its geometry, backend, weights and communicator (model.cpp)
  struct Nodes;  // the other processes of a group over several nodes: calls sent or received, pools by id (model.cpp)
  Model();
  /// On the leader of a group over several nodes, when this is the outermost call of the public method being run
  /// (not one it makes itself): sends the call `message` to the other nodes. Elsewhere nothing.
  void send_call(const std::vector<uint8_t>& message) const;
  /// follow()'s loop.
  void follow_calls();
  /// Whether the public method now being run sends its call (leader, outermost call); see CallScope in model.cpp.
  bool sends_calls() const;
  /// Makes the ranks of `plan` (their backends and communicators; weights not yet loaded).
  void make_ranks(const TpPlan& plan, const ModelOptions& options);
  /// A pool of `num_blocks` KV blocks (0 allowed: a private cache before its first forward) and, with_states,
  /// `num_slots` zeroed state slots (without: the caller moves existing state tensors in); every rank's part.
  std::shared_ptr<CachePool> allocate_cache(int64_t num_blocks, int64_t block_size, int64_t num_slots,
                                            bool with_states) const;
  /// Throws Error for a cache pool's sizes that allocate_cache cannot make (naming them).
  void check_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_slots) const;
  /// Grows a private cache so that `seq` has blocks for `length` positions.
  void reserve_private(SequenceState& seq, int64_t length) const;
  /// A validated MTP step (mtp_forward after its checks and the call sent to the other nodes).
  std::vector<MtpOutput> run_mtp(std::span<const MtpItem> items);
  /// mtp_forward's checks of one item; `what` names it in the message.
  void check_mtp_item(const MtpItem& item, const std::string& what) const;
  /// A validated step (forward_batch after its checks and the call sent to the other nodes): the host work, then
  /// every rank of this process.
  Tensor run_step(std::span<const BatchItem> items, std::vector<int64_t>* row_offsets, const HiddenHook& hook,
                  Tensor* wide_residual);
  /// One rank's inputs of a step, made on the host and uploaded in one copy: the StepBatch's host half, and one
  /// byte buffer with the StepBatch's metadata words, the vocabulary rows the rank looks up, every PLE layer's
  /// table rows and the lm_head rows. A recorded step (Ops::begin_step_capture) is replayed with the next step's
  /// buffer, so nothing else of a step may come from the host.
  struct StepInputs {
    StepBatch batch;             ///< host fields (plan_step_batch); the device tensors are bound after the upload
    std::vector<uint8_t> bytes;  ///< the sections below, each 8-byte aligned
    int64_t ids_at = 0;          ///< byte offset of I32 [T]: the rank's vocabulary rows (local_vocab_ids)
    int64_t keep_at = -1;        ///< byte offset of I32 [rows]: the rows lm_head takes; -1: every row
    int64_t keep_rows = 0;
    std::vector<int64_t> ple_at;  ///< per layer: byte offset of I64 [T, heads] (ple_local_rows), -1 without PLE
  };
  /// The StepInputs of rank `rk` (host work only). `context_bucket`: plan_step_batch's.
  StepInputs step_inputs(const Rank& rk, std::span<const StepSequence> parts, std::span<const int32_t> ids,
                         const std::vector<std::vector<int64_t>>& ple_rows, const std::vector<int32_t>& keep,
                         int64_t block_size, int64_t context_bucket) const;
  /// Rank `rank`'s part of a validated step (forward_batch) over `in` (step_inputs of that rank): the layers over
  /// its shards, the collectives with the other ranks; returns the full logits [rows(keep), vocab] on its device.
  /// With `graph`, the step is recorded instead of run (Ops::begin_step_capture): *graph receives the recording, or
  /// null with the reason in *why.
  Tensor forward_rank(int rank, std::span<const BatchItem> items, const StepInputs& in, const HiddenHook& hook,
                      Tensor* wide_residual, std::shared_ptr<StepGraph>* graph = nullptr, std::string* why = nullptr);
  /// The kept state inputs (StateInputs, BatchItem::keep_inputs) of rank `rank`'s layers for the items that keep
  /// them, allocated before the step's StepScope (they outlive the step and must not hold its arena): qkv / a / b
  /// where the rank's cache holds a GDN state, ple where it holds a PLE conv state, each [item tokens, width].
  void allocate_kept_inputs(int rank, std::span<const BatchItem> items) const;
  /// A validated decode step on one rank that the backend can record: replayed when a recording of its shape
  /// exists, else run plainly (the shape's first step) or recorded and replayed (its second); the StepGraphStats.
  Tensor run_recordable_step(std::span<const BatchItem> items, std::span<const StepSequence> parts,
                             std::span<const int32_t> ids, const std::vector<std::vector<int64_t>>& ple_rows,
                             const std::vector<int32_t>& keep);
  /// `ids` as rank `rk` looks them up: under tensor parallelism its vocabulary rows at their local index and the
  /// zero row after them for the other ranks' ids; otherwise the ids.
  std::vector<int32_t> local_vocab_ids(const Rank& rk, std::span<const int32_t> ids) const;
  /// out = embed_tokens[ids] (F32 [T, H] or its S streams [T, S*H]) on rank `rk`, `local_ids` (I32 [T] on its
  /// device) from local_vocab_ids: under tensor parallelism the ranks' lookups summed (a collective).
  void embed(Rank& rk, const Tensor& local_ids, const Tensor& out) const;
  /// embed of host ids (uploaded).
  void embed(Rank& rk, std::span<const int32_t> ids, const Tensor& out) const;
  /// lm_head(h) F32 [rows, vocab] on rank `rk`: under tensor parallelism its vocabulary columns, gathered.
  Tensor lm_head(Rank& rk, const Tensor& h) const;
  /// Layers of a cache pool: the decoder layers, plus one for the MTP layer when it is loaded.
  int64_t cache_layers() const;

  ModelConfig config_;
  int tp_ = 1;
  /// This process's ranks (all of them unless ModelOptions::nodes splits them over processes); ranks_[i] is global
  /// rank ranks_[i]->index, and a cache pool's ranks[i] is ranks_[i]'s part.
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<Nodes> nodes_;
  mutable int call_depth_ = 0;         ///< public calls in progress (CallScope)
  mutable uint64_t next_pool_id_ = 1;  ///< the id of the next cache pool (the same sequence on every node)
  /// Model::failure (a group over several nodes that failed); guarded by failure_mu_.
  mutable std::string failure_;
  mutable std::mutex failure_mu_;
  void set_failure(const std::string& why) const;
  /// A step that ran (or runs) on the other nodes failed here: the group fails for good (set_failure, and every rank's
  /// collectives aborted), so that no collective waits for this node's ranks and no later step meets a stale one
  /// (docs/ENGINE.md "Several processes").
  void fail_group(const std::string& why) const;
  std::unique_ptr<RankThreads> threads_;
  RouterObserver router_observer_;

  /// Recorded decode steps (run_recordable_step) by shape: the cache pool, the tokens, the step's bucketed
  /// max_context (plan_step_batch). At most kMaxStepGraphs shapes are kept, recorded or not (the least recently used
  /// goes first, with its recording and the memory that holds).
  struct StepGraphKey {
    uint64_t pool = 0;
    int64_t tokens = 0, max_context = 0;
    auto operator<=>(const StepGraphKey&) const = default;
  };
  struct StepGraphEntry {
    std::shared_ptr<StepGraph> graph;
    int64_t plain_runs = 0;  ///< steps of this shape run plainly since its last recording
    bool failed = false;     ///< its recording failed: the shape runs plainly
    uint64_t last_use = 0;
  };
  static constexpr size_t kMaxStepGraphs = 8;
  /// Positions per max_context bucket of a recordable step: the recording of a sequence's decode steps is replayed
  /// for this many positions.
  static constexpr int64_t kStepGraphContextBucket = 1024;
  /// Steps of at most this many tokens are recordable (the backend's step arena holds larger ones only partly).
  static constexpr int64_t kStepGraphMaxTokens = 64;
  std::map<StepGraphKey, StepGraphEntry> step_graphs_;
  uint64_t step_graph_clock_ = 0;
  StepGraphStats graph_stats_;
};

}  // namespace flashnext
