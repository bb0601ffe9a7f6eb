// Byte-level BPE model: the merge loop of Hugging Face `tokenizers` (models/bpe/word.rs `Word::merge_all`) over the
// raw bytes of one pre-token, with a bounded hash cache of pre-token -> ids.
//
// The pre-token's bytes start as one symbol each (the vocabulary id of the byte's ByteLevel character). A min-heap
// ordered by (merge rank, position) repeatedly applies the best merge; an entry is skipped when its left symbol was
// consumed, has no right neighbour, or the pair now there no longer produces the entry's merged id. This is exactly
// the reference's loop, so ties and stale entries resolve the same way.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flashnext::tokenizer_impl {

/// One merge rule in rank order: `left` + `right` -> `merged` (vocabulary ids).
struct MergeRule {
  int32_t left, right, merged;
};

class Bpe {
 public:
  /// `byte_ids[b]`: id of the token for byte b (its ByteLevel character), -1 when the vocabulary lacks it (such
  /// bytes are dropped, as the reference drops characters without an id when there is no unk token).
  /// `merges` in rank order (a later duplicate of a pair replaces the earlier one, as in the reference).
  /// `whole_words`: raw bytes -> id of every vocabulary token, consulted first when `ignore_merges` is set.
  Bpe(const std::array<int32_t, 256>& byte_ids, const std::vector<MergeRule>& merges, bool ignore_merges,
      std::unordered_map<std::string, int32_t> whole_words);
  ~Bpe();

  /// Appends the ids of one pre-token (its raw UTF-8 bytes) to `out`. Thread-safe.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  /// Same as encode() but never consults or fills the cache (for tests and benchmarks).
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  struct PairSlot {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
  };
  const PairSlot* find_pair(int32_t left, int32_t right) const;

  std::array<int32_t, 256> byte_ids_;
  std::vector<PairSlot> pairs_;  // open addressing, linear probing, power-of-two size
  uint64_t pair_mask_ = 0;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> whole_words_;

  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace flashnext::tokenizer_impl
