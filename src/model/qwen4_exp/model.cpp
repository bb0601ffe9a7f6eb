#include "model/qwen4_exp/model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "loader/manifest.h"
#include "loader/safetensors.h"
#include "model/qwen4_exp/gated_delta_net.h"
#include "model/qwen4_exp/hyper_connection.h"
#include "model/qwen4_exp/moe.h"
#include "model/qwen4_exp/ple.h"
#include "model/qwen4_exp/qsa.h"
#include "model/qwen4_exp/weights.h"
#include "parallel/communicator.h"
#include "parallel/node_group.h"
#include "parallel/rank_threads.h"

namespace flashnext {

struct Model::Rank {
  int index = 0;
  ModelConfig config;  ///< the rank's geometry (TpPlan::rank_config; the model's config without tensor parallelism)
  RankShard shard;     ///< what it holds (loader/sharding.h)
  std::shared_ptr<Ops> ops;
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<ModelWeights> weights;
};

// Several nodes (ModelOptions::nodes): the leader sends each public call that touches the ranks to the other nodes
// before running it; a follower runs the same public method on its ranks (Model::follow). Both make the same cache
// pools in the same order, so pools are named by CachePool::id; a sequence travels as its host fields.
enum class NodeCall : uint8_t {
  NewCache = 1,   // num_blocks, block_size, num_slots
  NewSequence,    // pool id, slot
  NewPrivate,     // (new_sequence())
  CloneSequence,  // sequence
  CopySequence,   // from, to
  CopyStateSlot,  // pool id, from slot, to slot
  ForwardBatch,   // items: sequence, ids, mode
  MtpForward,     // sequence, next ids, mode (the hidden rows are rank 0's: the others add zeros)
  SnapshotState,  // snapshot id, sequence
  RestoreState,   // snapshot id, sequence
  End,            // the leader's model is gone
  Abort,          // ... while an error went up node 0's command (its followers end with an error too)
};

struct Model::Nodes {
  std::shared_ptr<NodeGroup> group;
  /// Leader: ids of the pools it let go of since the last call, told to the others with the next one. Shared with
  /// the pools' deleters, which may run after the model is gone.
  struct Released {
    std::mutex mu;
    std::vector<uint64_t> ids, snapshots;
  };
  std::shared_ptr<Released> released = std::make_shared<Released>();
  /// Leader: the id of the next state snapshot.
  uint64_t next_snapshot = 1;
  /// Follower: the pools and state snapshots the leader still holds, by id.
  std::map<uint64_t, std::shared_ptr<CachePool>> pools;
  std::map<uint64_t, StateSnapshot> snapshots;
};

namespace {
/// Counts the public calls in progress: only the outermost one is sent to the other nodes.
struct CallScope {
  explicit CallScope(int& depth) : depth(depth) { ++depth; }
  ~CallScope() { --depth; }
  int& depth;
};

void put_sequence(WireWriter& w, const SequenceState& s) {
  w.put(s.cache ? s.cache->id : uint64_t(0)).put(s.length).put(s.slot).put(s.block_table);
  w.put(uint8_t(s.private_cache)).put(s.mtp_length).put<uint64_t>(s.ple_history.size());
  for (const auto& h : s.ple_history) w.put(h);
}

/// The pool the leader names next in `r` (a follower holds every pool the leader holds).
const std::shared_ptr<CachePool>& get_pool(WireReader& r, const std::map<uint64_t, std::shared_ptr<CachePool>>& pools) {
  const uint64_t id = r.get<uint64_t>();
  const auto it = pools.find(id);
  FN_CHECK(it != pools.end(), "node call: the leader names cache pool {}, which this node does not hold", id);
  return it->second;
}

SequenceState get_sequence(WireReader& r, const std::map<uint64_t, std::shared_ptr<CachePool>>& pools) {
  SequenceState s;
  s.cache = get_pool(r, pools);
  s.length = r.get<int64_t>();
  s.slot = r.get<int32_t>();
  s.block_table = r.get_vector<int32_t>();
  s.private_cache = r.get<uint8_t>() != 0;
  s.mtp_length = r.get<int64_t>();
  s.ple_history.resize(size_t(r.get<uint64_t>()));
  for (auto& h : s.ple_history) h = r.get_vector<int64_t>();
  return s;
}

/// The per-sequence state tensors of one rank's layer caches that exist (GDN conv and recurrent state, PLE conv
/// tails), layer by layer: what a state slot holds, in the order snapshots keep them.
std::vector<const Tensor*> slot_tensors(const std::vector<LayerCache>& layers) {
  std::vector<const Tensor*> out;
  for (const LayerCache& lc : layers)
    for (const Tensor* t : {&lc.conv, &lc.recurrent, &lc.ple_conv})
      if (t->defined()) out.push_back(t);
  return out;
}

WireWriter call_message(NodeCall call) {
  WireWriter w;
  w.put(uint8_t(call));
  return w;
}
}  // namespace

Model::Model() = default;

Model::~Model() {
  const CallScope scope(call_depth_);
  if (!sends_calls()) return;
  try {
    send_call(call_message(std::uncaught_exceptions() > 0 ? NodeCall::Abort : NodeCall::End).bytes());
  } catch (const Error&) {  // a follower already gone: nothing to end
  }
}

std::string Model::failure() const {
  if (nodes_ && nodes_->group->leader()) {
    // The other nodes never write on their control links: a link with something to read has closed (a node gone).
    for (int n = 1; n < nodes_->group->nnodes(); ++n)
      if (nodes_->group->control(n).wait_readable(0))
        set_failure(fmt::format("tensor parallel: {} of the group is gone (its connection closed); restart every node",
                                nodes_->group->describe(n)));
  }
  std::lock_guard lock(failure_mu_);
  return failure_;
}

void Model::set_failure(const std::string& why) const {
  std::lock_guard lock(failure_mu_);
  if (failure_.empty()) failure_ = why;
}

void Model::fail_group(const std::string& why) const {
  set_failure(why);
  for (auto& rk : ranks_) rk->comm->abort(why);
}

bool Model::leads() const {
  return !nodes_ || nodes_->group->leader();
}

bool Model::sends_calls() const {
  return nodes_ && nodes_->group->leader() && call_depth_ == 1;
}

void Model::send_call(const std::vector<uint8_t>& message) const {
  if (!sends_calls()) return;
  // A follower that failed in an earlier call (one node 0 did not wait on, e.g. a snapshot) closed its link.
  if (const std::string why = failure(); !why.empty()) throw Error(why);
  std::vector<uint64_t> released, snapshots;
  {
    std::lock_guard lock(nodes_->released->mu);
    released.swap(nodes_->released->ids);
    snapshots.swap(nodes_->released->snapshots);
  }
  WireWriter head;
  head.put(released).put(snapshots);
  for (int n = 1; n < nodes_->group->nnodes(); ++n) {
    try {
      Link& link = nodes_->group->control(n);
      link.send(head.bytes());
      link.send(message);
    } catch (const Error& e) {
      const std::string why = fmt::format("tensor parallel: {} of the group is gone ({}); restart every node",
                                          nodes_->group->describe(n), e.what());
      set_failure(why);
      throw Error(why);
    }
  }
}

void Model::follow() {
  FN_CHECK(nodes_ && !nodes_->group->leader(),
           "Model::follow: only a follower node of a group over several processes follows (--node-rank > 0)");
  try {
    follow_calls();
  } catch (const Error& e) {  // a call that failed here (a backend error, a collective that node 0 ended, ...)
    const std::string what = e.what();
    // Fail the group at once: node 0 may be past this call already (a snapshot) and waiting in its next collective.
    fail_group(what);
    if (what.find("restart every node") != std::string::npos) throw;
    fail("node {}: {}; the group has ended: restart every node", nodes_->group->node_rank(), what);
  }
}

void Model::follow_calls() {
  Link& link = nodes_->group->control(0);
  const std::string from = fmt::format("node {}: a call from node 0", nodes_->group->node_rank());
  auto& pools = nodes_->pools;
  auto receive = [&] {
    try {
      return link.recv();
    } catch (const Error& e) {
      fail("node {}: node 0 is gone without ending the group ({}); restart every node", nodes_->group->node_rank(),
           e.what());
    }
  };
  for (;;) {
    const std::vector<uint8_t> head = receive();
    WireReader h(head, from);
    for (uint64_t id : h.get_vector<uint64_t>()) pools.erase(id);
    for (uint64_t id : h.get_vector<uint64_t>()) nodes_->snapshots.erase(id);
    h.finish();
    const std::vector<uint8_t> message = receive();
    WireReader r(message, from);
    switch (NodeCall(r.get<uint8_t>())) {
      case NodeCall::NewCache: {
        const int64_t blocks = r.get<int64_t>(), block_size = r.get<int64_t>(), slots = r.get<int64_t>();
        r.finish();
        new_cache(blocks, block_size, slots);
        break;
      }
      case NodeCall::NewSequence: {
        const std::shared_ptr<CachePool> pool = get_pool(r, pools);
        const int32_t slot = r.get<int32_t>();
        r.finish();
        new_sequence(pool, slot);
        break;
      }
      case NodeCall::NewPrivate:
        r.finish();
        new_sequence();
        break;
      case NodeCall::CloneSequence: {
        const SequenceState seq = get_sequence(r, pools);
        r.finish();
        clone_sequence(seq);
        break;
      }
      case NodeCall::CopySequence: {
        const SequenceState from_seq = get_sequence(r, pools);
        SequenceState to_seq = get_sequence(r, pools);
        r.finish();
        copy_sequence(from_seq, to_seq);
        break;
      }
      case NodeCall::CopyStateSlot: {
        const std::shared_ptr<CachePool> pool = get_pool(r, pools);
        const int32_t a = r.get<int32_t>(), b = r.get<int32_t>();
        r.finish();
        copy_state_slot(*pool, a, b);
        break;
      }
      case NodeCall::ForwardBatch: {
        const uint64_t n = r.get<uint64_t>();
        FN_CHECK(n >= 1 && n <= (uint64_t(1) << 20), "{}: a step of {} items", from, n);
        std::vector<SequenceState> seqs(static_cast<size_t>(n));
        std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n));
        std::vector<BatchItem> items(static_cast<size_t>(n));
        for (size_t i = 0; i < items.size(); ++i) {
          seqs[i] = get_sequence(r, pools);
          ids[i] = r.get_vector<int32_t>();
          items[i] = {&seqs[i], ids[i], LogitsMode(r.get<uint8_t>())};
        }
        r.finish();
        forward_batch(items);
        break;
      }
      case NodeCall::MtpForward: {
        SequenceState seq = get_sequence(r, pools);
        const std::vector<int32_t> next = r.get_vector<int32_t>();
        const LogitsMode mode = LogitsMode(r.get<uint8_t>());
        r.finish();
        FN_CHECK(!next.empty(), "{}: an MTP step without tokens", from);
        // The hidden rows live on rank 0 (node 0); this node's ranks add zeros, so a tensor of the shape will do.
        const Tensor unused = ranks_[0]->ops->empty({int64_t(next.size()), config_.hc_width()});
        mtp_forward(seq, unused, next, mode);
        break;
      }
      case NodeCall::SnapshotState: {
        const uint64_t id = r.get<uint64_t>();
        const SequenceState seq = get_sequence(r, pools);
        r.finish();
        nodes_->snapshots[id] = snapshot_state(seq);
        break;
      }
      case NodeCall::RestoreState: {
        const uint64_t id = r.get<uint64_t>();
        SequenceState seq = get_sequence(r, pools);
        r.finish();
        const auto it = nodes_->snapshots.find(id);
        FN_CHECK(it != nodes_->snapshots.end(), "{}: the leader names state snapshot {}, which this node does not hold",
                 from, id);
        restore_state(seq, it->second);
        break;
      }
      case NodeCall::End:
        r.finish();
        return;
      case NodeCall::Abort:
        fail("node {}: node 0 ended with an error (its output says which); restart every node",
             nodes_->group->node_rank());
      default:
        fail("{}: unknown call (another version of flashnext on node 0?)", from);
    }
  }
}

