#include "engine/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <random>

#include "model/qwen4_exp/model.h"

namespace flashnext {

// ---------------------------------------------------------------------------------------------------------------
// MemoryPlanner
// ---------------------------------------------------------------------------------------------------------------

int64_t MemoryPlanner::default_snapshots(const StatePlan& plan, int64_t block_size, int64_t budget_bytes,
                                         int64_t num_slots, int64_t checkpoint_slots, int64_t max_model_len) {
  const int64_t slot = std::max<int64_t>(1, state_slot_bytes(plan));
  const int64_t seq_blocks = (max_model_len + block_size - 1) / std::max<int64_t>(1, block_size);
  const int64_t needed = slot * (num_slots + checkpoint_slots) + kv_block_bytes(plan, block_size) * seq_blocks;
  const int64_t spare = std::min(budget_bytes / 4, budget_bytes - needed);
  return std::min(num_slots, std::max<int64_t>(0, spare) / slot);
}

MemoryPlanner::MemoryPlanner(const StatePlan& plan, int64_t block_size, int64_t budget_bytes, int64_t num_slots,
                             PrefixCacheConfig prefix, int64_t checkpoint_slots)
    : block_size_(block_size), budget_bytes_(budget_bytes), prefix_(prefix) {
  FN_CHECK(checkpoint_slots == 0 || checkpoint_slots == num_slots,
           "memory planner: speculative checkpoint slots must be 0 or one per sequence slot ({}), got {}", num_slots,
           checkpoint_slots);
  checkpoint_slots_ = checkpoint_slots;
  FN_CHECK(block_size >= 1, "memory planner: block size must be >= 1 token, got {}", block_size);
  FN_CHECK(num_slots >= 1, "memory planner: the number of sequence state slots must be >= 1, got {}", num_slots);
  if (!prefix_.enabled) prefix_.num_snapshots = 0;
  if (prefix_.enabled) {
    FN_CHECK(prefix_.snapshot_interval_blocks >= 1,
             "memory planner: --prefix-cache-snapshot-interval must be >= 1 block, got {}",
             prefix_.snapshot_interval_blocks);
    FN_CHECK(prefix_.num_snapshots >= 1, "memory planner: --prefix-cache-snapshots must be >= 1, got {}",
             prefix_.num_snapshots);
  }
  block_bytes_ = kv_block_bytes(plan, block_size);
  slot_bytes_ = state_slot_bytes(plan);
  const int64_t after_slots = budget_bytes - slot_bytes_ * (num_slots + prefix_.num_snapshots + checkpoint_slots);
  // A model without QSA layers has no per-token cache: blocks then only count positions (bounded by the id type).
  const int64_t blocks = block_bytes_ > 0 ? after_slots / block_bytes_ : (after_slots >= 0 ? (int64_t(1) << 30) : 0);
  if (blocks < 1)
    fail(
        "memory planner: a budget of {} bytes cannot hold {} sequence state slots, {} prefix-cache snapshots and {} "
        "speculative checkpoints of {} bytes plus one KV block of {} bytes; raise the KV cache memory or lower "
        "--max-num-seqs (or --prefix-cache-snapshots)",
        budget_bytes, num_slots, prefix_.num_snapshots, checkpoint_slots, slot_bytes_, block_bytes_);
  FN_CHECK(blocks <= INT32_MAX, "memory planner: {} KV blocks exceed the block id range", blocks);
  all_blocks_ = size_t(blocks);
  all_slots_ = size_t(num_slots);
  free_blocks_.resize(all_blocks_);
  for (size_t i = 0; i < all_blocks_; ++i) free_blocks_[i] = int32_t(all_blocks_ - 1 - i);
  free_slots_.resize(all_slots_);
  for (size_t i = 0; i < all_slots_; ++i) free_slots_[i] = int32_t(all_slots_ - 1 - i);
  if (prefix_.enabled) {
    refs_.assign(all_blocks_, 0);
    generation_.assign(all_blocks_, 0);
    cached_.resize(all_blocks_);
    lru_pos_.resize(all_blocks_);
    snapshot_of_.assign(all_blocks_, -1);
    const int64_t n = prefix_.num_snapshots;
    for (int64_t i = 0; i < n; ++i) free_snapshots_.push_back(int32_t(num_slots + n - 1 - i));
    snapshot_pos_.resize(size_t(n));
    snapshot_block_.assign(size_t(n), -1);
  }
}

bool MemoryPlanner::try_grow(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t need = blocks_for(tokens) - int64_t(table.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    int32_t b;
    if (!free_blocks_.empty()) {
      b = free_blocks_.back();
      free_blocks_.pop_back();
    } else {  // evict the least recently released cached block
      b = lru_.front();
      lru_.pop_front();
      uncache(b);
      ++evicted_blocks_;
    }
    if (prefix_.enabled) refs_[size_t(b)] = 1;
    table.push_back(b);
  }
  return true;
}

std::optional<int32_t> MemoryPlanner::acquire_slot() {
  if (free_slots_.empty()) return std::nullopt;
  int32_t s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void MemoryPlanner::release(std::vector<int32_t>& table, int32_t slot) {
  // Returned in reverse: a sequence freed and re-admitted gets the same ids (easier to read in logs), and the tail
  // of a cached chain goes to the LRU list first, so it is evicted before the blocks it follows.
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int32_t b = *it;
    if (prefix_.enabled) {
      FN_CHECK(refs_[size_t(b)] > 0, "memory planner: block {} released more often than taken", b);
      if (--refs_[size_t(b)] > 0) continue;
      if (cached_[size_t(b)]) {
        lru_pos_[size_t(b)] = lru_.insert(lru_.end(), b);
        continue;
      }
    }
    free_blocks_.push_back(b);
  }
  table.clear();
  if (slot >= 0) free_slots_.push_back(slot);
}

uint64_t MemoryPlanner::block_hash(int32_t parent, uint32_t parent_generation, std::span<const int32_t> tokens) const {
  auto mix = [](uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix((uint64_t(uint32_t(parent)) << 32) | parent_generation);
  for (int32_t t : tokens) h = mix(h ^ uint32_t(t));
  return h;
}

int32_t MemoryPlanner::find(int32_t parent, uint32_t parent_generation, std::span<const int32_t> tokens) const {
  const uint64_t h = block_hash(parent, parent_generation, tokens);
  for (auto [it, end] = by_hash_.equal_range(h); it != end; ++it) {
    const CachedBlock& c = *cached_[size_t(it->second)];
    if (c.parent == parent && c.parent_generation == parent_generation &&
        std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin(), tokens.end()))
      return it->second;
  }
  return -1;
}

void MemoryPlanner::uncache(int32_t block) {
  auto& c = cached_[size_t(block)];
  if (!c) return;
  for (auto [it, end] = by_hash_.equal_range(c->hash); it != end; ++it) {
    if (it->second == block) {
      by_hash_.erase(it);
      break;
    }
  }
  c.reset();
  drop_snapshot(block);
  ++generation_[size_t(block)];  // blocks cached under it no longer match anything
}

PrefixMatch MemoryPlanner::match(std::span<const int32_t> tokens) const {
  PrefixMatch m;
  if (!prefix_.enabled || tokens.empty()) return m;
  const int64_t max_blocks = (int64_t(tokens.size()) - 1) / block_size_;  // one token is always fed
  int32_t parent = -1;
  uint32_t parent_generation = 0;
  std::vector<int32_t> chain;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t b = find(parent, parent_generation, tokens.subspan(size_t(i * block_size_), size_t(block_size_)));
    if (b < 0) break;
    chain.push_back(b);
    if ((i + 1) % prefix_.snapshot_interval_blocks == 0 && snapshot_of_[size_t(b)] >= 0) {
      m.blocks = chain;
      m.snapshot = snapshot_of_[size_t(b)];
      m.tokens = (i + 1) * block_size_;
    }
    parent = b;
    parent_generation = generation_[size_t(b)];
  }
  return m;
}

