#include "grammar/matcher.h"

#include <algorithm>

#include "core/error.h"

namespace flashnext::grammar {

int32_t StackPool::cons(int32_t state, int32_t parent) {
  uint64_t key = (uint64_t(uint32_t(state)) << 32) | uint32_t(parent);
  auto [it, fresh] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({state, parent});
  return it->second;
}

namespace pda {

namespace {
// Deeper than any JSON a model writes; beyond it a path is dropped (it cannot loop forever: finish() rejects left
// recursion, so each nested call is one more stack entry below a consumed byte, but a pop chain is bounded too).
constexpr int kMaxCloseDepth = 100000;

void close_rec(const Grammar& g, StackPool& pool, int32_t node, std::vector<int32_t>& out, bool& ended, bool& left,
               int depth) {
  if (depth > kMaxCloseDepth) return;
  const StackPool::Node nd = pool[node];
  const GrammarState& st = g.states[nd.state];
  if (!st.bytes.empty()) out.push_back(node);
  for (const CallEdge& c : st.calls) {
    int32_t ret = pool.cons(c.to, nd.parent);
    close_rec(g, pool, pool.cons(g.rules[c.rule].start, ret), out, ended, left, depth + 1);
  }
  if (st.final) {
    if (nd.parent == kStackRoot)
      ended = true;
    else if (nd.parent == kStackUnknown)
      left = true;
    else
      close_rec(g, pool, nd.parent, out, ended, left, depth + 1);
  }
}
}  // namespace

void close(const Grammar& g, StackPool& pool, int32_t node, std::vector<int32_t>& out, bool& ended, bool& left) {
  close_rec(g, pool, node, out, ended, left, 0);
}

bool step(const Grammar& g, StackPool& pool, const std::vector<int32_t>& in, uint8_t b, std::vector<int32_t>& out,
          bool& ended, bool& left) {
  out.clear();
  bool matched = false;
  for (int32_t node : in) {
    const StackPool::Node nd = pool[node];
    for (const ByteEdge& e : g.states[nd.state].bytes) {
      if (b < e.lo) break;  // edges are sorted by lo
      if (b > e.hi) continue;
      matched = true;
      close(g, pool, pool.cons(e.to, nd.parent), out, ended, left);
    }
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return matched;
}

}  // namespace pda

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), pool_(std::make_shared<StackPool>()) {
  FN_CHECK(grammar_ != nullptr, "grammar matcher: no grammar");
  bool left = false;
  pda::close(*grammar_, *pool_, pool_->cons(grammar_->rules[grammar_->root].start, kStackRoot), state_.stacks,
             state_.can_end, left);
  std::sort(state_.stacks.begin(), state_.stacks.end());
  state_.stacks.erase(std::unique(state_.stacks.begin(), state_.stacks.end()), state_.stacks.end());
}

bool GrammarMatcher::advance(std::string_view bytes, MatcherState& s) const {
  if (bytes.empty()) return true;
  if (s.terminated) return false;
  std::vector<int32_t> next;
  for (char c : bytes) {
    bool ended = false, left = false;
    pda::step(*grammar_, *pool_, s.stacks, static_cast<uint8_t>(c), next, ended, left);
    if (next.empty() && !ended) return false;
    s.stacks.swap(next);
    s.can_end = ended;
  }
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  MatcherState s = state_;
  if (!advance(bytes, s)) return false;
  history_.push_back(std::move(state_));
  state_ = std::move(s);
  return true;
}

bool GrammarMatcher::can_accept(std::string_view bytes) const {
  MatcherState s = state_;
  return advance(bytes, s);
}

bool GrammarMatcher::terminate() {
  if (!state_.can_end || state_.terminated) return false;
  history_.push_back(state_);
  state_.terminated = true;
  return true;
}

void GrammarMatcher::rollback(size_t n) {
  FN_CHECK(n <= history_.size(), "grammar matcher: cannot roll back {} steps, only {} recorded", n, history_.size());
  if (n == 0) return;
  state_ = std::move(history_[history_.size() - n]);
  history_.resize(history_.size() - n);
}

}  // namespace flashnext::grammar