const ModelWeights& Model::weights() const {
  return *ranks_[0]->weights;
}
Ops& Model::ops() const {
  return *ranks_[0]->ops;
}
std::string Model::communicator_kind() const {
  return ranks_[0]->comm->kind();
}

void Model::make_ranks(const TpPlan& plan, const ModelOptions& options) {
  const int tp = plan.world();
  tp_ = tp;
  std::vector<std::shared_ptr<Ops>> ops;
  std::vector<std::shared_ptr<Communicator>> comms;
  int first = 0, local = tp;  // this process's ranks
  const bool several_nodes = options.nodes && options.nodes->nnodes() > 1;
  const std::string flag =
      several_nodes ? fmt::format("--tp {} --nnodes {}", tp, options.nodes->nnodes()) : fmt::format("--tp {}", tp);
  if (several_nodes) {
    const NodeGroup& g = *options.nodes;
    FN_CHECK(g.world() == tp, "{}: the node group has {} ranks", flag, g.world());
    first = g.first_rank(), local = g.ranks_per_node();
    nodes_ = std::make_unique<Nodes>();
    nodes_->group = options.nodes;
  }
  if (tp == 1) {
    ops.push_back(options.ops ? options.ops : options.rank_ops ? options.rank_ops(0) : make_cpu_ops(options.threads));
    // A group of one through a real communicator when one is given (the NCCL path tested on one GPU).
    comms = options.communicators ? options.communicators(ops)
                                  : std::vector<std::shared_ptr<Communicator>>{make_single_communicator()};
    FN_CHECK(comms.size() == 1, "--tp 1: the communicator factory made {} communicators", comms.size());
  } else {
    FN_CHECK(!options.ops, "{}: ModelOptions::ops is one backend; give one per rank (rank_ops)", flag);
    const int threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    for (int r = first; r < first + local; ++r)
      ops.push_back(options.rank_ops ? options.rank_ops(r) : make_cpu_ops(std::max(1, threads / local)));
    if (options.communicators) {
      comms = options.communicators(ops);
      FN_CHECK(int(comms.size()) == local, "{}: the communicator factory made {} communicators for {} ranks", flag,
               comms.size(), local);
    } else {
      for (const auto& o : ops)
        FN_CHECK(o->device() == Device::CPU,
                 "{}: tensor parallelism over {} needs that backend's communicator (NCCL in a CUDA build)", flag,
                 device_name(o->device()));
      comms = several_nodes ? make_node_communicators(options.nodes) : make_cpu_communicators(tp);
    }
  }
  for (int i = 0; i < local; ++i) {
    auto rank = std::make_unique<Rank>();
    rank->index = first + i;
    rank->config = plan.rank_config(rank->index);
    rank->shard = plan.rank(rank->index);
    rank->ops = ops[size_t(i)];
    rank->comm = comms[size_t(i)];
    ranks_.push_back(std::move(rank));
  }
  threads_ = std::make_unique<RankThreads>(local, comms, options.tp_timeout_s);
}

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = load_config(dir);
  const TpPlan plan = TpPlan::make(m->config_, options.tp);  // a degree that does not fit fails before loading
  m->make_ranks(plan, options);
  auto checkpoint = std::make_shared<const Checkpoint>(dir);
  const WeightManifest manifest = WeightManifest::build(m->config_, *checkpoint);
  if (options.load_mtp) {  // what can be told before the trunk loads
    FN_CHECK(has_mtp_tensors(manifest), "{}: the checkpoint has no mtp.* tensors: no MTP layer to draft with", dir);
    FN_CHECK(m->config_.mtp_num_hidden_layers >= 1,
             "{}: the checkpoint has mtp.* tensors but the config says mtp_num_hidden_layers = {}", m->config_.source,
             m->config_.mtp_num_hidden_layers);
  }
  if (plan.world() == 1) {
    m->ranks_[0]->weights = std::make_unique<ModelWeights>(
        load_weights(m->config_, manifest, checkpoint, *m->ranks_[0]->ops, options.progress));
    if (options.load_mtp) m->ranks_[0]->weights->mtp = load_mtp_weights(m->config_, manifest, *m->ranks_[0]->ops);
    return m;
  }
  // The ranks load their parts in parallel; progress is the sum of theirs, reported once every rank has started.
  std::mutex progress_mu;
  std::vector<int64_t> done(m->ranks_.size(), -1), total(m->ranks_.size(), 0);
  m->threads_->run([&](int r) {
    LoadProgress progress;
    if (options.progress)
      progress = [&, r](int64_t d, int64_t t) {
        std::lock_guard lock(progress_mu);
        done[size_t(r)] = d, total[size_t(r)] = t;
        if (std::find(done.begin(), done.end(), -1) != done.end()) return;
        int64_t sd = 0, st = 0;
        for (size_t i = 0; i < done.size(); ++i) sd += done[i], st += total[i];
        options.progress(sd, st);
      };
    Rank& rk = *m->ranks_[size_t(r)];
    rk.weights = std::make_unique<ModelWeights>(
        load_weights(m->config_, manifest, checkpoint, *rk.ops, progress, &plan, rk.index));
    if (options.load_mtp) rk.weights->mtp = load_mtp_weights(m->config_, manifest, *rk.ops, &plan, rk.index);
  });
  return m;
}