void MemoryPlanner::share_held(std::span<const int32_t> blocks, std::vector<int32_t>& table) {
  FN_CHECK(prefix_.enabled, "memory planner: sharing blocks needs prefix caching");
  for (int32_t b : blocks) {
    FN_CHECK(refs_[size_t(b)] > 0, "memory planner: block {} is shared but nobody holds it", b);
    ++refs_[size_t(b)];
    table.push_back(b);
  }
}

void MemoryPlanner::share(const PrefixMatch& m, std::vector<int32_t>& table, PrefixCursor& cursor) {
  FN_CHECK(prefix_.enabled && table.empty(), "memory planner: share() needs prefix caching and an empty table");
  for (int32_t b : m.blocks) {
    FN_CHECK(cached_[size_t(b)], "memory planner: block {} of a prefix match is no longer cached", b);
    if (refs_[size_t(b)]++ == 0) lru_.erase(lru_pos_[size_t(b)]);
    table.push_back(b);
  }
  if (m.snapshot >= 0) {
    const size_t k = size_t(m.snapshot - int32_t(all_slots_));
    snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, snapshot_pos_[k]);
  }
  cursor = {};
  if (!m.blocks.empty()) {
    cursor.blocks = int64_t(m.blocks.size());
    cursor.parent = m.blocks.back();
    cursor.parent_generation = generation_[size_t(cursor.parent)];
  }
}

int32_t MemoryPlanner::cache_blocks(std::span<const int32_t> tokens, const std::vector<int32_t>& table, int64_t fed,
                                    PrefixCursor& cursor) {
  if (!prefix_.enabled || cursor.broken) return -1;
  const int64_t full = std::min<int64_t>(fed / block_size_, int64_t(table.size()));
  for (int64_t i = cursor.blocks; i < full; ++i) {
    if (cursor.parent >= 0 && generation_[size_t(cursor.parent)] != cursor.parent_generation) {
      cursor.broken = true;  // the block it follows was evicted (possible when this sequence holds a duplicate)
      return -1;
    }
    const auto content = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    int32_t b = find(cursor.parent, cursor.parent_generation, content);
    if (b < 0) {
      b = table[size_t(i)];
      if (cached_[size_t(b)]) {  // a shared block, found by an earlier lookup: its content is this one
        cursor.broken = true;
        return -1;
      }
      CachedBlock c;
      c.hash = block_hash(cursor.parent, cursor.parent_generation, content);
      c.parent = cursor.parent;
      c.parent_generation = cursor.parent_generation;
      c.tokens.assign(content.begin(), content.end());
      by_hash_.emplace(c.hash, b);
      cached_[size_t(b)] = std::move(c);
    }
    cursor.blocks = i + 1;
    cursor.parent = b;
    cursor.parent_generation = generation_[size_t(b)];
  }
  return fed > 0 && fed % block_size_ == 0 && cursor.blocks == fed / block_size_ ? cursor.parent : -1;
}

int32_t MemoryPlanner::attach_snapshot(int32_t block) {
  FN_CHECK(prefix_.enabled && cached_[size_t(block)] && snapshot_of_[size_t(block)] < 0,
           "memory planner: a snapshot for block {}, which is not cached or has one", block);
  int32_t slot;
  if (!free_snapshots_.empty()) {
    slot = free_snapshots_.back();
    free_snapshots_.pop_back();
  } else {
    slot = snapshot_lru_.front();
    drop_snapshot(snapshot_block_[size_t(slot - int32_t(all_slots_))]);
    slot = free_snapshots_.back();
    free_snapshots_.pop_back();
  }
  const size_t k = size_t(slot - int32_t(all_slots_));
  snapshot_pos_[k] = snapshot_lru_.insert(snapshot_lru_.end(), slot);
  snapshot_block_[k] = block;
  snapshot_of_[size_t(block)] = slot;
  return slot;
}

void MemoryPlanner::drop_snapshot(int32_t block) {
  const int32_t slot = snapshot_of_[size_t(block)];
  if (slot < 0) return;
  const size_t k = size_t(slot - int32_t(all_slots_));
  snapshot_lru_.erase(snapshot_pos_[k]);
  snapshot_block_[k] = -1;
  snapshot_of_[size_t(block)] = -1;
  free_snapshots_.push_back(slot);
}

// ---------------------------------------------------------------------------------------------------------------
// ModelRunner
// ---------------------------------------------------------------------------------------------------------------

namespace {
struct ModelSequence : RunnerSequence {
  SequenceState state;
  /// Speculative decoding: the state before the verify in flight (Runner::checkpoint), and the inputs of its state
  /// that the verify keeps (a sequence with a checkpoint keeps them: rollback advances the state over them).
  std::optional<Model::StateSnapshot> checkpoint;
  StateInputs kept;
  /// MTP proposer: trunk pre-mixer rows kept from the items fed (Item::keep_hidden), F32 [n, S*H] each, of
  /// consecutive positions `first` .. first + n - 1, not yet seen by the MTP layer.
  struct Rows {
    Tensor wide;
    int64_t first = 0;
  };
  std::vector<Rows> hidden;
};

}  // namespace

ModelRunner::ModelRunner(Model& model, const MemoryPlanner& planner, bool device_sampling)
    : model_(model),
      cache_(model.new_cache(planner.total_blocks(), planner.block_size(), planner.pool_slots())),
      device_sampling_(device_sampling),
      snapshots_(size_t(planner.pool_slots())) {
  for (int32_t slot = 0; slot < int32_t(planner.total_slots()); ++slot)
    checkpoint_slot_of_.push_back(planner.checkpoint_slot(slot));
  const ModelConfig& c = model.config();
  ple_rows_per_token_ = c.ngram_heads() * int64_t(c.ple_layer_ids.size());
}

int64_t ModelRunner::vocab_size() const {
  return model_.config().vocab_size;
}

std::unique_ptr<RunnerSequence> ModelRunner::new_sequence(int32_t slot) {
  auto s = std::make_unique<ModelSequence>();
  s->state = model_.new_sequence(cache_, slot);
  return s;
}

bool ModelRunner::copy_sequence(const RunnerSequence& from, RunnerSequence& to, std::span<const int32_t> to_blocks) {
  auto& dst = static_cast<ModelSequence&>(to);
  dst.state.block_table.assign(to_blocks.begin(), to_blocks.end());
  model_.copy_sequence(static_cast<const ModelSequence&>(from).state, dst.state);
  return true;
}

bool ModelRunner::save_snapshot(const RunnerSequence& seq, int32_t snapshot) {
  const auto& src = static_cast<const ModelSequence&>(seq).state;
  FN_CHECK(snapshot >= 0 && snapshot < int32_t(snapshots_.size()) && snapshot != src.slot,
           "save_snapshot: slot {} is outside the pool's {} slots or the sequence's own", snapshot, snapshots_.size());
  model_.copy_state_slot(*cache_, src.slot, snapshot);
  snapshots_[size_t(snapshot)] = {src.length, src.ple_history};
  return true;
}

void ModelRunner::restore_snapshot(int32_t snapshot, RunnerSequence& seq, int64_t length) {
  auto& dst = static_cast<ModelSequence&>(seq).state;
  FN_CHECK(snapshot >= 0 && snapshot < int32_t(snapshots_.size()) && snapshots_[size_t(snapshot)].length == length,
           "restore_snapshot: slot {} holds no snapshot of {} positions", snapshot, length);
  FN_CHECK(dst.length == 0, "restore_snapshot: the sequence is not fresh ({} positions fed)", dst.length);
  model_.copy_state_slot(*cache_, snapshot, dst.slot);
  dst.length = length;
  dst.ple_history = snapshots_[size_t(snapshot)].ple_history;
}

bool ModelRunner::samples_on_device() const {
  return device_sampling_ && model_.ops().samples_on_device();
}

