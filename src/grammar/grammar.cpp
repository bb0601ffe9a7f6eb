#include "grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace flashnext::grammar {

int32_t GrammarBuilder::new_state() {
  states_.emplace_back();
  return static_cast<int32_t>(states_.size() - 1);
}

GrammarBuilder::Frag GrammarBuilder::empty() {
  int32_t s = new_state();
  return {s, s};
}

GrammarBuilder::Frag GrammarBuilder::range(uint8_t lo, uint8_t hi) { return ranges({{lo, hi}}); }

GrammarBuilder::Frag GrammarBuilder::ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> rs) {
  int32_t a = new_state(), b = new_state();
  for (auto [lo, hi] : rs) states_[a].bytes.push_back({lo, hi, b});
  return {a, b};
}

GrammarBuilder::Frag GrammarBuilder::utf8_char(std::initializer_list<std::pair<uint8_t, uint8_t>> ascii) {
  auto cont = [&] { return range(0x80, 0xBF); };
  std::vector<Frag> alts;
  alts.push_back(ranges(ascii));
  alts.push_back(seq({range(0xC2, 0xDF), cont()}));
  alts.push_back(seq({range(0xE0, 0xE0), range(0xA0, 0xBF), cont()}));
  alts.push_back(seq({ranges({{0xE1, 0xEC}, {0xEE, 0xEF}}), cont(), cont()}));
  alts.push_back(seq({range(0xED, 0xED), range(0x80, 0x9F), cont()}));  // no surrogates
  alts.push_back(seq({range(0xF0, 0xF0), range(0x90, 0xBF), cont(), cont()}));
  alts.push_back(seq({range(0xF1, 0xF3), cont(), cont(), cont()}));
  alts.push_back(seq({range(0xF4, 0xF4), range(0x80, 0x8F), cont(), cont()}));  // at most U+10FFFF
  return alt(alts);
}

GrammarBuilder::Frag GrammarBuilder::literal(std::string_view text) {
  int32_t first = new_state(), cur = first;
  for (char c : text) {
    int32_t next = new_state();
    auto b = static_cast<uint8_t>(c);
    states_[cur].bytes.push_back({b, b, next});
    cur = next;
  }
  return {first, cur};
}

GrammarBuilder::Frag GrammarBuilder::call(int32_t rule) {
  int32_t a = new_state(), b = new_state();
  states_[a].calls.push_back({rule, b});
  return {a, b};
}

GrammarBuilder::Frag GrammarBuilder::seq(const std::vector<Frag>& parts) {
  if (parts.empty()) return empty();
  for (size_t i = 1; i < parts.size(); ++i) states_[parts[i - 1].out].eps.push_back(parts[i].in);
  return {parts.front().in, parts.back().out};
}

GrammarBuilder::Frag GrammarBuilder::alt(const std::vector<Frag>& parts) {
  int32_t a = new_state(), b = new_state();
  for (const Frag& p : parts) {
    states_[a].eps.push_back(p.in);
    states_[p.out].eps.push_back(b);
  }
  return {a, b};
}

GrammarBuilder::Frag GrammarBuilder::opt(Frag f) {
  states_[f.in].eps.push_back(f.out);
  return f;
}

GrammarBuilder::Frag GrammarBuilder::star(Frag f) {
  // A separate exit state: an exit with edges back into the loop would let opt() and alt() skip into the loop.
  int32_t a = new_state(), b = new_state();
  states_[a].eps.push_back(f.in);
  states_[a].eps.push_back(b);
  states_[f.out].eps.push_back(a);
  return {a, b};
}

GrammarBuilder::Frag GrammarBuilder::repeat(const std::function<Frag()>& make, int64_t min, int64_t max) {
  std::vector<Frag> parts;
  for (int64_t i = 0; i < min; ++i) parts.push_back(make());
  if (max < 0) {
    parts.push_back(star(make()));
  } else {
    // Optional tail, nested so that a skipped repetition skips all later ones: (f (f (f)?)?)?
    std::vector<Frag> tail;
    for (int64_t i = min; i < max; ++i) tail.push_back(make());
    if (!tail.empty()) {
      int32_t end = new_state();
      for (size_t i = 0; i < tail.size(); ++i) {
        states_[tail[i].in].eps.push_back(end);  // stop before repetition i
        states_[tail[i].out].eps.push_back(i + 1 < tail.size() ? tail[i + 1].in : end);
      }
      parts.push_back({tail.front().in, end});
    }
  }
  return seq(parts);
}