std::unique_ptr<Model> Model::random(const ModelConfig& config, const ModelOptions& options, uint64_t seed,
                                     RandomWeightsReport* report) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  const TpPlan plan = TpPlan::make(config, options.tp);
  m->make_ranks(plan, options);
  if (plan.world() == 1) {
    m->ranks_[0]->weights = std::make_unique<ModelWeights>(
        random_weights(m->config_, *m->ranks_[0]->ops, seed, report, nullptr, 0, options.load_mtp));
    return m;
  }
  // The ranks make their parts in parallel; the report is rank 0's with the PLE bytes of all ranks.
  std::vector<RandomWeightsReport> reports(m->ranks_.size());
  m->threads_->run([&](int r) {
    Rank& rk = *m->ranks_[size_t(r)];
    rk.weights = std::make_unique<ModelWeights>(
        random_weights(m->config_, *rk.ops, seed, &reports[size_t(r)], &plan, rk.index, options.load_mtp));
  });
  if (report) {
    *report = reports[0];
    for (size_t r = 1; r < reports.size(); ++r) report->ple_bytes += reports[r].ple_bytes;
  }
  return m;
}

namespace {
/// Positions per KV block of a private cache (Model::new_sequence()), in indexer blocks; it grows by whole blocks.
constexpr int64_t kPrivateBlockIndexerBlocks = 16;
}  // namespace

void Model::check_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_slots) const {
  FN_CHECK(num_blocks >= 0 && block_size >= 1 && num_slots >= 1 && block_size % config_.indexer_compress_ratio == 0,
           "cache pool: {} blocks of {} positions and {} slots (need slots >= 1 and a block size that is a multiple "
           "of the indexer block, indexer_compress_ratio = {})",
           num_blocks, block_size, num_slots, config_.indexer_compress_ratio);
  FN_CHECK(num_blocks <= std::numeric_limits<int32_t>::max() / block_size,
           "cache pool: {} blocks of {} positions = {} rows, more than the int32 row ids of the kernels allow",
           num_blocks, block_size, num_blocks * block_size);
}

std::shared_ptr<CachePool> Model::allocate_cache(int64_t num_blocks, int64_t block_size, int64_t num_slots,
                                                 bool with_states) const {
  check_cache_shape(num_blocks, block_size, num_slots);
  std::shared_ptr<CachePool> pool;
  if (nodes_ && nodes_->group->leader()) {  // the other nodes hold theirs until the leader lets go of it
    pool = std::shared_ptr<CachePool>(new CachePool, [released = nodes_->released](CachePool* p) {
      {
        std::lock_guard lock(released->mu);
        released->ids.push_back(p->id);
      }
      delete p;
    });
  } else {
    pool = std::make_shared<CachePool>();
  }
  pool->id = next_pool_id_++;
  if (nodes_ && !nodes_->group->leader()) nodes_->pools[pool->id] = pool;
  pool->block_size = block_size;
  pool->num_blocks = num_blocks;
  pool->num_slots = num_slots;
  const int64_t rows = num_blocks * block_size;
  for (const auto& rank : ranks_) {
    const ModelConfig& c = rank->config;  // the rank's heads
    Ops& ops = *rank->ops;
    std::vector<LayerCache>& layers = pool->ranks.emplace_back(size_t(cache_layers()));
    for (int64_t l = 0; l < cache_layers(); ++l) {
      LayerCache& lc = layers[size_t(l)];
      if (l < c.num_hidden_layers && c.layer_types[size_t(l)] == LayerKind::GatedDeltaNet) {
        if (with_states && c.linear_num_value_heads > 0) {
          lc.conv = ops.zeros({num_slots, c.linear_conv_kernel_dim - 1, c.gdn_conv_dim()});
          lc.recurrent =
              ops.zeros({num_slots, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim});
        }
      } else if (c.num_attention_heads > 0) {
        lc.k = ops.empty({rows, c.num_key_value_heads, c.head_dim});
        lc.v = ops.empty({rows, c.num_key_value_heads, c.head_dim});
        lc.index_keys = ops.empty({rows, c.indexer_head_dim});
        lc.pooled_keys = ops.empty({rows / c.indexer_compress_ratio, c.indexer_head_dim});
      }
      if (with_states && l < c.num_hidden_layers && c.ple_index_of_layer(l) >= 0)
        lc.ple_conv = ops.zeros({num_slots, c.ple_conv_state_len(), c.hc_width()});
    }
  }
  return pool;
}

std::shared_ptr<CachePool> Model::new_cache(int64_t num_blocks, int64_t block_size, int64_t num_slots) const {
  const CallScope scope(call_depth_);
  FN_CHECK(num_blocks >= 1, "cache pool: {} KV blocks requested, at least 1 is needed", num_blocks);
  check_cache_shape(num_blocks, block_size, num_slots);  // here, so that a bad size is not sent to the other nodes
  if (sends_calls()) send_call(call_message(NodeCall::NewCache).put(num_blocks).put(block_size).put(num_slots).bytes());
  return allocate_cache(num_blocks, block_size, num_slots, /*with_states=*/true);
}

SequenceState Model::new_sequence(std::shared_ptr<CachePool> cache, int32_t slot) const {
  const CallScope scope(call_depth_);
  FN_CHECK(cache && cache->ranks.size() == ranks_.size() && int64_t(cache->ranks[0].size()) == cache_layers(),
           "new_sequence: the cache pool was not made by this model (Model::new_cache)");
  FN_CHECK(slot >= 0 && slot < cache->num_slots, "new_sequence: slot {} is outside the pool's {} slots", slot,
           cache->num_slots);
  if (sends_calls()) send_call(call_message(NodeCall::NewSequence).put(cache->id).put(slot).bytes());
  SequenceState s;
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (const Tensor* t : slot_tensors(cache->ranks[r])) ranks_[r]->ops->fill_zero(t->rows(slot, slot + 1));
  s.cache = std::move(cache);
  s.slot = slot;
  s.ple_history.resize(size_t(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l)
    if (config_.ple_index_of_layer(l) >= 0)
      s.ple_history[size_t(l)].assign(size_t(config_.ngram_size - 1), config_.ple_boundary_token());
  return s;
}

SequenceState Model::new_sequence() const {
  const CallScope scope(call_depth_);
  if (sends_calls()) send_call(call_message(NodeCall::NewPrivate).bytes());
  SequenceState s =
      new_sequence(allocate_cache(0, kPrivateBlockIndexerBlocks * config_.indexer_compress_ratio, 1, true), 0);
  s.private_cache = true;
  return s;
}

void Model::reserve_private(SequenceState& seq, int64_t length) const {
  CachePool& old = *seq.cache;
  const int64_t need = (length + old.block_size - 1) / old.block_size;
  if (need <= old.num_blocks) return;
  const int64_t max_blocks = (config_.max_position_embeddings + old.block_size - 1) / old.block_size;
  const int64_t blocks = std::min(max_blocks, std::max(need, 2 * old.num_blocks));
  auto grown = allocate_cache(blocks, old.block_size, 1, /*with_states=*/false);  // the states move over
  const int64_t keep = old.num_blocks * old.block_size;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Ops& ops = *ranks_[r]->ops;
    for (size_t l = 0; l < grown->ranks[r].size(); ++l) {
      LayerCache& n = grown->ranks[r][l];
      const LayerCache& o = old.ranks[r][l];
      if (o.k.defined() && keep > 0) {
        ops.copy_rows(o.k, 0, n.k, 0, keep);
        ops.copy_rows(o.v, 0, n.v, 0, keep);
        ops.copy_rows(o.index_keys, 0, n.index_keys, 0, keep);
        ops.copy_rows(o.pooled_keys, 0, n.pooled_keys, 0, keep / config_.indexer_compress_ratio);
      }
      n.conv = o.conv;
      n.recurrent = o.recurrent;
      n.ple_conv = o.ple_conv;
    }
  }
  seq.cache = std::move(grown);
  seq.block_table.resize(size_t(blocks));
  for (int64_t i = 0; i < blocks; ++i) seq.block_table[size_t(i)] = int32_t(i);
}