bool ModelRunner::checkpoint(RunnerSequence& seq) {
  auto& s = static_cast<ModelSequence&>(seq);
  const SequenceState& st = s.state;
  const int32_t slot =
      st.slot >= 0 && st.slot < int32_t(checkpoint_slot_of_.size()) ? checkpoint_slot_of_[size_t(st.slot)] : -1;
  if (slot < 0) {
    s.checkpoint = model_.snapshot_state(st);
    return true;
  }
  model_.copy_state_slot(*cache_, st.slot, slot);  // the slot's tensors; the rest is host-side
  Model::StateSnapshot meta;
  meta.length = st.length;
  meta.mtp_length = st.mtp_length;
  meta.ple_history = st.ple_history;
  s.checkpoint = std::move(meta);  // no tensors: they are in `slot`
  return true;
}

int64_t ModelRunner::rollback(RunnerSequence& seq, int64_t keep) {
  auto& s = static_cast<ModelSequence&>(seq);
  FN_CHECK(s.checkpoint, "rollback: the sequence has no checkpoint");
  FN_CHECK(keep >= 0 && (!s.kept.kept() || keep <= int64_t(s.kept.ids.size())),
           "rollback: {} tokens kept of a verify of {}", keep, s.kept.ids.size());
  if (s.checkpoint->tensors.empty()) {  // kept in the sequence's checkpoint slot
    model_.copy_state_slot(*cache_, checkpoint_slot_of_[size_t(s.state.slot)], s.state.slot);
    s.state.length = s.checkpoint->length;
    s.state.mtp_length = s.checkpoint->mtp_length;
    s.state.ple_history = s.checkpoint->ple_history;
  } else {
    model_.restore_state(s.state, *s.checkpoint);
  }
  s.checkpoint.reset();
  int64_t advanced = 0;
  if (keep > 0 && s.kept.kept()) {
    model_.replay_state(s.state, s.kept, keep);
    advanced = keep;
  }
  s.kept = StateInputs();
  // Kept rows of positions the rollback took back are gone (a re-feed keeps them again).
  const int64_t length = s.state.length;
  std::erase_if(s.hidden, [&](const ModelSequence::Rows& r) { return r.first >= length; });
  if (!s.hidden.empty()) {
    ModelSequence::Rows& last = s.hidden.back();
    if (last.first + last.wide.dim(0) > length) last.wide = last.wide.rows(0, length - last.first);
  }
  return advanced;
}

void ModelRunner::release_checkpoint(RunnerSequence& seq) {
  auto& s = static_cast<ModelSequence&>(seq);
  s.checkpoint.reset();
  s.kept = StateInputs();
}

bool ModelRunner::has_mtp() const {
  return model_.has_mtp();
}

std::vector<int32_t> ModelRunner::propose_mtp(RunnerSequence& seq, std::span<const int32_t> block_table,
                                              std::span<const int32_t> tokens, int max_drafts) {
  const MtpRequest one{&seq, block_table, tokens, max_drafts};
  return propose_mtp_batch({&one, 1})[0];
}

std::vector<std::vector<int32_t>> ModelRunner::propose_mtp_batch(std::span<const MtpRequest> requests) {
  FN_CHECK(model_.has_mtp(), "propose_mtp: the model was loaded without its MTP layer");
  std::vector<ModelSequence*> live;  // the requests with kept rows, in order
  std::vector<size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    const MtpRequest& r = requests[i];
    auto& s = static_cast<ModelSequence&>(*r.seq);
    SequenceState& st = s.state;
    st.block_table.assign(r.block_table.begin(), r.block_table.end());
    if (s.hidden.empty()) continue;  // nothing fed since it was made (a fork): it decodes one token first
    FN_CHECK(int64_t(r.tokens.size()) > st.length, "propose_mtp: {} tokens given for a sequence of length {}",
             r.tokens.size(), st.length);
    // A sequence resumed from a prefix-cache snapshot has no rows of the cached positions: its MTP layer starts at
    // the first kept row (its K/V of earlier positions are what the shared blocks hold).
    if (s.hidden.front().first > st.mtp_length) st.mtp_length = s.hidden.front().first;
    FN_CHECK(s.hidden.front().first == st.mtp_length, "propose_mtp: kept rows start at {}, the MTP layer at {}",
             s.hidden.front().first, st.mtp_length);
    live.push_back(&s);
    index.push_back(i);
  }
  std::vector<std::vector<int32_t>> drafts(requests.size());
  if (live.empty()) return drafts;
  // On a failure every sequence's MTP layer is put back where it was and its kept rows stay, so that each can draft
  // again alone (the K/V rows written meanwhile are written again).
  std::vector<int64_t> start;
  for (ModelSequence* s : live) start.push_back(s->state.mtp_length);
  try {
    // Catch up: row p pairs with token p + 1; the last output gives the first draft. Round k feeds the k-th kept
    // chunk of every sequence that has one, in batched MTP steps of at most kMtpCatchUpRows rows (a larger chunk
    // alone: the size one sequence's catch-up had).
    std::vector<Model::MtpOutput> last(live.size());
    for (size_t round = 0;; ++round) {
      std::vector<Model::MtpItem> items;
      std::vector<size_t> who;
      int64_t rows = 0;
      auto run = [&] {
        const std::vector<Model::MtpOutput> out = model_.mtp_forward_batch(items);
        for (size_t j = 0; j < who.size(); ++j) last[who[j]] = out[j];
        items.clear();
        who.clear();
        rows = 0;
      };
      bool any = false;
      for (size_t k = 0; k < live.size(); ++k) {
        if (round >= live[k]->hidden.size()) continue;
        any = true;
        const ModelSequence::Rows& r = live[k]->hidden[round];
        const int64_t n = r.wide.dim(0);
        if (!items.empty() && rows + n > kMtpCatchUpRows) run();
        items.push_back({&live[k]->state, r.wide, requests[index[k]].tokens.subspan(size_t(r.first + 1), size_t(n)),
                         LogitsMode::Last});
        who.push_back(k);
        rows += n;
      }
      if (!any) break;
      if (!items.empty()) run();
    }
    std::vector<SequenceState*> seqs;
    std::vector<int> max_drafts;
    for (size_t k = 0; k < live.size(); ++k) {
      seqs.push_back(&live[k]->state);
      max_drafts.push_back(requests[index[k]].max_drafts);
    }
    std::vector<std::vector<int32_t>> chained = chain_mtp_drafts_batch(model_, seqs, last, max_drafts);
    for (size_t k = 0; k < live.size(); ++k) drafts[index[k]] = std::move(chained[k]);
  } catch (...) {
    for (size_t k = 0; k < live.size(); ++k) live[k]->state.mtp_length = start[k];
    throw;
  }
  for (ModelSequence* s : live) s->hidden.clear();
  return drafts;
}