int32_t GrammarBuilder::declare_rule(std::string name) {
  rules_.push_back({std::move(name), -1});
  defined_.push_back(false);
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::define_rule(int32_t rule, Frag body) {
  FN_CHECK(rule >= 0 && rule < static_cast<int32_t>(rules_.size()) && !defined_[rule],
           "grammar: rule {} defined twice or never declared", rule);
  rules_[rule].start = body.in;
  states_[body.out].final = true;
  defined_[rule] = true;
}

Grammar GrammarBuilder::finish(int32_t root) {
  for (size_t r = 0; r < rules_.size(); ++r)
    FN_CHECK(defined_[r], "grammar: rule '{}' is declared but never defined", rules_[r].name);
  FN_CHECK(root >= 0 && root < static_cast<int32_t>(rules_.size()), "grammar: no root rule");

  // Epsilon elimination: the new states are the old states that are entered by a byte or call edge or start a rule;
  // each gets the edges and finality of its epsilon closure.
  std::vector<int32_t> new_id(states_.size(), -1);
  std::vector<int32_t> order;  // old ids of new states
  auto want = [&](int32_t old) {
    if (new_id[old] < 0) {
      new_id[old] = static_cast<int32_t>(order.size());
      order.push_back(old);
    }
    return new_id[old];
  };
  Grammar g;
  g.root = root;
  g.rules = rules_;
  for (auto& r : g.rules) r.start = want(r.start);
  std::vector<int32_t> stamp(states_.size(), -1), todo;
  for (size_t i = 0; i < order.size(); ++i) {  // `order` grows while we go
    GrammarState out;
    todo.assign(1, order[i]);
    stamp[order[i]] = static_cast<int32_t>(i);
    while (!todo.empty()) {
      int32_t s = todo.back();
      todo.pop_back();
      const BState& b = states_[s];
      out.final = out.final || b.final;
      for (const ByteEdge& e : b.bytes) out.bytes.push_back(e);
      for (const CallEdge& e : b.calls) out.calls.push_back(e);
      for (int32_t t : b.eps)
        if (stamp[t] != static_cast<int32_t>(i)) {
          stamp[t] = static_cast<int32_t>(i);
          todo.push_back(t);
        }
    }
    for (ByteEdge& e : out.bytes) e.to = want(e.to);
    for (CallEdge& e : out.calls) e.to = want(e.to);
    std::sort(out.bytes.begin(), out.bytes.end(),
              [](const ByteEdge& a, const ByteEdge& b) { return std::tie(a.lo, a.hi, a.to) < std::tie(b.lo, b.hi, b.to); });
    out.bytes.erase(std::unique(out.bytes.begin(), out.bytes.end(),
                                [](const ByteEdge& a, const ByteEdge& b) { return a.lo == b.lo && a.hi == b.hi && a.to == b.to; }),
                    out.bytes.end());
    g.states.push_back(std::move(out));
  }

  // Left recursion: rule A calls B at its start (or after nullable calls, ignored: our rules' bodies never begin
  // with a nullable call followed by another call) ... a cycle A -> ... -> A of start-state calls never consumes.
  const size_t n = g.rules.size();
  std::vector<std::vector<int32_t>> first_calls(n);
  for (size_t r = 0; r < n; ++r)
    for (const CallEdge& e : g.states[g.rules[r].start].calls) first_calls[r].push_back(e.rule);
  std::vector<int> color(n, 0);  // 0 new, 1 on path, 2 done
  std::vector<int32_t> path;
  std::function<void(int32_t)> visit = [&](int32_t r) {
    color[r] = 1;
    path.push_back(r);
    for (int32_t c : first_calls[r]) {
      if (color[c] == 1) {
        std::string cycle;
        auto it = std::find(path.begin(), path.end(), c);
        for (; it != path.end(); ++it) cycle += g.rules[*it].name + " -> ";
        fail("grammar: left recursion (a rule calls itself before consuming any text): {}{}", cycle, g.rules[c].name);
      }
      if (color[c] == 0) visit(c);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (size_t r = 0; r < n; ++r)
    if (color[r] == 0) visit(static_cast<int32_t>(r));
  return g;
}

std::string Grammar::dump() const {
  std::string out;
  auto byte = [](uint8_t b) { return (b >= 0x21 && b < 0x7F) ? fmt::format("'{}'", char(b)) : fmt::format("0x{:02X}", b); };
  for (size_t r = 0; r < rules.size(); ++r)
    out += fmt::format("rule {} '{}' start {}{}\n", r, rules[r].name, rules[r].start, int32_t(r) == root ? " (root)" : "");
  for (size_t s = 0; s < states.size(); ++s) {
    out += fmt::format("  {}{}:", s, states[s].final ? " final" : "");
    for (const auto& e : states[s].bytes)
      out += e.lo == e.hi ? fmt::format(" {}->{}", byte(e.lo), e.to) : fmt::format(" [{}-{}]->{}", byte(e.lo), byte(e.hi), e.to);
    for (const auto& e : states[s].calls) out += fmt::format(" call {}->{}", rules[e.rule].name, e.to);
    out += "\n";
  }
  return out;
}

}  // namespace flashnext::grammar