SequenceState Model::clone_sequence(const SequenceState& seq) const {
  const CallScope scope(call_depth_);
  FN_CHECK(
      seq.cache && seq.cache->ranks.size() == ranks_.size() && int64_t(seq.cache->ranks[0].size()) == cache_layers(),
      "clone_sequence: the sequence was not made by this model");
  if (sends_calls()) {
    WireWriter w = call_message(NodeCall::CloneSequence);
    put_sequence(w, seq);
    send_call(w.bytes());
  }
  SequenceState s = new_sequence();
  reserve_private(s, seq.length);
  copy_sequence(seq, s);
  return s;
}

void Model::copy_sequence(const SequenceState& from, SequenceState& to) const {
  const CallScope scope(call_depth_);
  FN_CHECK(from.cache && to.cache && from.cache->ranks.size() == ranks_.size() &&
               to.cache->ranks.size() == ranks_.size() && int64_t(from.cache->ranks[0].size()) == cache_layers() &&
               int64_t(to.cache->ranks[0].size()) == cache_layers(),
           "copy_sequence: the sequences were not made by this model");
  FN_CHECK(to.length == 0 && &from != &to && (from.cache != to.cache || from.slot != to.slot),
           "copy_sequence: the destination must be a fresh sequence (length 0) with a state slot of its own");
  const CachePool &src = *from.cache, &dst = *to.cache;
  FN_CHECK(int64_t(to.block_table.size()) * dst.block_size >= from.length,
           "copy_sequence: the destination's block table covers {} blocks of {}, the source has {} positions",
           to.block_table.size(), dst.block_size, from.length);
  if (sends_calls()) {
    WireWriter w = call_message(NodeCall::CopySequence);
    put_sequence(w, from);
    put_sequence(w, to);
    send_call(w.bytes());
  }
  const int64_t n = from.length, c = config_.indexer_compress_ratio, nb = n / c;
  auto row = [](const SequenceState& s, int64_t p) {
    const int64_t bs = s.cache->block_size;
    return int32_t(s.block_table[size_t(p / bs)] * bs + p % bs);
  };
  std::vector<int32_t> rows_from(static_cast<size_t>(n)), rows_to(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) rows_from[size_t(p)] = row(from, p), rows_to[size_t(p)] = row(to, p);
  // Pooled key rows of the complete indexer blocks (block_size % c == 0: row / c is the pooled row).
  std::vector<int32_t> pooled_from(static_cast<size_t>(nb)), pooled_to(static_cast<size_t>(nb));
  for (int64_t j = 0; j < nb; ++j)
    pooled_from[size_t(j)] = rows_from[size_t(j * c)] / int32_t(c),
    pooled_to[size_t(j)] = rows_to[size_t(j * c)] / int32_t(c);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Ops& ops = *ranks_[r]->ops;
    const Tensor rf = ops.upload(rows_from.data(), DType::I32, {n}), rt = ops.upload(rows_to.data(), DType::I32, {n});
    const Tensor pf = ops.upload(pooled_from.data(), DType::I32, {nb}),
                 pt = ops.upload(pooled_to.data(), DType::I32, {nb});
    auto move_rows = [&](const Tensor& a, const Tensor& b, const Tensor& ids_a, const Tensor& ids_b, int64_t count) {
      if (count == 0) return;
      Shape shape = a.shape();
      shape[0] = count;
      Tensor tmp = ops.empty(shape, a.dtype());
      ops.gather_rows(a, ids_a, tmp);
      ops.scatter_rows(tmp, ids_b, b);
    };
    for (size_t l = 0; l < src.ranks[r].size(); ++l) {
      const LayerCache& o = src.ranks[r][l];
      const LayerCache& d = dst.ranks[r][l];
      if (o.k.defined()) {
        move_rows(o.k, d.k, rf, rt, n);
        move_rows(o.v, d.v, rf, rt, n);
        move_rows(o.index_keys, d.index_keys, rf, rt, n);
        move_rows(o.pooled_keys, d.pooled_keys, pf, pt, nb);
      }
      for (auto [a, b] : {std::pair{&o.conv, &d.conv}, {&o.recurrent, &d.recurrent}, {&o.ple_conv, &d.ple_conv}})
        if (a->defined()) ops.copy_rows(*a, from.slot, *b, to.slot, 1);
    }
  }
  to.length = n;
  to.mtp_length = std::min(from.mtp_length, n);
  to.ple_history = from.ple_history;
}

void Model::copy_state_slot(CachePool& cache, int32_t from, int32_t to) const {
  const CallScope scope(call_depth_);
  FN_CHECK(cache.ranks.size() == ranks_.size() && int64_t(cache.ranks[0].size()) == cache_layers(),
           "copy_state_slot: the cache pool was not made by this model");
  FN_CHECK(from >= 0 && from < cache.num_slots && to >= 0 && to < cache.num_slots && from != to,
           "copy_state_slot: slots {} -> {} (the pool has {} slots; they must differ)", from, to, cache.num_slots);
  if (sends_calls()) send_call(call_message(NodeCall::CopyStateSlot).put(cache.id).put(from).put(to).bytes());
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (const Tensor* t : slot_tensors(cache.ranks[r])) ranks_[r]->ops->copy_rows(*t, from, *t, to, 1);
}

void Model::validate(const SequenceState& seq, std::span<const int32_t> ids) const {
  if (ids.empty()) fail("forward: empty input: at least one token id is required");
  FN_CHECK(seq.cache && seq.cache->ranks.size() == ranks_.size() &&
               int64_t(seq.cache->ranks[0].size()) == cache_layers() &&
               int64_t(seq.ple_history.size()) == config_.num_hidden_layers,
           "forward: the sequence state was not made by this model: use Model::new_sequence()");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      fail("forward: token id {} at index {} is outside the vocabulary [0, {})", ids[i], i, config_.vocab_size);
    }
  }
  if (seq.length + int64_t(ids.size()) > config_.max_position_embeddings) {
    fail("forward: the sequence would reach {} tokens ({} already + {} new), more than max_position_embeddings = {}",
         seq.length + int64_t(ids.size()), seq.length, ids.size(), config_.max_position_embeddings);
  }
  if (seq.private_cache) return;  // its cache grows on demand
  const CachePool& pool = *seq.cache;
  FN_CHECK(seq.slot >= 0 && seq.slot < pool.num_slots, "forward: state slot {} is outside the pool's {} slots",
           seq.slot, pool.num_slots);
  const int64_t end = seq.length + int64_t(ids.size()), need = (end + pool.block_size - 1) / pool.block_size;
  FN_CHECK(int64_t(seq.block_table.size()) >= need,
           "forward: the sequence reaches position {} but its block table covers {} blocks of {} ({} needed)", end - 1,
           seq.block_table.size(), pool.block_size, need);
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = seq.block_table[size_t(i)];
    FN_CHECK(b >= 0 && b < pool.num_blocks, "forward: block table entry {} is {}, outside the pool's {} blocks", i, b,
             pool.num_blocks);
  }
}

Tensor Model::forward_tensor(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode,
                             const HiddenHook& hook) {
  const BatchItem item{&seq, ids, mode};
  return forward_batch({&item, 1}, nullptr, hook);
}

Tensor Model::forward_batch(std::span<const BatchItem> items, std::vector<int64_t>* row_offsets, const HiddenHook& hook,
                            Tensor* wide_residual) {
  const CallScope scope(call_depth_);
  FN_CHECK(!items.empty(), "forward_batch: no sequences");
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    FN_CHECK(it.seq != nullptr, "forward_batch: item {} has no sequence", i);
    try {
      validate(*it.seq, it.ids);
    } catch (const Error& e) {
      if (items.size() == 1) throw;
      fail("forward_batch: item {}: {}", i, e.what());
    }
    FN_CHECK(it.seq->cache == items[0].seq->cache,
             "forward_batch: item {} lives in another cache pool than item 0 (a batch shares one pool)", i);
    FN_CHECK(!it.seq->private_cache || items.size() == 1,
             "forward_batch: item {} has a private cache (Model::new_sequence()): feed it alone or use new_cache", i);
    for (size_t j = 0; j < i; ++j)
      FN_CHECK(items[j].seq != it.seq, "forward_batch: items {} and {} are the same sequence", j, i);
  }
  if (sends_calls()) {  // the other nodes run the same step (before the private cache grows: they grow theirs)
    WireWriter w = call_message(NodeCall::ForwardBatch);
    w.put<uint64_t>(items.size());
    for (const BatchItem& it : items) {
      put_sequence(w, *it.seq);
      w.put(it.ids).put(uint8_t(it.mode));
    }
    send_call(w.bytes());
  }
  if (!nodes_) return run_step(items, row_offsets, hook, wide_residual);
  try {
    return run_step(items, row_offsets, hook, wide_residual);
  } catch (const std::exception& e) {
    fail_group(e.what());
    throw;
  }
}