void ModelRunner::forward(std::span<Item> items) {
  std::vector<BatchItem> batch;
  std::vector<Item*> fed;
  for (Item& item : items) {
    try {
      auto& seq = static_cast<ModelSequence&>(*item.seq);
      FN_CHECK(item.slot == seq.state.slot, "the step gives slot {} to a sequence made in slot {}", item.slot,
               seq.state.slot);
      FN_CHECK(!item.sampling || samples_on_device(), "device sampling asked of a backend that samples on the host");
      const int64_t vocab = model_.config().vocab_size;
      FN_CHECK(item.logits.empty() || int64_t(item.logits.size()) == vocab,
               "logits buffer of {} entries, the vocabulary has {}", item.logits.size(), vocab);
      FN_CHECK(item.all_logits.empty() || int64_t(item.all_logits.size()) == int64_t(item.ids.size()) * vocab,
               "all-logits buffer of {} entries for {} tokens of a vocabulary of {}", item.all_logits.size(),
               item.ids.size(), vocab);
      FN_CHECK(item.all_logits.empty() || !item.sampling, "device sampling of an item that wants all its logits");
      FN_CHECK(item.row_tokens.empty() || (item.sampling && item.row_tokens.size() == item.ids.size()),
               "per-row device sampling needs sampling parameters and one token per id ({} for {})",
               item.row_tokens.size(), item.ids.size());
      FN_CHECK(!item.keep_hidden || model_.has_mtp(), "hidden rows kept for the MTP layer of a model without one");
      seq.state.block_table.assign(item.block_table.begin(), item.block_table.end());
      model_.validate(seq.state, item.ids);
      const bool all = !item.all_logits.empty() || !item.row_tokens.empty();
      batch.push_back({&seq.state, item.ids, all ? LogitsMode::All : LogitsMode::Last,
                       seq.checkpoint && item.ids.size() > 1 ? &seq.kept : nullptr});
      fed.push_back(&item);
    } catch (const std::exception& e) {
      item.error = e.what();
    }
  }
  if (batch.empty()) return;
  try {
    std::vector<int64_t> rows;
    const bool keep = std::any_of(fed.begin(), fed.end(), [](const Item* it) { return it->keep_hidden; });
    Tensor wide;
    const Tensor logits = model_.forward_batch(batch, &rows, {}, keep ? &wide : nullptr);
    if (keep) {  // each item's rows of the step's wide residual: its tokens, in batch order
      int64_t first_row = 0;
      for (Item* item : fed) {
        const int64_t n = int64_t(item->ids.size());
        if (item->keep_hidden) {
          auto& seq = static_cast<ModelSequence&>(*item->seq);
          seq.hidden.push_back({wide.rows(first_row, first_row + n), seq.state.length - n});
        }
        first_row += n;
      }
    }
    Ops& ops = model_.ops();
    const int64_t vocab = model_.config().vocab_size;
    // The logits rows `idx` as one tensor (the whole output when that is all of it).
    auto pick = [&](const std::vector<int32_t>& idx) {
      if (int64_t(idx.size()) == logits.dim(0)) return logits;
      Tensor out = ops.empty({int64_t(idx.size()), vocab});
      ops.gather_rows(logits, ops.upload(idx.data(), DType::I32, {int64_t(idx.size())}), out);
      return out;
    };
    std::vector<Item*> on_device, on_host;
    std::vector<int32_t> device_rows, host_rows;
    std::vector<TokenSampling> params;
    for (size_t i = 0; i < fed.size(); ++i) {
      Item* item = fed[i];
      ple_rows_ += ple_rows_per_token_ * int64_t(item->ids.size());
      if (!item->all_logits.empty()) {  // its rows rows[i] .. rows[i] + T - 1
        for (int64_t r = 0; r < int64_t(item->ids.size()); ++r) host_rows.push_back(int32_t(rows[i] + r));
        on_host.push_back(item);
      } else if (item->sampling && !item->row_tokens.empty()) {  // a verify: every row, offsets in order
        for (int64_t r = 0; r < int64_t(item->ids.size()); ++r) {
          on_device.push_back(item);
          device_rows.push_back(int32_t(rows[i] + r));
          params.push_back(*item->sampling);
          params.back().offset += uint64_t(r);
        }
      } else if (item->sampling) {
        on_device.push_back(item);
        device_rows.push_back(int32_t(rows[i]));
        params.push_back(*item->sampling);
      } else if (!item->logits.empty()) {
        on_host.push_back(item);
        host_rows.push_back(int32_t(rows[i]));
      }
    }
    if (!on_device.empty()) {
      const std::vector<int32_t> tokens = ops.sample_tokens(pick(device_rows), params);
      for (size_t i = 0; i < on_device.size(); ++i) {
        Item* item = on_device[i];
        if (!item->row_tokens.empty()) {  // its rows are consecutive entries, the first at i
          std::copy_n(tokens.begin() + int64_t(i), item->row_tokens.size(), item->row_tokens.begin());
          i += item->row_tokens.size() - 1;
        }
        item->token = tokens[i];
      }
    }
    if (!on_host.empty()) {
      const std::vector<float> host = model_.download(pick(host_rows));
      int64_t row = 0;
      for (Item* item : on_host) {
        const int64_t n = item->all_logits.empty() ? 1 : int64_t(item->ids.size());
        const auto first = host.begin() + row * vocab;
        if (!item->all_logits.empty()) std::copy_n(first, n * vocab, item->all_logits.begin());
        if (!item->logits.empty()) std::copy_n(first + (n - 1) * vocab, vocab, item->logits.begin());
        row += n;
      }
    }
  } catch (const std::exception& e) {
    for (Item* item : fed) item->error = e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Scheduler
// ---------------------------------------------------------------------------------------------------------------

struct Scheduler::Seq {
  Request req;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt + output so far
  int64_t num_output = 0;
  int64_t num_computed = 0;  // tokens fed to `state`
  std::unique_ptr<RunnerSequence> state;
  std::vector<int32_t> blocks;
  int32_t slot = -1;
  bool done = false;
  /// Device sampling parameters (offset = tokens generated so far), when the request needs nothing the device
  /// sampler lacks (penalties, logprobs) and the Runner samples on the device.
  std::optional<TokenSampling> device_sampling;
  /// The other samples of this prompt (submit_group), forked from this sequence once its prompt is fed.
  std::vector<std::unique_ptr<Seq>> forks;
  /// Prompt log-probabilities computed so far (prompt tokens 1 .. size()), kept for the forks and for preemption.
  std::vector<TokenLogprobs> prompt_lp;
  int64_t arrival = 0;  // submission order (priority ties)
  /// Prefix cache: positions this admission prefills (tokens.size() when admitted; only those are cached), and
  /// how far its blocks are registered.
  int64_t prefill_end = 0;
  PrefixCursor cursor;
  /// Speculative decoding: drafts per step (0: this sequence does not speculate), and the tokens of the verify in
  /// flight: [last token, drafts...].
  int spec_k = 0;
  std::vector<int32_t> verify;
};

namespace {
/// The device sampling of `r`, or nullopt when it needs the host sampler (penalties, logit bias, min_tokens, a
/// constraint or logprobs). Greedy requests map to temperature 0; an unseeded request gets a random seed here, once.
std::optional<TokenSampling> device_sampling_of(const Request& r) {
  const SamplingParams& p = r.sampling;
  if (r.top_logprobs >= 0 || r.prompt_logprobs >= 0 || p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 ||
      p.frequency_penalty != 0.0 || !p.logit_bias.empty() || p.min_tokens > 0 || p.constraint)
    return std::nullopt;
  TokenSampling t;
  t.temperature = p.greedy() ? 0.f : float(p.temperature);
  t.top_k = p.top_k > 0 ? int32_t(std::min<int64_t>(p.top_k, std::numeric_limits<int32_t>::max())) : 0;
  t.top_p = float(p.top_p);
  t.min_p = float(p.min_p);
  t.seed = p.seed ? *p.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  return t;
}
}  // namespace

Scheduler::Scheduler(Runner& runner, MemoryPlanner planner, SchedulerConfig config)
    : runner_(runner), planner_(std::move(planner)), config_(config) {
  auto& c = config_;
  FN_CHECK(c.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got {}", c.max_num_seqs);
  FN_CHECK(c.max_num_batched_tokens >= c.max_num_seqs,
           "scheduler: max_num_batched_tokens ({}) must be >= max_num_seqs ({})", c.max_num_batched_tokens,
           c.max_num_seqs);
  const int64_t max_chunk = c.max_num_batched_tokens - c.max_num_seqs + 1;
  if (c.prefill_chunk_size == 0) c.prefill_chunk_size = max_chunk;
  FN_CHECK(c.prefill_chunk_size >= 1 && c.prefill_chunk_size <= max_chunk,
           "scheduler: prefill_chunk_size must be in [1, max_num_batched_tokens - max_num_seqs + 1 = {}], got {}",
           max_chunk, c.prefill_chunk_size);
  FN_CHECK(c.max_model_len >= 2, "scheduler: max_model_len must be >= 2, got {}", c.max_model_len);
  FN_CHECK(c.max_waiting >= 0, "scheduler: max_waiting must be >= 0, got {}", c.max_waiting);
  if (c.speculative.enabled()) {
    FN_CHECK(c.speculative.k >= 1 && c.speculative.k <= SpeculativeConfig::kMaxDrafts,
             "--speculative {}: K must be in 1..{}", c.speculative.str(), SpeculativeConfig::kMaxDrafts);
    FN_CHECK(c.speculative.method != SpeculativeConfig::Method::Mtp || runner_.has_mtp(),
             "--speculative {}: the model was loaded without its MTP layer (the checkpoint needs mtp.* tensors)",
             c.speculative.str());
    FN_CHECK(c.speculative.method != SpeculativeConfig::Method::Custom || bool(c.proposer),
             "--speculative {}: no proposer given", c.speculative.str());
  }
  FN_CHECK(planner_.blocks_for(c.max_model_len) <= planner_.total_blocks(),
           "scheduler: one sequence of max_model_len {} tokens needs {} KV blocks but the memory budget holds only "
           "{}; lower --max-model-len or raise the KV cache memory",
           c.max_model_len, planner_.blocks_for(c.max_model_len), planner_.total_blocks());
  counters_.kv_blocks_total = planner_.total_blocks();
  counters_.slots_total = planner_.total_slots();
  stats_ = counters_;
}

Scheduler::~Scheduler() {
  stop();
}

std::unique_ptr<Scheduler::Seq> Scheduler::make_seq(Request r) const {
  const int64_t vocab = runner_.vocab_size();
  FN_CHECK(!r.prompt.empty(), "request {}: the prompt is empty", r.id);
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= vocab)
      fail("request {}: prompt token id {} is outside the vocabulary [0, {})", r.id, id, vocab);
  }
  // Compared without forming prompt + max_tokens, which overflows for a max_tokens near 2^63.
  const int64_t prompt_len = int64_t(r.prompt.size());
  if (r.sampling.max_tokens < 0 || prompt_len > config_.max_model_len ||
      r.sampling.max_tokens > config_.max_model_len - prompt_len)
    fail(
        "request {}: the prompt ({} tokens) plus max_tokens ({}) is {} tokens, more than the maximum model length "
        "{}",
        r.id, prompt_len, r.sampling.max_tokens, fmt::to_string(__int128(prompt_len) + r.sampling.max_tokens),
        config_.max_model_len);
  if (r.top_logprobs < -1 || r.top_logprobs > kMaxTopLogprobs)
    fail("request {}: top_logprobs must be in [0, {}], got {}", r.id, kMaxTopLogprobs, r.top_logprobs);
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxTopLogprobs)
    fail("request {}: prompt_logprobs must be in [0, {}], got {}", r.id, kMaxTopLogprobs, r.prompt_logprobs);
  if (r.priority != 0 && config_.policy != SchedulingPolicy::Priority)
    fail("request {}: priority {} given, but the scheduling policy is FCFS (serve with --scheduling-policy priority)",
         r.id, r.priority);
  const SpeculativeConfig& spec = config_.speculative;
  if (r.speculative_tokens < -1 || r.speculative_tokens > SpeculativeConfig::kMaxDrafts)
    fail("request {}: num_speculative_tokens must be in [0, {}], got {}", r.id, SpeculativeConfig::kMaxDrafts,
         r.speculative_tokens);
  if (r.speculative_tokens > 0 && !spec.enabled())
    fail(
        "request {}: num_speculative_tokens {} asks for speculative decoding, but the server runs without it (serve "
        "with --speculative mtp:K or ngram:K)",
        r.id, r.speculative_tokens);
  if (r.speculative_tokens > spec.k)
    fail("request {}: num_speculative_tokens {} is more than the server drafts (--speculative {})", r.id,
         r.speculative_tokens, spec.str());
  auto seq = std::make_unique<Seq>();
  try {
    seq->sampler = std::make_unique<Sampler>(r.sampling, vocab, r.prompt,
                                             r.sampling.ignore_eos ? std::span<const int64_t>() : r.eos_token_ids);
  } catch (const Error& e) {
    fail("request {}: {}", r.id, e.what());
  }
  if (runner_.samples_on_device()) seq->device_sampling = device_sampling_of(r);
  // A request that only scores its prompt never decodes; the others speculate unless they opted out.
  if (spec.enabled() && r.sampling.max_tokens > 0)
    seq->spec_k = r.speculative_tokens < 0 ? spec.k : r.speculative_tokens;
  seq->tokens = r.prompt;
  seq->req = std::move(r);
  return seq;
}

