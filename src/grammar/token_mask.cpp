#include "grammar/token_mask.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace flashnext::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> tokens, std::vector<int32_t> eos_ids, int32_t mask_size)
    : tokens_(std::move(tokens)), eos_(std::move(eos_ids)) {
  FN_CHECK(tokens_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), "token vocabulary: too large");
  mask_size_ = mask_size > 0 ? mask_size : static_cast<int32_t>(tokens_.size());
  FN_CHECK(mask_size_ >= static_cast<int32_t>(tokens_.size()),
           "token vocabulary: mask size {} is smaller than the {} tokens", mask_size_, tokens_.size());
  for (int32_t id : eos_)
    FN_CHECK(id >= 0 && id < mask_size_, "token vocabulary: EOS id {} is outside [0, {})", id, mask_size_);

  std::vector<int32_t> order;
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (!tokens_[i].empty() && std::find(eos_.begin(), eos_.end(), static_cast<int32_t>(i)) == eos_.end())
      order.push_back(static_cast<int32_t>(i));
  // Sorted by unsigned bytes (then id), so that the trie's children come in increasing byte order.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string &x = tokens_[a], &y = tokens_[b];
    int c = std::string_view(x).compare(y);  // char_traits<char>::compare is memcmp: unsigned bytes
    return c != 0 ? c < 0 : a < b;
  });

  nodes_.emplace_back();  // root
  std::vector<int32_t> path{0}, last_child{-1};
  const std::string* prev = nullptr;
  auto pop = [&] {
    nodes_[path.back()].sub_end = static_cast<int32_t>(ids_.size());
    path.pop_back();
  };
  for (int32_t id : order) {
    const std::string& t = tokens_[id];
    size_t lcp = 0;
    if (prev)
      while (lcp < t.size() && lcp < prev->size() && t[lcp] == (*prev)[lcp]) ++lcp;
    while (path.size() > lcp + 1) pop();
    for (size_t d = lcp; d < t.size(); ++d) {
      Node n;
      n.byte = static_cast<uint8_t>(t[d]);
      n.tok_begin = n.tok_end = static_cast<int32_t>(ids_.size());
      int32_t idx = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(n);
      last_child.push_back(-1);
      int32_t parent = path.back();
      if (last_child[parent] < 0)
        nodes_[parent].first_child = idx;
      else
        nodes_[last_child[parent]].next_sibling = idx;
      last_child[parent] = idx;
      path.push_back(idx);
    }
    ids_.push_back(id);
    nodes_[path.back()].tok_end = static_cast<int32_t>(ids_.size());
    prev = &t;
  }
  while (!path.empty()) pop();
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer,
                                                                      std::vector<int32_t> eos_ids, int32_t mask_size) {
  std::vector<std::string> tokens(tokenizer.vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (!tokenizer.is_special(id)) tokens[id] = std::string(tokenizer.token_bytes(id));
  return std::make_shared<const TokenVocabulary>(std::move(tokens), std::move(eos_ids), mask_size);
}

TokenMasker::TokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  FN_CHECK(grammar_ && vocab_, "token masker: no grammar or no vocabulary");
}

void TokenMasker::walk(Entry& e, int32_t node, int depth, bool dep) {
  const auto& nodes = vocab_->nodes();
  const auto& ids = vocab_->ids();
  if (sets_.size() < static_cast<size_t>(depth) + 2) sets_.resize(depth + 2);
  for (int32_t c = nodes[node].first_child; c >= 0; c = nodes[c].next_sibling) {
    const TokenVocabulary::Node& n = nodes[c];
    bool ended = false, left = false;
    bool alive = pda::step(*grammar_, pool_, sets_[depth], n.byte, sets_[depth + 1], ended, left);
    for (int32_t i = n.tok_begin; i < n.tok_end; ++i) {
      if (alive)
        e.accepted[ids[i] >> 5] |= 1u << (ids[i] & 31);
      else if (dep)
        e.dependent.push_back(ids[i]);
    }
    bool child_dep = dep || left;
    if (sets_[depth + 1].empty()) {
      if (child_dep) e.dependent.insert(e.dependent.end(), ids.begin() + n.tok_end, ids.begin() + n.sub_end);
      continue;
    }
    walk(e, c, depth + 1, child_dep);
  }
}

TokenMasker::Key TokenMasker::key_of(const StackPool& pool, int32_t node) const {
  Key k;
  k.fill(-1);
  int n = 0;
  int32_t cur = node;
  while (n < kContextFrames && cur >= 0) {
    k[1 + n++] = pool[cur].state;
    cur = pool[cur].parent;
  }
  k[0] = cur == kStackRoot ? -n : n;
  return k;
}

