#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>

namespace flashnext::tokenizer_impl {

namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

/// Cache of short pre-tokens: 4-way set-associative, 2^15 sets, least-recently-used replacement within a set. A
/// slot is one 64-byte line holding a key of up to kMaxKey bytes and up to kMaxIds ids; longer pre-tokens and
/// longer results are not cached. Sets are guarded by striped mutexes.
struct Bpe::Cache {
  static constexpr size_t kSets = size_t{1} << 15;
  static constexpr size_t kWays = 4;
  static constexpr size_t kStripes = 512;
  static constexpr size_t kMaxKey = 22;
  static constexpr size_t kMaxIds = 8;
  struct alignas(64) Slot {
    uint32_t tag = 0;   // upper hash bits | 1; 0 = empty
    uint32_t tick = 0;  // last use, for LRU within the set
    uint8_t key_len = 0;
    uint8_t n_ids = 0;
    char key[kMaxKey];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Slot) == 64);
  std::vector<Slot> slots{kSets * kWays};
  std::vector<uint32_t> ticks = std::vector<uint32_t>(kSets, 0);
  std::array<std::mutex, kStripes> locks;

  static uint64_t hash_of(std::string_view s) { return std::hash<std::string_view>{}(s); }
  static uint32_t tag_of(uint64_t h) { return static_cast<uint32_t>(h >> 32) | 1; }

  bool get(std::string_view key, uint64_t h, std::vector<int32_t>& out) {
    const size_t set = h & (kSets - 1);
    const uint32_t tag = tag_of(h);
    std::lock_guard<std::mutex> lock(locks[set % kStripes]);
    Slot* ways = &slots[set * kWays];
    for (size_t w = 0; w < kWays; ++w) {
      Slot& s = ways[w];
      if (s.tag == tag && s.key_len == key.size() && std::memcmp(s.key, key.data(), key.size()) == 0) {
        s.tick = ++ticks[set];
        out.insert(out.end(), s.ids, s.ids + s.n_ids);
        return true;
      }
    }
    return false;
  }
  void put(std::string_view key, uint64_t h, const int32_t* ids, size_t n) {
    if (n > kMaxIds) return;
    const size_t set = h & (kSets - 1);
    std::lock_guard<std::mutex> lock(locks[set % kStripes]);
    Slot* ways = &slots[set * kWays];
    Slot* victim = &ways[0];
    for (size_t w = 1; w < kWays; ++w) {
      if (ways[w].tick < victim->tick) victim = &ways[w];
    }
    victim->tag = tag_of(h);
    victim->tick = ++ticks[set];
    victim->key_len = static_cast<uint8_t>(key.size());
    victim->n_ids = static_cast<uint8_t>(n);
    std::memcpy(victim->key, key.data(), key.size());
    std::memcpy(victim->ids, ids, n * sizeof(int32_t));
  }
};

Bpe::Bpe(const std::array<int32_t, 256>& byte_ids, const std::vector<MergeRule>& merges, bool ignore_merges,
         std::unordered_map<std::string, int32_t> whole_words)
    : byte_ids_(byte_ids),
      ignore_merges_(ignore_merges),
      whole_words_(std::move(whole_words)),
      cache_(std::make_unique<Cache>()) {
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  pairs_.assign(cap, PairSlot{kEmptyKey, 0, 0});
  pair_mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeRule& m = merges[rank];
    const uint64_t key = pair_key(m.left, m.right);
    size_t i = mix(key) & pair_mask_;
    while (pairs_[i].key != kEmptyKey && pairs_[i].key != key) i = (i + 1) & pair_mask_;
    pairs_[i] = PairSlot{key, static_cast<uint32_t>(rank), m.merged};
  }
}

Bpe::~Bpe() = default;

const Bpe::PairSlot* Bpe::find_pair(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  size_t i = mix(key) & pair_mask_;
  while (true) {
    const PairSlot& s = pairs_[i];
    if (s.key == key) return &s;
    if (s.key == kEmptyKey) return nullptr;
    i = (i + 1) & pair_mask_;
  }
}

void Bpe::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() > Cache::kMaxKey) return encode_uncached(piece, out);
  const uint64_t h = Cache::hash_of(piece);
  if (cache_->get(piece, h, out)) return;
  const size_t before = out.size();
  encode_uncached(piece, out);
  cache_->put(piece, h, out.data() + before, out.size() - before);
}

void Bpe::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = whole_words_.find(std::string(piece)); it != whole_words_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id, prev, next, len;
  };
  struct Entry {
    uint32_t rank;
    int32_t pos, merged;
  };
  // Min-heap on (rank, pos): std heap functions build a max-heap of `less`, so invert.
  auto after = [](const Entry& a, const Entry& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Entry> heap;
  sym.clear();
  heap.clear();
  for (unsigned char b : piece) {
    const int32_t id = byte_ids_[b];
    if (id < 0) continue;
    const int32_t n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, 1});
  }
  if (sym.size() == 1) {
    out.push_back(sym[0].id);
    return;
  }
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    if (const PairSlot* p = find_pair(sym[i].id, sym[i + 1].id)) {
      heap.push_back({p->rank, static_cast<int32_t>(i), p->merged});
    }
  }
  std::make_heap(heap.begin(), heap.end(), after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Entry top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int32_t right_pos = cur.next;
    Symbol& right = sym[right_pos];
    const PairSlot* now = find_pair(cur.id, right.id);
    if (!now || now->merged != top.merged) continue;  // stale entry
    cur.id = top.merged;
    cur.len += right.len;
    cur.next = right.next;
    right.len = 0;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const PairSlot* p = find_pair(sym[cur.prev].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->merged});
        std::push_heap(heap.begin(), heap.end(), after);
      }
    }
    if (cur.next >= 0) {
      if (const PairSlot* p = find_pair(cur.id, sym[cur.next].id)) {
        heap.push_back({p->rank, top.pos, p->merged});
        std::push_heap(heap.begin(), heap.end(), after);
      }
    }
  }
  for (const Symbol& s : sym) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace flashnext::tokenizer_impl
