// Token masks: which vocabulary tokens may come next in a GrammarMatcher's state.
//
// TokenVocabulary holds every token's bytes (from the tokenizer, tokenizer.h token_bytes) in a byte trie. Special
// tokens never match grammar text; the end-of-sequence ids given to it are allowed exactly when the grammar may end.
//
// TokenMasker computes the mask with a per-position cache (the "context-independent tokens" idea of xgrammar, with a
// context of a few frames): a position is the top kContextFrames (3) entries of a stack, e.g. [char-state,
// return-state-in-string-rule, return-state-in-object-rule]. For each position seen, it walks the trie once from that
// partial stack, with the stack below it unknown (or known to be empty when the position is the whole stack), and
// sorts every token into
//   - accepted: its bytes are consumed within these frames (and the rules they call): valid whatever lies below;
//   - dependent: it can only go on by finishing all of these frames and continuing below (e.g. `"}` at the end of
//     the innermost object's last string), so it must be checked against the real stack;
//   - rejected: neither.
// The walk prunes a whole subtree at the first rejected byte. Then mask(state) = OR of the accepted bitsets of the
// distinct positions + the dependent tokens checked one by one on their stack + EOS when the state may end. The first
// mask at a new position pays for the walk (about 10 ms for a position inside a string, where most of the vocabulary
// is valid); later masks there cost the OR and the dependent checks (microseconds). A position with more context than
// one frame starts from the one-frame position's entry and only re-checks its dependent tokens (when at most
// kRefineLimit), so the same string rule under many properties walks the trie once.
//
// Mask layout: uint32 words, bit (id % 32) of word (id / 32) set when token id is allowed; words() = ceil(n / 32)
// with n = mask_size (the model's vocabulary rows, >= the tokenizer's vocab_size; rows without a token stay 0).
//
// Threads: a TokenMasker's cache is not locked; use one masker per thread (or lock around fill_mask).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::grammar {

/// The byte strings of a vocabulary, in a trie. Immutable after construction; shareable between threads.
class TokenVocabulary {
 public:
  /// A trie node: its byte, first child and next sibling (-1: none, children in increasing byte order), and the
  /// tokens whose bytes end here: ids_[tok_begin, tok_end), with all tokens of the subtree in ids_[tok_begin, sub_end).
  struct Node {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t tok_begin = 0;
    int32_t tok_end = 0;
    int32_t sub_end = 0;
    uint8_t byte = 0;
  };

  /// `tokens[id]` = the bytes of token id (empty: never allowed); `eos_ids` = the end-of-sequence ids (allowed when
  /// the grammar may end); `mask_size` >= tokens.size() (0: tokens.size()). Throws Error on an out-of-range EOS id.
  TokenVocabulary(std::vector<std::string> tokens, std::vector<int32_t> eos_ids, int32_t mask_size = 0);

  /// From a tokenizer: every id's token_bytes(), except special tokens (which get no bytes, so only `eos_ids` of them
  /// are ever allowed). Non-special added tokens (Qwen3's "<think>") are plain text here.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
                                                               int32_t mask_size = 0);

  int32_t mask_size() const { return mask_size_; }
  /// uint32 words of a mask: ceil(mask_size / 32).
  size_t words() const { return (static_cast<size_t>(mask_size_) + 31) / 32; }
  const std::string& bytes(int32_t id) const { return tokens_[id]; }
  size_t num_tokens() const { return tokens_.size(); }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  const std::vector<Node>& nodes() const { return nodes_; }  ///< nodes()[0] is the root (empty prefix)
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::vector<std::string> tokens_;
  std::vector<int32_t> eos_;
  int32_t mask_size_;
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
};

/// Computes token masks for matchers of one grammar over one vocabulary, caching per-position results.
class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);

  /// Writes the allowed-token mask of `matcher`'s current state into `mask` (vocab().words() words; Error otherwise).
  /// A terminated matcher allows nothing; a matcher that may end allows the EOS ids. The matcher must run this
  /// masker's grammar.
  void fill_mask(const GrammarMatcher& matcher, std::span<uint32_t> mask);
  /// A new mask vector of `matcher`'s state.
  std::vector<uint32_t> mask(const GrammarMatcher& matcher);

  /// Feeds token `id` to `matcher`: an EOS id terminates it (false if it may not end), another id's bytes are
  /// accepted (false, no change, if invalid or the token has no bytes).
  bool accept_token(GrammarMatcher& matcher, int32_t id) const;

  /// Frames of stack context that key the cache (see the header comment).
  static constexpr int kContextFrames = 3;
  /// Full trie walks done so far (the expensive first visits); the other cached positions were refined.
  size_t trie_walks() const { return trie_walks_; }
  /// Number of positions cached so far.
  size_t cached_positions() const { return cache_.size(); }

  const TokenVocabulary& vocab() const { return *vocab_; }
  /// The grammar this masker serves (matchers of it are what fill_mask takes).
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }

 private:
  struct Entry {
    std::vector<uint32_t> accepted;  // [words]
    std::vector<int32_t> dependent;  // token ids, in trie order
  };
  // Key: number of frames (negative when they are the whole stack), then the states from the top down (-1 padded).
  using Key = std::array<int32_t, kContextFrames + 1>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : k) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  Key key_of(const StackPool& pool, int32_t node) const;
  const Entry& entry(const Key& key);
  int classify(int32_t node, const std::string& bytes);
  static constexpr size_t kRefineLimit = 4096;  // most one-frame dependent tokens refined one by one
  void walk(Entry& e, int32_t node, int depth, bool dep);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::unordered_map<Key, Entry, KeyHash> cache_;
  StackPool pool_;                           // precomputation stacks (bottom kStackUnknown)
  std::vector<std::vector<int32_t>> sets_;   // walk scratch: one stack set per depth
  std::vector<int32_t> scratch_a_, scratch_b_;
  size_t trie_walks_ = 0;
};

/// Sets logits[id] = -inf for every id whose bit in `mask` is 0 (ids < min(logits.size(), 32 * mask.size())), and
/// for ids at or beyond 32 * mask.size().
void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask);

}  // namespace flashnext::grammar
