// GrammarMatcher: runs a Grammar (grammar.h) over bytes as a nondeterministic pushdown automaton.
//
// State: a set of stacks of NFA state ids. The top of each stack is the current position in the rule being matched;
// the entries below are return states of the calls in progress. Stacks are persistent linked lists, hash-consed in a
// StackPool (equal stacks are the same node id, so a set of stacks is a small sorted vector of ints and a copy of the
// state costs a few words). The state is always kept "closed": every stack's top state has at least one byte edge
// (calls are entered and finished rules popped eagerly), and `can_end` records whether the whole root rule may end
// here. Consuming byte b replaces each stack's top by the targets of its edges that accept b, then closes again.
//
// History: every accepted chunk (accept_bytes / accept_token call) pushes a checkpoint, so rollback(n) undoes the
// last n of them (for speculative decoding), and save()/restore() move whole states by value.
//
// Threads: a matcher and the copies made from it share one append-only StackPool, so they must all be used from one
// thread at a time. Different matchers (made by the constructor) are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace flashnext::grammar {

/// The parent id of a bottom stack entry: popping it ends the root rule.
inline constexpr int32_t kStackRoot = -1;
/// The parent id used when the stack below is unknown (token-mask precomputation): popping it leaves the rule.
inline constexpr int32_t kStackUnknown = -2;

/// Hash-consed stack entries: node id -> (state, parent node id or kStackRoot / kStackUnknown). Append-only.
class StackPool {
 public:
  struct Node {
    int32_t state;
    int32_t parent;
  };
  /// The node for (state, parent), made if new.
  int32_t cons(int32_t state, int32_t parent);
  const Node& operator[](int32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }

 private:
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
};

/// The closed set of stacks after some input. `stacks` is sorted, without duplicates.
struct MatcherState {
  std::vector<int32_t> stacks;  ///< node ids in the matcher's StackPool
  bool can_end = false;         ///< the input so far is a complete match of the root rule
  bool terminated = false;      ///< an end-of-sequence token was accepted (nothing more may follow)
};

/// Low-level steps on a pool, shared by the matcher and the token masker.
namespace pda {
/// Adds to `out` the closure of stack `node`: the stacks whose top has byte edges, reached by entering calls and
/// popping finished rules. Sets `ended` when the root rule may end, `left` when a kStackUnknown bottom was popped.
void close(const Grammar& g, StackPool& pool, int32_t node, std::vector<int32_t>& out, bool& ended, bool& left);
/// Consumes byte `b` from every stack of `in` (closed) into `out` (cleared first; closed, sorted, unique).
/// Returns true when at least one edge accepted the byte (even if the result is empty because the rules ended).
bool step(const Grammar& g, StackPool& pool, const std::vector<int32_t>& in, uint8_t b, std::vector<int32_t>& out,
          bool& ended, bool& left);
}  // namespace pda

/// A byte-level matcher of one grammar. Copyable (copies share the pool; see the header comment).
class GrammarMatcher {
 public:
  /// Starts at the beginning of the root rule of `grammar`.
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// Consumes `bytes` if the whole string is a valid continuation and returns true (and pushes a checkpoint);
  /// otherwise returns false and leaves the state unchanged. Empty `bytes` is accepted (a checkpoint too).
  /// After terminate(), every non-empty input is rejected.
  bool accept_bytes(std::string_view bytes);
  /// True when `bytes` is a valid continuation (the state does not change).
  bool can_accept(std::string_view bytes) const;
  /// True when the input so far is a complete match (an end-of-sequence token may come now).
  bool can_end() const { return state_.can_end; }
  /// True when no byte can follow (the match is complete and the grammar allows nothing more).
  bool is_exhausted() const { return state_.stacks.empty(); }
  /// Accepts the end of the sequence: returns false (no change) when can_end() is false; otherwise marks the state
  /// terminated and pushes a checkpoint.
  bool terminate();
  bool is_terminated() const { return state_.terminated; }

  /// Number of checkpoints that rollback() can undo.
  size_t num_checkpoints() const { return history_.size(); }
  /// Undoes the last `n` accepted chunks (accept_bytes / terminate). Throws Error when n > num_checkpoints().
  void rollback(size_t n);
  /// The current state by value (valid for this matcher and its copies).
  const MatcherState& save() const { return state_; }
  /// Restores a state returned by save() of this matcher or a copy. The history is kept; restore clears nothing.
  void restore(const MatcherState& s) { state_ = s; }
  /// Drops the history (checkpoints older than now can no longer be rolled back to).
  void clear_history() { history_.clear(); }

  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }
  /// The pool the state's node ids refer to.
  StackPool& pool() const { return *pool_; }

 private:
  bool advance(std::string_view bytes, MatcherState& s) const;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<StackPool> pool_;
  MatcherState state_;
  std::vector<MatcherState> history_;
};

}  // namespace flashnext::grammar