Tensor Model::run_step(std::span<const BatchItem> items, std::vector<int64_t>* row_offsets, const HiddenHook& hook,
                       Tensor* wide_residual) {
  if (items[0].seq->private_cache) reserve_private(*items[0].seq, items[0].seq->length + int64_t(items[0].ids.size()));

  // The step's layout (rows, positions, block tables, slots), the same for every rank.
  std::vector<StepSequence> parts;
  std::vector<int32_t> all_ids;
  for (const BatchItem& it : items) {
    parts.push_back({int64_t(it.ids.size()), it.seq->length, it.seq->slot, it.seq->block_table});
    all_ids.insert(all_ids.end(), it.ids.begin(), it.ids.end());
  }
  // The PLE rows of every PLE layer depend only on the token ids: hashed once on the host, gathered by every rank;
  // the histories advance once the step ran.
  const ModelWeights& w0 = *ranks_[0]->weights;
  const int64_t L = config_.num_hidden_layers;
  std::vector<std::vector<int64_t>> ple_rows(static_cast<size_t>(L));
  std::vector<std::vector<std::vector<int64_t>>> ple_next(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l)
    if (w0.layers[size_t(l)].ple)
      ple_rows[size_t(l)] = ple_hash_rows(*w0.layers[size_t(l)].ple, items, l, ple_next[size_t(l)]);
  // lm_head only over the rows asked for.
  std::vector<int32_t> keep;
  if (row_offsets) row_offsets->clear();
  int32_t r0 = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (row_offsets) row_offsets->push_back(int64_t(keep.size()));
    const int32_t r1 = r0 + int32_t(items[i].ids.size());
    for (int32_t r = items[i].mode == LogitsMode::All ? r0 : r1 - 1; r < r1; ++r) keep.push_back(r);
    r0 = r1;
  }

  // Speculative verify items keep their recurrent state's inputs (replay_state), per rank and layer.
  bool keeps = false;
  for (const BatchItem& it : items) {
    if (!it.keep_inputs) continue;
    StateInputs& si = *it.keep_inputs;
    si = StateInputs();
    if (!replays_state()) continue;
    si.start = it.seq->length;
    si.ids.assign(it.ids.begin(), it.ids.end());
    si.ple_history = it.seq->ple_history;
    si.ranks.assign(ranks_.size(), std::vector<StateInputs::Layer>(size_t(L)));
    keeps = true;
  }

  Tensor logits;
  const bool decode = std::all_of(items.begin(), items.end(), [](const BatchItem& it) { return it.ids.size() == 1; });
  if (decode && !keeps && ranks_.size() == 1 && tp() == 1 && !nodes_ && !hook && !wide_residual && !router_observer_ &&
      int64_t(items.size()) <= kStepGraphMaxTokens && ranks_[0]->ops->captures_steps()) {
    logits = run_recordable_step(items, parts, all_ids, ple_rows, keep);
  } else {
    threads_->run([&](int r) {
      const StepInputs in =
          step_inputs(*ranks_[size_t(r)], parts, all_ids, ple_rows, keep, items[0].seq->cache->block_size, 0);
      Tensor t = forward_rank(r, items, in, hook, r == 0 ? wide_residual : nullptr);
      if (r == 0) logits = std::move(t);  // rank 0's on the leader (every rank holds the same logits)
    });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].seq->length += int64_t(items[i].ids.size());
    for (int64_t l = 0; l < L; ++l)
      if (!ple_next[size_t(l)].empty()) items[i].seq->ple_history[size_t(l)] = std::move(ple_next[size_t(l)][i]);
  }
  return logits;
}

Model::StepInputs Model::step_inputs(const Rank& rk, std::span<const StepSequence> parts, std::span<const int32_t> ids,
                                     const std::vector<std::vector<int64_t>>& ple_rows,
                                     const std::vector<int32_t>& keep, int64_t block_size,
                                     int64_t context_bucket) const {
  StepInputs in;
  std::vector<uint8_t>& b = in.bytes;
  auto put = [&b](const void* p, size_t n) {
    const int64_t at = int64_t(b.size());
    b.resize((b.size() + n + 7) / 8 * 8);
    if (n) std::memcpy(b.data() + at, p, n);
    return at;
  };
  const std::vector<int32_t> words = plan_step_batch(in.batch, parts, block_size, context_bucket);
  put(words.data(), words.size() * sizeof(int32_t));
  const std::vector<int32_t> local = local_vocab_ids(rk, ids);
  in.ids_at = put(local.data(), local.size() * sizeof(int32_t));
  in.ple_at.assign(ple_rows.size(), -1);
  for (size_t l = 0; l < ple_rows.size(); ++l) {
    if (!rk.weights->layers[l].ple) continue;
    const std::vector<int64_t> rows = ple_local_rows(*rk.weights->layers[l].ple, ple_rows[l]);
    in.ple_at[l] = put(rows.data(), rows.size() * sizeof(int64_t));
  }
  in.keep_rows = int64_t(keep.size());
  if (in.keep_rows < in.batch.num_tokens) in.keep_at = put(keep.data(), keep.size() * sizeof(int32_t));
  return in;
}

