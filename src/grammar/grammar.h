// Grammar: the compiled form that constrained decoding runs on, and the builder that makes it.
//
// Design (after xgrammar's and llguidance's published designs; no code taken from either):
//   A grammar is a set of rules; each rule is an epsilon-free NFA over bytes whose edges either consume one byte in a
//   range [lo, hi] or call another rule (push a return state, run the callee from its start state, come back to the
//   return state when the callee reaches one of its final states). So a grammar is a recursive transition network, and
//   the matcher (matcher.h) runs it as a nondeterministic pushdown automaton: its state is a set of stacks of NFA
//   states. Everything works on bytes, never on code points, so it meets byte-level BPE tokens (which may split a
//   UTF-8 sequence) without any decoding.
//
//   The builder takes Thompson fragments (sequence, alternative, repetition, byte ranges, literals, calls), joins them
//   with epsilon edges, and finish() removes the epsilon edges and the unreachable states. Left recursion (a rule that
//   can call itself before consuming a byte) is rejected there, because a pushdown matcher could not terminate on it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace flashnext::grammar {

/// An edge that consumes one byte b with lo <= b <= hi and goes to state `to`.
struct ByteEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t to = 0;
};

/// An edge that runs rule `rule` and, when it ends, continues at state `to` (the return state).
struct CallEdge {
  int32_t rule = 0;
  int32_t to = 0;
};

/// One NFA state of a compiled grammar (epsilon-free). `final`: the rule that owns it may end here.
struct GrammarState {
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;
  bool final = false;
};

/// A rule: a name (for messages and dumps) and the index of its start state.
struct GrammarRule {
  std::string name;
  int32_t start = 0;
};

/// A compiled grammar: immutable, shareable between any number of matchers and threads.
struct Grammar {
  std::vector<GrammarState> states;  ///< indexed by state id
  std::vector<GrammarRule> rules;    ///< indexed by rule id
  int32_t root = 0;                  ///< the rule a whole output must match

  /// A readable listing of every rule's states and edges (for debugging and tests).
  std::string dump() const;
};

/// Builds a Grammar from Thompson fragments. Not thread-safe; one use (finish() once).
class GrammarBuilder {
 public:
  /// A fragment: an entry state and an exit state of the epsilon-NFA under construction. Invariant kept by every
  /// operation: no edge leaves the exit state (so opt/alt/seq may join exits freely).
  struct Frag {
    int32_t in = 0;
    int32_t out = 0;
  };

  /// Matches the empty string.
  Frag empty();
  /// One byte in [lo, hi].
  Frag range(uint8_t lo, uint8_t hi);
  /// One byte in any of the ranges (pairs of lo, hi).
  Frag ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> rs);
  /// The bytes of `text`, in order.
  Frag literal(std::string_view text);
  /// One code point in strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF): a one-byte code point in
  /// one of the `ascii` ranges (each within 0x00-0x7F), or any two- to four-byte one.
  Frag utf8_char(std::initializer_list<std::pair<uint8_t, uint8_t>> ascii);
  /// A call of rule `rule` (declared with declare_rule; it may be defined later, which allows recursion).
  Frag call(int32_t rule);
  /// The fragments one after another (empty list: empty()).
  Frag seq(const std::vector<Frag>& parts);
  /// Any one of the fragments (empty list: matches nothing).
  Frag alt(const std::vector<Frag>& parts);
  /// f or nothing.
  Frag opt(Frag f);
  /// f repeated zero or more times.
  Frag star(Frag f);
  /// `make()` repeated between min and max times (max < 0: unbounded). `make` must build a fresh fragment each call
  /// (fragments cannot be reused: each is a piece of the graph).
  Frag repeat(const std::function<Frag()>& make, int64_t min, int64_t max);

  /// A new rule id with `name`; define it with define_rule before finish().
  int32_t declare_rule(std::string name);
  /// Sets the body of a declared rule.
  void define_rule(int32_t rule, Frag body);
  /// A fresh state with no edges (for graphs that fragments do not express, with link()).
  int32_t node() { return new_state(); }
  /// An epsilon edge from state `from` to state `to`.
  void link(int32_t from, int32_t to) { states_[from].eps.push_back(to); }
  /// Number of epsilon-NFA states so far (the compiler bounds it).
  size_t size() const { return states_.size(); }

  /// The epsilon-free grammar with `root` as its root rule. Throws Error when a rule is declared but not defined or
  /// when a rule can call itself without consuming a byte (left recursion; the message names the rules).
  Grammar finish(int32_t root);

 private:
  struct BState {
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
    std::vector<int32_t> eps;
    bool final = false;
  };
  int32_t new_state();
  std::vector<BState> states_;
  std::vector<GrammarRule> rules_;
  std::vector<bool> defined_;
};

}  // namespace flashnext::grammar
