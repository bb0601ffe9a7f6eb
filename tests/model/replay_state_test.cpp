// Model::replay_state: a speculative verify keeps the inputs of its recurrent state (BatchItem::keep_inputs); after
// the state from before the verify is put back, replaying the first n tokens leaves the sequence exactly where
// feeding those n tokens leaves it: the same GDN conv / recurrent and PLE conv slots (bit for bit on the CPU, whose
// steps do not depend on the batch), the same PLE histories and length, and the same logits for the next token. At
// TP 1, 2 and 4 (each rank replays its own heads; at TP 4 one sits the GDN layers out). Then the errors of a replay
// that cannot be right.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fixture.h"

using namespace flashnext;
using namespace flashnext::test;

namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

Model& model_at(int tp) {
  if (tp == 1) return shared_model(kTinyA);
  static std::map<int, std::unique_ptr<Model>> models;
  auto& m = models[tp];
  if (!m) {
    ModelOptions o;
    o.tp = tp;
    m = Model::load(source_path(kTinyA), o);
  }
  return *m;
}

std::vector<int32_t> tokens(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 977 + salt * 131 + 11) % vocab));
  return t;
}

}  // namespace

TEST(ReplayState, EqualsFeedingTheAcceptedTokens) {
  for (int tp : {1, 2, 4}) {  // at TP 4 a rank of tiny-a holds no GDN value heads: nothing kept or replayed there
    Model& m = model_at(tp);
    const int64_t V = m.config().vocab_size;
    const std::vector<int32_t> prompt = tokens(29, tp, V), verify = tokens(6, 7 + tp, V);
    for (int64_t keep : {1, 2, 4, 6}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + ", " + std::to_string(keep) + " of 6 tokens kept");
      auto [a, b] = replayed_and_fed(m, prompt, verify, keep);
      EXPECT_EQ(a.length, b.length);
      EXPECT_EQ(a.ple_history, b.ple_history);
      // Bit for bit where b fed its tokens as one chunk of several; a single token goes through the CPU's
      // one-row products, which round differently from the verify's several-row ones (as plain decoding after a
      // prefill does), so there the state and logits agree to float rounding.
      const auto sa = state_tensors(m, a), sb = state_tensors(m, b);
      ASSERT_EQ(sa.size(), sb.size());
      const int32_t next = 3;
      const std::vector<float> la = m.forward(a, {&next, 1}, LogitsMode::Last),
                               lb = m.forward(b, {&next, 1}, LogitsMode::Last);
      if (keep > 1) {
        for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i], sb[i]) << "state tensor " << i;
        EXPECT_EQ(la, lb);
      } else {
        for (size_t i = 0; i < sa.size(); ++i)
          EXPECT_LE(max_abs_diff(sa[i].data(), sb[i].data(), sa[i].size()), 1e-6 * std::max(1.0, max_abs(sb[i])))
              << "state tensor " << i;
        EXPECT_LE(max_abs_diff(la.data(), lb.data(), la.size()), 1e-5 * max_abs(lb));
      }
    }
  }
}

TEST(ReplayState, RefusesWhatItCannotReplay) {
  Model& m = model_at(1);
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prompt = tokens(12, 1, V), verify = tokens(4, 2, V);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SequenceState s = m.new_sequence();
  m.forward(s, prompt, LogitsMode::Last);
  const Model::StateSnapshot before = m.snapshot_state(s);
  const StateInputs kept = verify_keeping(m, s, verify);
  // The state was not put back: the sequence is past the verify.
  EXPECT_NE(message([&] {
              m.replay_state(s, kept, 2);
            }).find("the sequence is at position 16, the kept inputs start at 12 (put its state back first)"),
            std::string::npos);
  m.restore_state(s, before);
  EXPECT_NE(message([&] { m.replay_state(s, kept, 0); }).find("replay_state: 0 tokens of a verify item of 4"),
            std::string::npos);
  EXPECT_NE(message([&] { m.replay_state(s, kept, 5); }).find("replay_state: 5 tokens of a verify item of 4"),
            std::string::npos);
  EXPECT_NE(message([&] {
              m.replay_state(s, StateInputs(), 1);
            }).find("replay_state: the kept inputs were not kept by a step of this model"),
            std::string::npos);
  // Inputs kept by a TP 2 model hold two ranks.
  Model& two = model_at(2);
  SequenceState t = two.new_sequence();
  two.forward(t, prompt, LogitsMode::Last);
  const StateInputs other = verify_keeping(two, t, verify);
  EXPECT_NE(message([&] {
              m.replay_state(s, other, 1);
            }).find("replay_state: the kept inputs were not kept by a step of this model"),
            std::string::npos);
  // A history other than the kept one (the state put back from elsewhere).
  SequenceState u = m.new_sequence();
  m.forward(u, tokens(12, 9, V), LogitsMode::Last);
  EXPECT_NE(message([&] { m.replay_state(u, kept, 1); }).find("PLE history is not the one"), std::string::npos);
  // Nothing changed by the refusals: the replay still works.
  EXPECT_EQ(message([&] { m.replay_state(s, kept, 4); }), "no error");
  EXPECT_EQ(s.length, 16);
}