void Scheduler::submit(Request r) {
  std::vector<Request> one;
  one.push_back(std::move(r));
  submit_group(std::move(one));
}

void Scheduler::submit_group(std::vector<Request> group) {
  FN_CHECK(!group.empty(), "scheduler: submit_group of no request");
  std::vector<std::unique_ptr<Seq>> seqs;
  const std::vector<int32_t> prompt = group.front().prompt;
  for (Request& r : group) {
    if (r.prompt != prompt)
      fail("request {}: the requests of a group must share one prompt", r.id);
    seqs.push_back(make_seq(std::move(r)));
  }
  std::unique_ptr<Seq> parent = std::move(seqs.front());
  for (size_t i = 1; i < seqs.size(); ++i) parent->forks.push_back(std::move(seqs[i]));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) fail("request {}: the server is shutting down", parent->req.id);
    const int64_t n = int64_t(group.size());
    if (inbox_waiting_ + stats_.waiting + n > config_.max_waiting)
      throw QueueFullError(fmt::format("request {}: the waiting queue is full ({} requests); try again later",
                                       parent->req.id, config_.max_waiting));
    parent->arrival = arrivals_++;
    for (auto& f : parent->forks) f->arrival = parent->arrival;
    inbox_.push_back(std::move(parent));
    inbox_waiting_ += n;
  }
  cv_.notify_one();
}

void Scheduler::start() {
  std::lock_guard lock(mutex_);
  FN_CHECK(!thread_.joinable(), "scheduler: already started");
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::unique_ptr<Seq>> inbox;
  {
    std::lock_guard lock(mutex_);
    inbox.swap(inbox_);
  }
  for (auto& s : inbox) finish(*s, EndReason::Abort);
  for (auto& s : waiting_) finish(*s, EndReason::Abort);
  for (auto& s : running_) finish(*s, EndReason::Abort);
  for (auto& s : orphans_) finish(*s, EndReason::Abort);  // the forks of all of the above
  waiting_.clear();
  running_.clear();
  orphans_.clear();
  {
    std::lock_guard lock(mutex_);
    inbox_waiting_ = 0;
  }
  publish_stats();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    bool worked = false;
    try {
      worked = step_impl();
    } catch (const std::exception& e) {
      // step_impl isolates per-request failures; anything reaching here is a bug. Fail the running requests rather
      // than leave their clients waiting forever, and keep serving.
      spdlog::error("scheduler: step failed: {}", e.what());
      for (auto& s : running_) finish(*s, EndReason::Error, {}, std::string("engine step failed: ") + e.what());
      running_.clear();
      publish_stats();
      worked = true;
    }
    if (!worked) {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
    }
  }
}

bool Scheduler::step() {
  FN_CHECK(!thread_.joinable(), "scheduler: step() called while the engine thread runs");
  return step_impl();
}

int64_t Scheduler::next_chunk(const Seq& s) const {
  return chunk_from(s, s.num_computed);
}

int64_t Scheduler::chunk_from(const Seq& s, int64_t from) const {
  const int64_t c = s.req.prompt_logprobs >= 0 ? std::min(config_.prefill_chunk_size, kPromptLogprobsChunk)
                                               : config_.prefill_chunk_size;
  int64_t end = (from / c + 1) * c;  // the next multiple of C (see "Batch invariance")
  if (const int64_t S = planner_.snapshot_interval(); S > 0) end = std::min(end, (from / S + 1) * S);
  return std::min(int64_t(s.tokens.size()), end) - from;
}