Tensor Model::run_recordable_step(std::span<const BatchItem> items, std::span<const StepSequence> parts,
                                  std::span<const int32_t> ids, const std::vector<std::vector<int64_t>>& ple_rows,
                                  const std::vector<int32_t>& keep) {
  Ops& ops = *ranks_[0]->ops;
  const StepInputs in =
      step_inputs(*ranks_[0], parts, ids, ple_rows, keep, items[0].seq->cache->block_size, kStepGraphContextBucket);
  const StepGraphKey key{items[0].seq->cache->id, in.batch.num_tokens, in.batch.max_context};
  auto plain = [&] {
    ++graph_stats_.plain;
    return forward_rank(0, items, in, {}, nullptr);
  };
  if (!step_graphs_.contains(key) && step_graphs_.size() >= kMaxStepGraphs) {  // the least recently used shape goes
    auto oldest = step_graphs_.begin();
    for (auto it = step_graphs_.begin(); it != step_graphs_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    step_graphs_.erase(oldest);
  }
  StepGraphEntry& e = step_graphs_[key];
  e.last_use = ++step_graph_clock_;
  if (e.graph) {
    switch (ops.replay_step(*e.graph, in.bytes)) {
      case StepReplay::Ran:
        ++graph_stats_.replayed;
        return e.graph->output;
      case StepReplay::Busy:  // the caller still holds the last replay's logits: this step without it
        return plain();
      case StepReplay::Stale:  // memory it used was replaced: warm up and record anew
        e.graph.reset();
        e.plain_runs = 0;
        break;
    }
  }
  if (e.failed || e.plain_runs == 0) {
    ++e.plain_runs;
    return plain();
  }
  // The shape's second step: recorded (nothing runs yet), then replayed with this step's inputs.
  std::shared_ptr<StepGraph> graph;
  std::string why;
  try {
    Tensor out = forward_rank(0, items, in, {}, nullptr, &graph, &why);
    if (graph) {
      graph->output = std::move(out);
      if (ops.replay_step(*graph, in.bytes) == StepReplay::Ran) {
        ++graph_stats_.captured;
        ++graph_stats_.replayed;
        e.graph = graph;
        e.plain_runs = 0;
        return graph->output;
      }
      why = "the backend refused to replay it";
    }
  } catch (const std::exception& ex) {
    why = ex.what();
  }
  e.failed = true;
  ++graph_stats_.failed;
  if (graph_stats_.failed == 1)
    spdlog::warn(
        "a decode step runs without a CUDA graph (and so will every step of its shape: {} tokens, contexts "
        "up to {}): recording it failed: {}",
        key.tokens, key.max_context, why);
  else
    spdlog::debug("decode steps of {} tokens at contexts up to {} are not recorded: {}", key.tokens, key.max_context,
                  why);
  return plain();
}

Tensor Model::forward_rank(int rank, std::span<const BatchItem> items, const StepInputs& in, const HiddenHook& hook,
                           Tensor* wide_residual, std::shared_ptr<StepGraph>* graph, std::string* why) {
  Rank& rk = *ranks_[size_t(rank)];  // `rank` indexes this process's ranks
  Ops& ops = *rk.ops;
  Communicator& comm = *rk.comm;
  allocate_kept_inputs(rank, items);               // before the step: kept rows outlive it and must not hold its arena
  const StepScope step(ops, in.batch.num_tokens);  // activations and op scratch from here on are step memory
  // Recording: the recording ends with the step, also when the step throws (then dropped, the stream usable again).
  struct Recording {
    Ops* ops = nullptr;
    ~Recording() {
      if (ops) (void)ops->end_step_capture(nullptr);
    }
  } recording;
  if (graph) {
    ops.begin_step_capture();
    recording.ops = &ops;
  }
  const ModelConfig& c = rk.config;  // the rank's heads and intermediate widths
  const ModelWeights& w = *rk.weights;
  CachePool& cache = *items[0].seq->cache;
  const int64_t H = c.hidden_size, L = c.num_hidden_layers;
  const double eps = c.rms_norm_eps;
  const bool rank0 = rk.index == 0;
  const HiddenHook no_hook;
  const HiddenHook& on_hidden = rank0 ? hook : no_hook;  // rank 0 reports (every rank holds the same X)

  // The step's one upload: its metadata, ids, PLE rows and lm_head rows (step_inputs).
  const Tensor inputs = ops.upload(in.bytes.data(), DType::U8, {int64_t(in.bytes.size())});
  StepBatch batch = in.batch;
  const int64_t T = batch.num_tokens;
  bind_step_batch(batch, inputs.bytes_as(0, DType::I32, {batch.metadata_words()}));

  // The PLE gathers of every PLE layer start now, before layer 0. If the step fails before a PLE layer consumes its
  // rows, the guard still waits for the gather (the backend then lets go of what it holds for it).
  std::vector<Tensor> ple_rows(static_cast<size_t>(L));
  struct WaitPending {
    Ops& ops;
    std::vector<Tensor>& rows;
    ~WaitPending() {
      for (Tensor& e : rows) {
        if (!e.defined()) continue;
        try {
          ops.ple_gather_wait(e);
        } catch (...) {  // already failing; the first error is the one reported
        }
      }
    }
  } wait_pending{ops, ple_rows};
  ops.profile_phase("ple");
  for (int64_t l = 0; l < L; ++l)
    if (w.layers[size_t(l)].ple) {
      const PleLayerWeights& pw = *w.layers[size_t(l)].ple;
      ple_rows[size_t(l)] = ple_fetch(ops, pw, inputs.bytes_as(in.ple_at[size_t(l)], DType::I64, {T, pw.hash.heads()}));
    }

  // x0 = embed_tokens[ids], replicated into the S hyper-connection streams. Under tensor parallelism a rank looks up
  // the ids of its vocabulary rows and the zero row after them for the others; the sum over ranks is the embedding.
  ops.profile_phase("embedding");
  Tensor X = ops.empty({T, c.hc_width()});
  embed(rk, inputs.bytes_as(in.ids_at, DType::I32, {T}), X);
  if (on_hidden) on_hidden(0, X);

  // Each sublayer's injection X += inj ⊗ out is handed to the next read (one op: Ops::hc_inject_read), and made on
  // its own only where X itself is needed next (the PLE addition, the hidden-state hook).
  PendingInject pending;
  // The rows of layer l that verify items keep (run_step sized their StateInputs).
  auto keep_rows = [&](int64_t l) {
    std::vector<KeepRows> keep;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].keep_inputs && items[i].keep_inputs->kept())
        keep.push_back(
            {batch.cu_seqlens[i], batch.rows_of(int64_t(i)), &items[i].keep_inputs->ranks[size_t(rank)][size_t(l)]});
    return keep;
  };
  // A mixer's output [T, H]: the rank's partial sum (its heads through its columns of out_proj / o_proj), zeros
  // where it sits the mixer out; all-reduced into the full output.
  auto sat_out = [&] {
    Tensor z = ops.empty({T, H});
    ops.fill_zero(z);
    return z;
  };
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    LayerCache& lc = cache.ranks[size_t(rank)][size_t(l)];
    if (lw.ple) {
      ops.profile_phase("hc");
      flush(ops, X, pending);
      ops.profile_phase("ple");
      ple_add(ops, c, *lw.ple, lc, ple_rows[size_t(l)], batch, X, comm, keep_rows(l));
      ple_rows[size_t(l)] = Tensor();  // waited for by ple_add
    }
    ops.profile_phase("hc");
    HcRead r = gated_residual_read(ops, X, pending, lw.attn_hc, H, eps);
    Tensor out;
    if (lw.kind == LayerKind::GatedDeltaNet)
      out = c.linear_num_value_heads > 0 ? gated_delta_net(ops, c, lw.gdn, lc, batch, r.u, keep_rows(l)) : sat_out();
    else
      out = c.num_attention_heads > 0 ? qsa_attention(ops, c, lw.qsa, lc, batch, r.u) : sat_out();
    comm.all_reduce_sum(out);
    ops.profile_phase("hc");
    pending = {out, r.inj};
    r = gated_residual_read(ops, X, pending, lw.mlp_hc, H, eps);
    Tensor moe_out = moe_block(ops, c, lw.moe, r.u, rank0 ? router_observer_ : RouterObserver(), int64_t(l));
    comm.all_reduce_sum(moe_out);  // the ranks' slices of every expert's intermediate
    pending = {moe_out, r.inj};
    if (on_hidden && l + 1 < L) {
      ops.profile_phase("hc");
      flush(ops, X, pending);
      on_hidden(int(l + 1), X);
    }
  }

  ops.profile_phase("hc");
  Tensor h = hyper_connection_mixer(ops, X, pending, w.mixer, H, eps);  // X holds the last injection afterwards
  if (wide_residual) *wide_residual = X;
  if (on_hidden) on_hidden(int(L), h);
  if (in.keep_at >= 0) {
    Tensor picked = ops.empty({in.keep_rows, H});
    ops.gather_rows(h, inputs.bytes_as(in.keep_at, DType::I32, {in.keep_rows}), picked);
    h = picked;
  }
  ops.profile_phase("lm_head");
  Tensor logits = lm_head(rk, h);
  ops.profile_phase(nullptr);
  if (graph) {
    recording.ops = nullptr;
    *graph = ops.end_step_capture(why);
  }
  return logits;
}

void Model::allocate_kept_inputs(int rank, std::span<const BatchItem> items) const {
  const Rank& rk = *ranks_[size_t(rank)];
  const ModelConfig& c = rk.config;
  const GdnDims dims = gdn_dims(c);
  for (const BatchItem& it : items) {
    if (!it.keep_inputs || !it.keep_inputs->kept()) continue;
    const int64_t n = int64_t(it.ids.size());
    std::vector<StateInputs::Layer>& layers = it.keep_inputs->ranks[size_t(rank)];
    const std::vector<LayerCache>& caches = it.seq->cache->ranks[size_t(rank)];
    for (size_t l = 0; l < layers.size(); ++l) {  // where the rank keeps GDN / PLE state
      StateInputs::Layer& k = layers[l];
      if (caches[l].recurrent.defined()) {
        k.qkv = rk.ops->empty({n, dims.conv_dim()});
        k.a = rk.ops->empty({n, dims.num_v_heads});
        k.b = rk.ops->empty({n, dims.num_v_heads});
      }
      if (caches[l].ple_conv.defined()) k.ple = rk.ops->empty({n, c.hc_width()});
    }
  }
}

std::vector<int32_t> Model::local_vocab_ids(const Rank& rk, std::span<const int32_t> ids) const {
  if (tp() == 1) return {ids.begin(), ids.end()};
  // The rank's vocabulary rows, and the zero row after them for the others' ids; the sum over ranks is the lookup.
  const IndexRange v = rk.shard.vocab;
  std::vector<int32_t> local(ids.size());
  for (size_t i = 0; i < local.size(); ++i)
    local[i] = ids[i] >= v.begin && ids[i] < v.end ? int32_t(ids[i] - v.begin) : int32_t(v.size());
  return local;
}

void Model::embed(Rank& rk, const Tensor& local_ids, const Tensor& out) const {
  rk.ops->embedding(rk.weights->embed_tokens, local_ids, out);
  if (tp() > 1) rk.comm->all_reduce_sum(out);
}