// The class of token `bytes` from the partial stack `node` (bottom kStackUnknown or kStackRoot), by the walk's rules:
// 0 rejected, 1 accepted, 2 dependent.
int TokenMasker::classify(int32_t node, const std::string& bytes) {
  scratch_a_.assign(1, node);
  bool dep = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    bool ended = false, left = false;
    bool alive = pda::step(*grammar_, pool_, scratch_a_, static_cast<uint8_t>(bytes[i]), scratch_b_, ended, left);
    if (i + 1 == bytes.size()) return alive ? 1 : dep ? 2 : 0;
    if (scratch_b_.empty()) return (dep || left) ? 2 : 0;
    dep = dep || left;
    scratch_a_.swap(scratch_b_);
  }
  return 0;
}

const TokenMasker::Entry& TokenMasker::entry(const Key& key) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  int n = key[0] < 0 ? -key[0] : key[0];
  int32_t node = key[0] < 0 ? kStackRoot : kStackUnknown;
  for (int i = n; i >= 1; --i) node = pool_.cons(key[i], node);
  Entry e;
  const Key base_key{1, key[1], -1, -1};
  if (key != base_key) {
    // More context only settles the one-frame position's dependent tokens: accepted stays accepted, rejected stays
    // rejected. When those are few, check them instead of walking the whole trie again.
    const Entry& base = entry(base_key);
    if (base.dependent.size() <= kRefineLimit) {
      e.accepted = base.accepted;
      for (int32_t id : base.dependent) {
        int c = classify(node, vocab_->bytes(id));
        if (c == 1) e.accepted[id >> 5] |= 1u << (id & 31);
        if (c == 2) e.dependent.push_back(id);
      }
      return cache_.emplace(key, std::move(e)).first->second;
    }
  }
  e.accepted.assign(vocab_->words(), 0);
  if (sets_.empty()) sets_.resize(2);
  sets_[0].assign(1, node);
  ++trie_walks_;
  walk(e, 0, 0, false);
  return cache_.emplace(key, std::move(e)).first->second;
}

void TokenMasker::fill_mask(const GrammarMatcher& matcher, std::span<uint32_t> mask) {
  FN_CHECK(mask.size() == vocab_->words(), "token mask: {} words given, {} needed", mask.size(), vocab_->words());
  FN_CHECK(&matcher.grammar() == grammar_.get(), "token mask: the matcher runs another grammar");
  std::fill(mask.begin(), mask.end(), 0u);
  const MatcherState& st = matcher.save();
  if (st.terminated) return;
  if (st.can_end)
    for (int32_t id : vocab_->eos_ids()) mask[id >> 5] |= 1u << (id & 31);
  StackPool& pool = matcher.pool();
  std::vector<Key> seen;
  for (int32_t node : st.stacks) {
    Key key = key_of(pool, node);
    const Entry& e = entry(key);
    if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
      seen.push_back(key);
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= e.accepted[w];
    }
    for (int32_t id : e.dependent) {
      if (mask[id >> 5] & (1u << (id & 31))) continue;
      scratch_a_.assign(1, node);
      bool ok = true;
      for (char ch : vocab_->bytes(id)) {
        bool ended = false, left = false;
        if (scratch_a_.empty()) {
          ok = false;
          break;
        }
        pda::step(*grammar_, pool, scratch_a_, static_cast<uint8_t>(ch), scratch_b_, ended, left);
        if (scratch_b_.empty() && !ended) {
          ok = false;
          break;
        }
        scratch_a_.swap(scratch_b_);
      }
      if (ok) mask[id >> 5] |= 1u << (id & 31);
    }
  }
}

std::vector<uint32_t> TokenMasker::mask(const GrammarMatcher& matcher) {
  std::vector<uint32_t> m(vocab_->words());
  fill_mask(matcher, m);
  return m;
}

bool TokenMasker::accept_token(GrammarMatcher& matcher, int32_t id) const {
  const auto& eos = vocab_->eos_ids();
  if (std::find(eos.begin(), eos.end(), id) != eos.end()) return matcher.terminate();
  if (id < 0 || static_cast<size_t>(id) >= vocab_->num_tokens() || vocab_->bytes(id).empty()) return false;
  return matcher.accept_bytes(vocab_->bytes(id));
}

void apply_token_mask(std::span<float> logits, std::span<const uint32_t> mask) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (i >= mask.size() * 32 || !(mask[i >> 5] & (1u << (i & 31)))) logits[i] = ninf;
}

}  // namespace flashnext::grammar