void Scheduler::cache_prefix(Seq& s) {
  if (!planner_.prefix_caching() || s.req.prompt_logprobs >= 0 || !s.state) return;
  const int64_t fed = std::min(s.num_computed, s.prefill_end);
  const int32_t block = planner_.cache_blocks(s.tokens, s.blocks, fed, s.cursor);
  if (block < 0 || !snapshots_ok_ || fed != s.num_computed || fed % planner_.snapshot_interval() != 0 ||
      planner_.has_snapshot(block))
    return;
  const int32_t snapshot = planner_.attach_snapshot(block);
  bool saved = false;
  try {
    saved = runner_.save_snapshot(*s.state, snapshot);
    snapshots_ok_ = saved;
  } catch (const std::exception& e) {
    spdlog::warn("scheduler: prefix cache snapshot of request {} at {} tokens failed: {}", s.req.id, fed, e.what());
  }
  if (!saved) planner_.drop_snapshot(block);
}

void Scheduler::finish(Seq& s, EndReason reason, std::optional<int32_t> stop_token, std::string error) {
  planner_.release(s.blocks, s.slot);
  s.slot = -1;
  s.state.reset();
  s.done = true;
  s.req.stream->finish(reason, stop_token, std::move(error));
  // Forks not made yet run on their own (a step cannot enqueue them here: finish may run inside a walk of waiting_).
  for (auto& f : s.forks) orphans_.push_back(std::move(f));
  s.forks.clear();
}

void Scheduler::preempt(Seq& s) {
  planner_.release(s.blocks, s.slot);
  s.slot = -1;
  s.state.reset();
  s.num_computed = 0;
  s.prefill_end = 0;
  s.cursor = {};
  ++counters_.preemptions;
  spdlog::debug("scheduler: preempted request {} ({} tokens to recompute)", s.req.id, s.tokens.size());
}

void Scheduler::publish_stats() {
  int64_t forks = int64_t(orphans_.size());
  for (const auto& s : waiting_) forks += int64_t(s->forks.size());
  for (const auto& s : running_) forks += int64_t(s->forks.size());
  counters_.running = int64_t(running_.size());
  counters_.waiting = int64_t(waiting_.size()) + forks;
  counters_.kv_blocks_used = planner_.total_blocks() - planner_.free_blocks();
  counters_.slots_used = planner_.total_slots() - planner_.free_slots();
  counters_.kv_usage = planner_.usage();
  counters_.ple_rows_fetched = runner_.ple_rows_fetched();
  counters_.prefix_cache_blocks = planner_.cached_blocks();
  counters_.prefix_cache_snapshots = planner_.cached_snapshots();
  counters_.prefix_cache_evictions = planner_.evicted_blocks();
  std::lock_guard lock(mutex_);
  stats_ = counters_;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  SchedulerStats s = stats_;
  s.waiting += inbox_waiting_;
  return s;
}