void Model::embed(Rank& rk, std::span<const int32_t> ids, const Tensor& out) const {
  const std::vector<int32_t> local = local_vocab_ids(rk, ids);
  embed(rk, rk.ops->upload(local.data(), DType::I32, {int64_t(local.size())}), out);
}

Tensor Model::lm_head(Rank& rk, const Tensor& h) const {
  Ops& ops = *rk.ops;
  Tensor logits = ops.empty({h.dim(0), config_.vocab_size});
  if (tp() == 1) {
    ops.linear(h, rk.weights->lm_head, logits);
  } else {  // the rank's vocabulary columns, gathered side by side in rank order
    Tensor part = ops.empty({h.dim(0), rk.weights->lm_head.dim(0)});
    ops.linear(h, rk.weights->lm_head, part);
    rk.comm->all_gather_columns(part, logits);
  }
  return logits;
}

bool Model::has_mtp() const {
  return ranks_[0]->weights && ranks_[0]->weights->mtp.has_value();
}

int64_t Model::cache_layers() const {
  return config_.num_hidden_layers + (has_mtp() ? 1 : 0);
}

void Model::check_mtp_item(const MtpItem& item, const std::string& what) const {
  FN_CHECK(has_mtp(), "{}: the MTP layer is not loaded (ModelOptions::load_mtp)", what);
  const ModelConfig& c = config_;
  const int64_t T = int64_t(item.next_ids.size()), W = c.hc_width();
  FN_CHECK(T >= 1, "{}: empty input: at least one next token id is required", what);
  const Shape want_hidden{T, W};
  const Tensor& hidden = item.hidden;
  FN_CHECK(hidden.defined() && hidden.dtype() == DType::F32 && hidden.shape() == want_hidden,
           "{}: hidden must be F32 [{}, {}] (one wide residual row per next token), got {}", what, T, W,
           hidden.defined() ? hidden.str() : std::string("an undefined tensor"));
  const SequenceState& seq = *item.seq;
  FN_CHECK(seq.cache && int64_t(seq.cache->ranks[0].size()) == cache_layers(),
           "{}: the sequence state was not made by this model with its MTP layer", what);
  for (int64_t i = 0; i < T; ++i)
    FN_CHECK(item.next_ids[size_t(i)] >= 0 && item.next_ids[size_t(i)] < c.vocab_size,
             "{}: token id {} at index {} is outside the vocabulary [0, {})", what, item.next_ids[size_t(i)], i,
             c.vocab_size);
  const int64_t end = seq.mtp_length + T;
  FN_CHECK(end <= c.max_position_embeddings, "{}: position {} would pass max_position_embeddings = {}", what, end - 1,
           c.max_position_embeddings);
  if (!seq.private_cache) {
    const int64_t bs = seq.cache->block_size, need = (end + bs - 1) / bs;
    FN_CHECK(int64_t(seq.block_table.size()) >= need,
             "{}: the sequence reaches MTP position {} but its block table covers {} blocks of {}", what, end - 1,
             seq.block_table.size(), bs);
  }
}

Model::MtpOutput Model::mtp_forward(SequenceState& seq, const Tensor& hidden, std::span<const int32_t> next_ids,
                                    LogitsMode mode) {
  const CallScope scope(call_depth_);
  const MtpItem item{&seq, hidden, next_ids, mode};
  check_mtp_item(item, "mtp_forward");
  if (sends_calls()) {  // the other nodes run the layer too (before the private cache grows: they grow theirs)
    WireWriter w = call_message(NodeCall::MtpForward);
    put_sequence(w, seq);
    w.put(std::vector<int32_t>(next_ids.begin(), next_ids.end())).put(uint8_t(mode));
    send_call(w.bytes());
  }
  if (!nodes_) return run_mtp({&item, 1})[0];
  try {
    return run_mtp({&item, 1})[0];
  } catch (const std::exception& e) {
    fail_group(e.what());
    throw;
  }
}

std::vector<Model::MtpOutput> Model::mtp_forward_batch(std::span<const MtpItem> items) {
  FN_CHECK(!items.empty(), "mtp_forward_batch: no items");
  bool together = !nodes_;  // over several nodes each item is its own call (NodeCall::MtpForward)
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string what = fmt::format("mtp_forward_batch: item {}", i);
    FN_CHECK(items[i].seq, "{}: no sequence", what);
    check_mtp_item(items[i], what);
    for (size_t j = 0; j < i; ++j) FN_CHECK(items[j].seq != items[i].seq, "{}: the same sequence as item {}", what, j);
    if (items[i].seq->private_cache || items[i].seq->cache != items[0].seq->cache) together = false;
  }
  if (together) {
    const CallScope scope(call_depth_);
    return run_mtp(items);
  }
  std::vector<MtpOutput> out;  // each item its own call (over several nodes, each sent to the other nodes)
  for (const MtpItem& it : items) out.push_back(mtp_forward(*it.seq, it.hidden, it.next_ids, it.mode));
  return out;
}

std::vector<Model::MtpOutput> Model::run_mtp(std::span<const MtpItem> items) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, S = c.hc_count, W = c.hc_width();
  // The step's rows: item i's at [offset[i], offset[i] + T_i); the logits rows its mode keeps.
  std::vector<StepSequence> parts;
  std::vector<int32_t> next_ids, keep;
  std::vector<int64_t> offset;
  int64_t T = 0;
  for (const MtpItem& it : items) {
    const int64_t n = int64_t(it.next_ids.size());
    if (it.seq->private_cache) reserve_private(*it.seq, it.seq->mtp_length + n);
    parts.push_back({n, it.seq->mtp_length, it.seq->slot, it.seq->block_table});
    next_ids.insert(next_ids.end(), it.next_ids.begin(), it.next_ids.end());
    offset.push_back(T);
    for (int64_t r = it.mode == LogitsMode::Last ? n - 1 : 0; r < n; ++r) keep.push_back(int32_t(T + r));
    T += n;
  }
  CachePool& cache = *items[0].seq->cache;
  // Every rank runs the layer over its shards (its query heads, its slice of every expert), in lock step through
  // the collectives, as a trunk layer; callers see rank 0's outputs.
  Tensor logits_all, wide_all;
  threads_->run([&](int r) {
    Rank& rk = *ranks_[size_t(r)];
    Ops& ops = *rk.ops;
    Communicator& comm = *rk.comm;
    const ModelConfig& rc = rk.config;  // the rank's heads and intermediate widths
    const StepScope step(ops, T);
    const MtpWeights& mw = *rk.weights->mtp;
    const double eps = c.rms_norm_eps;
    const StepBatch batch = make_step_batch(ops, parts, cache.block_size);
    LayerCache& lc = cache.ranks[size_t(r)][size_t(c.num_hidden_layers)];

    ops.profile_phase("mtp");
    // `hidden` is rank 0's (the items' rows stacked); the other ranks receive it as the sum of it and their zeros
    // (exact).
    Tensor hid = items[0].hidden;
    if (items.size() > 1 || tp() > 1) {
      hid = ops.empty({T, W});
      if (rk.index == 0) {
        for (size_t i = 0; i < items.size(); ++i)
          ops.copy_rows(items[i].hidden, 0, hid, offset[i], int64_t(items[i].next_ids.size()));
      } else {
        ops.fill_zero(hid);
      }
      if (tp() > 1) comm.all_reduce_sum(hid);
    }
    // e = fc_embedding(ZC-RMSNorm(embed_tokens[next]))  [T, H]
    Tensor e = ops.empty({T, H}), e_fc = ops.empty({T, H});
    embed(rk, next_ids, e);
    ops.zc_rms_norm(e, mw.pre_fc_norm_embedding, H, eps, e);
    ops.linear(e, mw.fc_embedding, e_fc);
    // X_b = fc_hidden(ZC-RMSNorm over the full S*H width of hidden)_b, then + e on every stream (inject weight 1).
    Tensor hn = ops.empty({T, W}), X = ops.empty({T, W});
    ops.zc_rms_norm(hid, mw.pre_fc_norm_hidden, W, eps, hn);
    ops.linear(hn.view({T * S, H}), mw.fc_hidden, X.view({T * S, H}));
    const std::vector<float> ones(size_t(T * S), 1.0f);
    ops.hc_inject(X, e_fc, ops.upload(ones.data(), DType::F32, {T, S}));
    // One QSA decoder layer with its own hyper-connections and MoE; a rank that sits QSA out adds zeros.
    const LayerWeights& lw = mw.layer;
    HcRead rd = gated_residual_read(ops, X, lw.attn_hc, H, eps);
    Tensor out;
    if (rc.num_attention_heads > 0) {
      out = qsa_attention(ops, rc, lw.qsa, lc, batch, rd.u);
    } else {
      out = ops.empty({T, H});
      ops.fill_zero(out);
    }
    comm.all_reduce_sum(out);
    PendingInject pending{out, rd.inj};
    rd = gated_residual_read(ops, X, pending, lw.mlp_hc, H, eps);
    Tensor moe_out = moe_block(ops, rc, lw.moe, rd.u);
    comm.all_reduce_sum(moe_out);
    pending = {moe_out, rd.inj};
    Tensor h = hyper_connection_mixer(ops, X, pending, mw.mixer, H, eps);  // X: the MTP layer's pre-mixer state
    if (int64_t(keep.size()) < T) {
      if (items.size() == 1) {  // one item's last row
        h = h.rows(T - 1, T);
      } else {
        Tensor kept = ops.empty({int64_t(keep.size()), H});
        ops.gather_rows(h, ops.upload(keep.data(), DType::I32, {int64_t(keep.size())}), kept);
        h = kept;
      }
    }
    Tensor logits = lm_head(rk, h);
    ops.profile_phase(nullptr);
    if (r == 0) logits_all = logits, wide_all = X;
  });
  std::vector<MtpOutput> result;
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t n = int64_t(items[i].next_ids.size()), rows = items[i].mode == LogitsMode::Last ? 1 : n;
    result.push_back({logits_all.rows(row, row + rows), wide_all.rows(offset[i], offset[i] + n)});
    row += rows;
    items[i].seq->mtp_length += n;
  }
  return result;
}