bool Scheduler::step_impl() {
  {
    std::lock_guard lock(mutex_);
    for (auto& s : inbox_) waiting_.push_back(std::move(s));
    inbox_.clear();
    inbox_waiting_ = 0;
  }
  // Forks whose parent ended before their prompt was fed: they go first (they arrived with it).
  for (auto it = orphans_.rbegin(); it != orphans_.rend(); ++it) waiting_.push_front(std::move(*it));
  orphans_.clear();
  // Drop cancelled requests, wherever they are.
  auto drop_cancelled_forks = [&](Seq& s) {
    for (auto& f : s.forks) {
      if (f->req.stream->cancelled()) finish(*f, EndReason::Abort);
    }
    std::erase_if(s.forks, [](const auto& f) { return f->done; });
  };
  for (auto& s : running_) {
    drop_cancelled_forks(*s);
    if (s->req.stream->cancelled()) finish(*s, EndReason::Abort);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  for (auto& s : waiting_) {
    drop_cancelled_forks(*s);
    if (s->req.stream->cancelled()) finish(*s, EndReason::Abort);
  }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  // The forks of a cancelled parent: queued behind the requests already waiting (one more step; they are new).
  for (auto& f : orphans_) waiting_.push_back(std::move(f));
  orphans_.clear();
  if (config_.policy == SchedulingPolicy::Priority) order_by_priority();
  {
    std::lock_guard lock(mutex_);
    stats_.waiting = int64_t(waiting_.size());
  }
  if (running_.empty() && waiting_.empty()) {
    publish_stats();
    return false;
  }

  // ---- schedule ----
  struct Scheduled {
    Seq* seq;
    int64_t n;
    int64_t drafts = 0;  // a verify: n = 1 + drafts tokens, s.verify
  };
  std::vector<Scheduled> batch;
  int64_t budget = config_.max_num_batched_tokens;
  bool preempted = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    Seq& s = *running_[i];
    const int64_t n = next_chunk(s);
    if (n > budget) continue;  // a whole chunk or nothing (batch invariance); it gets the next step
    bool self_preempted = false;
    while (!planner_.try_grow(s.blocks, s.num_computed + n)) {
      // Free memory by preempting the most recently admitted sequence (never one scheduled already: those come
      // before index i).
      std::unique_ptr<Seq> victim = std::move(running_.back());
      running_.pop_back();
      preempt(*victim);
      preempted = true;
      self_preempted = victim.get() == &s;
      waiting_.push_front(std::move(victim));
      if (self_preempted) break;
    }
    if (self_preempted) break;
    batch.push_back({&s, n});
    budget -= n;
  }
  // Admit waiting requests in arrival order (none after a preemption: memory is short).
  while (!preempted && !waiting_.empty() && int64_t(running_.size()) < config_.max_num_seqs && budget > 0) {
    Seq& s = *waiting_.front();
    if (planner_.free_slots() == 0) break;
    // Prefix cache: the deepest snapshot of a cached prefix of its tokens (none for prompt log-probabilities, whose
    // rows must all be computed).
    const bool lookup = planner_.prefix_caching() && snapshots_ok_ && s.req.prompt_logprobs < 0;
    PrefixMatch hit;
    if (lookup) hit = planner_.match(s.tokens);
    const int64_t n = chunk_from(s, hit.tokens);
    if (n > budget) break;
    if (hit.tokens > 0) planner_.share(hit, s.blocks, s.cursor);
    if (!planner_.try_grow(s.blocks, hit.tokens + n)) {
      planner_.release(s.blocks, -1);
      s.cursor = {};
      break;
    }
    s.slot = *planner_.acquire_slot();
    // The first admission only ends the queue time; the forks of an n > 1 request ride on this prefill.
    const Clock::time_point admitted = Clock::now();
    s.req.stream->mark_scheduled(admitted, hit.tokens);
    for (auto& f : s.forks) f->req.stream->mark_scheduled(admitted, hit.tokens);
    if (lookup) {
      counters_.prefix_cache_queries += int64_t(s.tokens.size());
      counters_.prefix_cache_hits += hit.tokens;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    try {
      s.state = runner_.new_sequence(s.slot);
      if (hit.tokens > 0) runner_.restore_snapshot(hit.snapshot, *s.state, hit.tokens);
    } catch (const std::exception& e) {
      finish(s, EndReason::Error, {}, fmt::format("could not create the sequence state: {}", e.what()));
      continue;
    }
    s.num_computed = hit.tokens;
    s.prefill_end = int64_t(s.tokens.size());
    batch.push_back({&s, n});
    budget -= n;
  }
  // Speculative decoding: the decodes of speculating sequences become verify items of 1 + drafts tokens, from the
  // budget and the free blocks left once everything else is scheduled (drafts never preempt nor delay a prefill).
  if (config_.speculative.enabled()) {
    // A sequence's drafts become its verify (after a checkpoint of its state); none, or no checkpoint: it decodes.
    auto take = [&](Scheduled& b, const std::vector<int32_t>& drafts) {
      Seq& s = *b.seq;
      if (drafts.empty()) return;
      if (!runner_.checkpoint(*s.state)) {
        spdlog::warn("scheduler: the runner takes no checkpoints; request {} decodes without drafts", s.req.id);
        s.spec_k = 0;
        return;
      }
      s.verify.assign(1, s.tokens.back());
      s.verify.insert(s.verify.end(), drafts.begin(), drafts.end());
      b.drafts = int64_t(drafts.size());
      b.n = 1 + b.drafts;
    };
    auto propose_one = [&](Scheduled& b, int64_t k) -> std::vector<int32_t> {
      try {
        return propose(*b.seq, int(k));
      } catch (const std::exception& e) {
        spdlog::warn("scheduler: drafting for request {} failed ({}); it decodes without drafts", b.seq->req.id,
                     e.what());
        b.seq->spec_k = 0;
        return {};
      }
    };
    // MTP drafts of every speculating sequence are proposed together (Runner::propose_mtp_batch: one MTP step per
    // draft position for all of them); the other proposers one sequence at a time.
    const bool mtp = config_.speculative.method == SpeculativeConfig::Method::Mtp;
    std::vector<std::pair<Scheduled*, int64_t>> wants;
    for (Scheduled& b : batch) {
      Seq& s = *b.seq;
      if (budget <= 0) break;
      if (s.spec_k <= 0 || s.done || !s.state || b.n != 1 || s.num_output == 0 || !s.forks.empty() ||
          s.num_computed + 1 != int64_t(s.tokens.size()))
        continue;
      // Tokens the request may still emit: a verify emits at most 1 + drafts.
      const SamplingParams& p = s.sampler->params();
      const int64_t remaining = std::min(p.max_tokens - s.num_output, config_.max_model_len - int64_t(s.tokens.size()));
      int64_t k = std::min<int64_t>({int64_t(s.spec_k), remaining - 1, budget});
      while (k > 0 && !planner_.try_grow(s.blocks, s.num_computed + 1 + k)) --k;  // blocks for 1 + k positions
      if (k <= 0) continue;
      if (mtp) {  // k drafts (fewer only at max_position_embeddings, none for a fork not yet fed: budget left unused)
        wants.emplace_back(&b, k);
        budget -= k;
        continue;
      }
      take(b, propose_one(b, k));
      budget -= b.drafts;
    }
    if (!wants.empty()) {
      std::vector<Runner::MtpRequest> requests;
      for (const auto& [b, k] : wants)
        requests.push_back({b->seq->state.get(), b->seq->blocks, b->seq->tokens, int(k)});
      std::vector<std::vector<int32_t>> drafts;
      try {
        drafts = runner_.propose_mtp_batch(requests);
        FN_CHECK(drafts.size() == wants.size(), "propose_mtp_batch gave {} draft lists for {} sequences", drafts.size(),
                 wants.size());
      } catch (const std::exception& e) {  // one at a time, so that only the failing sequences go without drafts
        spdlog::warn("scheduler: batched MTP drafting failed ({}); drafting one sequence at a time", e.what());
        drafts.clear();
        for (const auto& [b, k] : wants) drafts.push_back(propose_one(*b, k));
      }
      for (size_t i = 0; i < wants.size(); ++i) {
        try {
          take(*wants[i].first, checked_drafts(std::move(drafts[i]), int(wants[i].second)));
        } catch (const std::exception& e) {
          spdlog::warn("scheduler: drafting for request {} failed ({}); it decodes without drafts",
                       wants[i].first->seq->req.id, e.what());
          wants[i].first->seq->spec_k = 0;
        }
      }
    }
  }
  if (batch.empty()) {
    std::erase_if(running_, [](const auto& s) { return s->done; });
    // Cannot happen with a valid config (the first running sequence, or the first waiting one when none runs,
    // always fits); guard against spinning anyway.
    if (running_.empty() && !waiting_.empty()) {
      finish(*waiting_.front(), EndReason::Error, {}, "the scheduler could not place the request");
      waiting_.pop_front();
    }
    publish_stats();
    return true;
  }

  // ---- run ----
  const int64_t vocab = runner_.vocab_size();
  if (logits_buf_.size() < batch.size()) logits_buf_.resize(batch.size());
  std::vector<Runner::Item> items(batch.size());
  std::vector<TokenSampling> sampling(batch.size());
  std::vector<std::vector<float>> all_logits(batch.size());
  std::vector<std::vector<int32_t>> row_tokens(batch.size());
  const bool mtp = config_.speculative.method == SpeculativeConfig::Method::Mtp;
  for (size_t k = 0; k < batch.size(); ++k) {
    Seq& s = *batch[k].seq;
    Runner::Item& it = items[k];
    it.seq = s.state.get();
    it.block_table = s.blocks;
    it.slot = s.slot;
    it.keep_hidden = mtp && s.spec_k > 0;
    if (batch[k].drafts > 0) {  // a verify: every row's token is chosen in order (see the sample phase)
      it.ids = s.verify;
      if (s.device_sampling) {
        sampling[k] = *s.device_sampling;
        sampling[k].offset = uint64_t(s.num_output);
        it.sampling = &sampling[k];
        row_tokens[k].resize(size_t(batch[k].n));
        it.row_tokens = row_tokens[k];
      } else {
        all_logits[k].resize(size_t(batch[k].n * vocab));
        it.all_logits = all_logits[k];
      }
      continue;
    }
    it.ids = std::span<const int32_t>(s.tokens).subspan(size_t(s.num_computed), size_t(batch[k].n));
    // Prompt log-probabilities still to compute: the rows of this chunk that predict prompt tokens not yet scored
    // (row j predicts token num_computed + j + 1; the next one to score is token prompt_lp.size() + 1).
    const int64_t prompt_len = int64_t(s.req.prompt.size());
    if (s.req.prompt_logprobs >= 0 && int64_t(s.prompt_lp.size()) < prompt_len - 1 &&
        s.num_computed + batch[k].n > int64_t(s.prompt_lp.size())) {
      all_logits[k].resize(size_t(batch[k].n * vocab));
      it.all_logits = all_logits[k];
    }
    if (s.num_computed + batch[k].n == int64_t(s.tokens.size())) {
      if (s.device_sampling && s.forks.empty()) {
        sampling[k] = *s.device_sampling;
        sampling[k].offset = uint64_t(s.num_output);
        it.sampling = &sampling[k];
      } else {
        logits_buf_[k].resize(size_t(vocab));
        it.logits = logits_buf_[k];
      }
    }
  }
  runner_.forward(items);

  // ---- sample ----
  const Clock::time_point now = Clock::now();
  for (size_t k = 0; k < batch.size(); ++k) {
    Seq& s = *batch[k].seq;
    Runner::Item& it = items[k];
    if (!it.error.empty()) {
      finish(s, EndReason::Error, {}, it.error);
      continue;
    }
    if (batch[k].drafts > 0) {
      verify(s, batch[k].drafts, it, now);
      continue;
    }
    const bool wants_token = !it.logits.empty() || it.sampling;
    // A speculating sequence's re-feed after a rollback (accepted tokens + the correction) counts as decode too.
    const bool decode =
        wants_token && s.num_output > 0 && (batch[k].n == 1 || (s.spec_k > 0 && s.num_computed >= s.prefill_end));
    (decode ? counters_.decode_tokens : counters_.prefill_tokens) += batch[k].n;
    if (!it.all_logits.empty()) {
      // Row j follows token num_computed + j and predicts token num_computed + j + 1.
      try {
        std::vector<TokenLogprobs> lps;
        const int64_t prompt_len = int64_t(s.req.prompt.size());
        for (int64_t j = 0; j < batch[k].n; ++j) {
          const int64_t next = s.num_computed + j + 1;
          if (next < prompt_len && next == int64_t(s.prompt_lp.size() + lps.size()) + 1)
            lps.push_back(compute_logprobs(it.all_logits.subspan(size_t(j * vocab), size_t(vocab)),
                                           s.req.prompt[size_t(next)], s.req.prompt_logprobs));
        }
        s.prompt_lp.insert(s.prompt_lp.end(), lps.begin(), lps.end());
        s.req.stream->push_prompt_logprobs(std::move(lps));
      } catch (const std::exception& e) {
        finish(s, EndReason::Error, {}, fmt::format("prompt log-probabilities failed: {}", e.what()));
        continue;
      }
    }
    s.num_computed += batch[k].n;
    cache_prefix(s);
    if (!wants_token) continue;
    if (s.num_output == 0 && !s.forks.empty()) fork(s, it.logits, now);
    emit(s, it.logits, it.token, now);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  ++counters_.steps;
  publish_stats();
  return true;
}

void Scheduler::emit(Seq& s, std::span<float> logits, int32_t device_token, Clock::time_point now) {
  emit_one(s, logits, device_token, now);
}

std::vector<int32_t> Scheduler::propose(Seq& s, int max_drafts) {
  const SpeculativeConfig& spec = config_.speculative;
  std::vector<int32_t> d;
  if (spec.method == SpeculativeConfig::Method::Ngram) {
    d = ngram_propose(s.tokens, max_drafts);
  } else if (spec.method == SpeculativeConfig::Method::Mtp) {
    d = runner_.propose_mtp(*s.state, s.blocks, s.tokens, max_drafts);
  } else if (spec.method == SpeculativeConfig::Method::Custom) {
    d = config_.proposer(s.tokens, max_drafts);
  }
  return checked_drafts(std::move(d), max_drafts);
}

std::vector<int32_t> Scheduler::checked_drafts(std::vector<int32_t> d, int max_drafts) const {
  if (int64_t(d.size()) > max_drafts) d.resize(size_t(max_drafts));
  const int64_t vocab = runner_.vocab_size();
  for (int32_t t : d) FN_CHECK(t >= 0 && t < vocab, "draft token {} is outside the vocabulary [0, {})", t, vocab);
  return d;
}

void Scheduler::verify(Seq& s, int64_t drafts, Runner::Item& it, Clock::time_point now) {
  // The verify fed [t, d1 .. dD] at positions L .. L + D. The request's own sampler chooses the target's token at
  // each row in order; drafts are accepted while they equal those choices, and the first differing choice (or the
  // one after dD) ends the step: exactly the tokens and draws of decoding one token per step (speculative.h).
  const int64_t vocab = runner_.vocab_size();
  const int64_t start = s.num_computed;
  counters_.decode_tokens += 1 + drafts;
  s.num_computed += 1 + drafts;
  ++counters_.spec_verify_steps;
  counters_.spec_drafted += drafts;
  if (int64_t(counters_.spec_accepted_per_pos.size()) < drafts) counters_.spec_accepted_per_pos.resize(size_t(drafts));
  int64_t accepted = 0;
  bool alive = true;
  for (int64_t i = 0; i <= drafts; ++i) {
    const int32_t device_token = it.row_tokens.empty() ? -1 : it.row_tokens[size_t(i)];
    const std::span<float> row =
        it.all_logits.empty() ? std::span<float>() : it.all_logits.subspan(size_t(i * vocab), size_t(vocab));
    const int64_t before = s.num_output;
    alive = emit_one(s, row, device_token, now);
    const bool emitted = s.num_output > before;  // not after a sampling failure
    counters_.spec_emitted += emitted;
    const bool match = emitted && i < drafts && s.tokens.back() == s.verify[size_t(i + 1)];
    if (match) {  // accepted, also when it is the token that ends the request
      ++accepted;
      ++counters_.spec_accepted_per_pos[size_t(i)];
    }
    if (!alive) break;  // a stop condition cut the step: the request is finished, its state released
    if (!match) break;
  }
  counters_.spec_accepted += accepted;
  s.verify.clear();
  if (!alive) return;
  try {
    if (accepted < drafts) {       // roll back to the verify's start, advanced over the accepted tokens if it can be;
      ++counters_.spec_rollbacks;  // the next step feeds the rest (the correction, or everything again)
      s.num_computed = start + runner_.rollback(*s.state, accepted + 1);
    } else {
      runner_.release_checkpoint(*s.state);
    }
  } catch (const std::exception& e) {
    finish(s, EndReason::Error, {}, fmt::format("speculative rollback failed: {}", e.what()));
  }
}

bool Scheduler::emit_one(Seq& s, std::span<float> logits, int32_t device_token, Clock::time_point now) {
  const int64_t vocab = runner_.vocab_size();
  try {
    const SamplingParams& p = s.sampler->params();
    if (p.max_tokens == 0) {  // the prompt was only scored
      finish(s, EndReason::Length);
      return false;
    }
    int32_t tok = device_token;
    std::vector<float> raw;
    if (logits.empty()) {
      FN_CHECK(tok >= 0 && tok < vocab, "the device sampler returned token {} (vocabulary {})", tok, vocab);
    } else {
      if (s.req.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());
      tok = s.sampler->sample(logits);
    }
    s.sampler->accept(tok);
    std::optional<TokenLogprobs> lp;
    if (s.req.top_logprobs >= 0) lp = compute_logprobs(raw, tok, s.req.top_logprobs);
    s.tokens.push_back(tok);
    ++s.num_output;
    s.req.stream->push_token(tok, std::move(lp), now);
    auto has = [&](const auto& ids) { return std::find(ids.begin(), ids.end(), int64_t(tok)) != ids.end(); };
    if (has(p.stop_token_ids) || (!p.ignore_eos && has(s.req.eos_token_ids))) {
      finish(s, EndReason::Stop, tok);
    } else if (s.num_output >= p.max_tokens || int64_t(s.tokens.size()) >= config_.max_model_len) {
      finish(s, EndReason::Length);
    }
  } catch (const std::exception& e) {
    finish(s, EndReason::Error, {}, fmt::format("sampling failed: {}", e.what()));
  }
  return !s.done;
}

void Scheduler::fork(Seq& parent, std::span<const float> logits, Clock::time_point now) {
  std::vector<std::unique_ptr<Seq>> forks = std::move(parent.forks);
  parent.forks.clear();
  for (auto& f : forks) {
    Seq& c = *f;
    // With prefix caching (refcounted blocks) the fork shares the parent's full blocks, which neither writes
    // again, and gets a copy of the last, partial one (copy-on-write).
    if (planner_.prefix_caching())
      planner_.share_held(
          std::span<const int32_t>(parent.blocks).first(size_t(parent.num_computed / planner_.block_size())), c.blocks);
    const bool room = int64_t(running_.size()) < config_.max_num_seqs && planner_.free_slots() > 0 &&
                      planner_.try_grow(c.blocks, parent.num_computed);
    bool copied = false;
    if (room) {
      c.slot = *planner_.acquire_slot();
      try {
        c.state = runner_.new_sequence(c.slot);
        copied = runner_.copy_sequence(*parent.state, *c.state, c.blocks);
      } catch (const std::exception& e) {
        spdlog::warn("scheduler: could not fork request {} from {}: {}", c.req.id, parent.req.id, e.what());
      }
    }
    if (!copied) {  // it is fed on its own
      planner_.release(c.blocks, c.slot);
      c.slot = -1;
      c.state.reset();
      orphans_.push_back(std::move(f));
      continue;
    }
    c.num_computed = parent.num_computed;
    c.prompt_lp = parent.prompt_lp;
    if (!c.prompt_lp.empty()) c.req.stream->push_prompt_logprobs(c.prompt_lp);
    std::vector<float> own(logits.begin(), logits.end());
    emit(c, own, -1, now);
    running_.push_back(std::move(f));
  }
}

void Scheduler::order_by_priority() {
  auto by_priority = [](const std::unique_ptr<Seq>& a, const std::unique_ptr<Seq>& b) {
    return a->req.priority < b->req.priority;
  };
  // Stable: equal priorities keep their order (arrival; a preempted request stays in front of later arrivals).
  std::stable_sort(waiting_.begin(), waiting_.end(), by_priority);
  std::stable_sort(running_.begin(), running_.end(), by_priority);
}

}  // namespace flashnext