Model::StateSnapshot Model::snapshot_state(const SequenceState& seq) const {
  const CallScope scope(call_depth_);
  FN_CHECK(
      seq.cache && seq.cache->ranks.size() == ranks_.size() && int64_t(seq.cache->ranks[0].size()) == cache_layers(),
      "snapshot_state: the sequence state was not made by this model");
  StateSnapshot snap;
  if (sends_calls()) {  // the other nodes copy their ranks' state under this id until the snapshot is gone
    const uint64_t id = nodes_->next_snapshot++;
    WireWriter w = call_message(NodeCall::SnapshotState);
    w.put(id);
    put_sequence(w, seq);
    send_call(w.bytes());
    snap.remote = std::shared_ptr<const uint64_t>(new uint64_t(id), [released = nodes_->released](const uint64_t* p) {
      {
        std::lock_guard lock(released->mu);
        released->snapshots.push_back(*p);
      }
      delete p;
    });
  }
  snap.length = seq.length;
  snap.mtp_length = seq.mtp_length;
  snap.ple_history = seq.ple_history;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Ops& ops = *ranks_[r]->ops;
    std::vector<Tensor>& out = snap.tensors.emplace_back();
    for (const Tensor* t : slot_tensors(seq.cache->ranks[r])) {
      Shape shape = t->shape();
      shape[0] = 1;
      Tensor copy = ops.empty(shape, t->dtype());
      ops.copy_rows(*t, seq.slot, copy, 0, 1);
      out.push_back(std::move(copy));
    }
  }
  return snap;
}

void Model::restore_state(SequenceState& seq, const StateSnapshot& snap) const {
  const CallScope scope(call_depth_);
  FN_CHECK(seq.cache && seq.cache->ranks.size() == ranks_.size() && snap.tensors.size() == ranks_.size() &&
               int64_t(seq.cache->ranks[0].size()) == cache_layers() &&
               snap.ple_history.size() == seq.ple_history.size(),
           "restore_state: the snapshot does not belong to a sequence of this model");
  std::vector<std::vector<const Tensor*>> state(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {  // checked before the other nodes restore theirs
    state[r] = slot_tensors(seq.cache->ranks[r]);
    FN_CHECK(state[r].size() == snap.tensors[r].size(),
             "restore_state: the snapshot holds {} state tensors for rank {}, the sequence {}", snap.tensors[r].size(),
             r, state[r].size());
  }
  if (sends_calls()) {
    FN_CHECK(snap.remote, "restore_state: the snapshot was not made over this model's nodes");
    WireWriter w = call_message(NodeCall::RestoreState);
    w.put(*snap.remote);
    put_sequence(w, seq);
    send_call(w.bytes());
  }
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (size_t i = 0; i < state[r].size(); ++i)
      ranks_[r]->ops->copy_rows(snap.tensors[r][i], 0, *state[r][i], seq.slot, 1);
  seq.length = snap.length;
  seq.mtp_length = snap.mtp_length;
  seq.ple_history = snap.ple_history;
}

void Model::replay_state(SequenceState& seq, const StateInputs& in, int64_t tokens) {
  const CallScope scope(call_depth_);
  const int64_t L = config_.num_hidden_layers;
  FN_CHECK(replays_state(), "replay_state: a model over several nodes feeds accepted tokens again instead");
  FN_CHECK(in.kept() && in.ranks.size() == ranks_.size() &&
               std::all_of(in.ranks.begin(), in.ranks.end(), [&](const auto& r) { return int64_t(r.size()) == L; }),
           "replay_state: the kept inputs were not kept by a step of this model");
  FN_CHECK(tokens >= 1 && tokens <= int64_t(in.ids.size()), "replay_state: {} tokens of a verify item of {}", tokens,
           in.ids.size());
  FN_CHECK(seq.length == in.start,
           "replay_state: the sequence is at position {}, the kept inputs start at {} (put its state back first)",
           seq.length, in.start);
  FN_CHECK(seq.ple_history == in.ple_history,
           "replay_state: the sequence's PLE history is not the one the kept inputs start from (put its state back "
           "first)");
  FN_CHECK(seq.cache && seq.cache->ranks.size() == ranks_.size(),
           "replay_state: the sequence state was not made by this model");
  for (size_t r = 0; r < ranks_.size(); ++r)  // every layer state of the rank has its kept rows
    for (int64_t l = 0; l < L; ++l) {
      const StateInputs::Layer& k = in.ranks[r][size_t(l)];
      const LayerCache& lc = seq.cache->ranks[r][size_t(l)];
      const int64_t n = int64_t(in.ids.size());
      FN_CHECK(k.qkv.defined() == lc.recurrent.defined() && k.ple.defined() == lc.ple_conv.defined() &&
                   (!k.qkv.defined() || k.qkv.dim(0) == n) && (!k.ple.defined() || k.ple.dim(0) == n),
               "replay_state: the kept inputs of layer {} (rank {}) are incomplete", l, r);
    }
  const std::span<const int32_t> ids(in.ids.data(), size_t(tokens));
  validate(seq, ids);
  const std::vector<StepSequence> parts{{tokens, seq.length, seq.slot, seq.block_table}};
  threads_->run([&](int r) {
    Rank& rk = *ranks_[size_t(r)];
    Ops& ops = *rk.ops;
    const StepScope step(ops, tokens);
    const StepBatch batch = make_step_batch(ops, parts, seq.cache->block_size);
    for (int64_t l = 0; l < L; ++l) {
      const StateInputs::Layer& kept = in.ranks[size_t(r)][size_t(l)];
      const LayerWeights& lw = rk.weights->layers[size_t(l)];
      LayerCache& lc = seq.cache->ranks[size_t(r)][size_t(l)];
      if (kept.ple.defined()) ple_replay(ops, rk.config, *lw.ple, lc, batch, kept);
      if (kept.qkv.defined()) gated_delta_net_replay(ops, rk.config, lw.gdn, lc, batch, kept);
    }
    ops.profile_phase(nullptr);
  });
  const ModelWeights& w0 = *ranks_[0]->weights;
  for (int64_t l = 0; l < L; ++l)
    if (w0.layers[size_t(l)].ple)
      seq.ple_history[size_t(l)] = ple_next_history(*w0.layers[size_t(l)].ple, in.ple_history[size_t(l)], ids);
  seq.length += tokens;
}

std::vector<float> Model::forward(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode,
                                  const HiddenHook& hook) {
  return download(forward_tensor(seq, ids, mode, hook));
}

std::vector<float> Model::download(const Tensor& t) const {
  FN_CHECK(t.dtype() == DType::F32, "Model::download: tensor {} is not F32", t.str());
  std::vector<float> out(size_t(t.numel()));
  ranks_[0]->ops->download(t, out.data());
  return out;
}

}  // namespace flashnext
