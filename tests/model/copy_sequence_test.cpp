// Model::copy_sequence: a copy of a prefilled sequence continues as the original would. tiny-a: the prompt is
// prefilled once in a paged pool, copied into another slot and other (scrambled) blocks, and the copy's greedy
// continuation is the reference's greedy ids; the original, decoded after the copy, gives them too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fixture.h"

using namespace flashnext;
using namespace flashnext::test;

namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

std::vector<int64_t> greedy_from(Model& m, SequenceState& s, int32_t first, int steps) {
  std::vector<int64_t> out{first};
  int32_t tok = first;
  while (int(out.size()) < steps) {
    const std::vector<float> l = m.forward(s, {&tok, 1}, LogitsMode::Last);
    tok = int32_t(argmax(l.data(), int64_t(l.size())));
    out.push_back(tok);
  }
  return out;
}

}  // namespace

TEST(CopySequence, CopyContinuesWithTheReferenceGreedyIds) {
  Model& m = shared_model(kTinyA);
  const Reference ref("tiny-a");
  for (const std::string P : {"short", "long"}) {
    const std::vector<int32_t> ids = ref.ids(P);
    const std::vector<int64_t> want = ref.i64(P + ".greedy_ids");
    const int64_t bs = 16, per = (int64_t(ids.size()) + int64_t(want.size()) + bs - 1) / bs;
    auto cache = m.new_cache(2 * per, bs, 3);
    SequenceState a = m.new_sequence(cache, 0), b = m.new_sequence(cache, 2);
    for (int64_t i = 0; i < per; ++i) {  // a: even blocks ascending; b: odd blocks descending
      a.block_table.push_back(int32_t(2 * i));
      b.block_table.push_back(int32_t(2 * (per - 1 - i) + 1));
    }
    const std::vector<float> l = m.forward(a, ids, LogitsMode::Last);
    const int32_t first = int32_t(argmax(l.data(), int64_t(l.size())));
    m.copy_sequence(a, b);
    EXPECT_EQ(b.length, a.length);
    EXPECT_EQ(greedy_from(m, b, first, int(want.size())), want) << P << ": the copy";
    EXPECT_EQ(greedy_from(m, a, first, int(want.size())), want) << P << ": the original after the copy";
  }
}

TEST(CopySequence, RejectsADestinationThatDoesNotFit) {
  Model& m = shared_model(kTinyA);
  auto cache = m.new_cache(8, 16, 2);
  SequenceState a = m.new_sequence(cache, 0), b = m.new_sequence(cache, 1);
  a.block_table = {0, 1};
  b.block_table = {2};
  const std::vector<int32_t> ids(20, 5);
  m.forward(a, ids, LogitsMode::Last);
  try {
    m.copy_sequence(a, b);  // 20 positions, b covers 16
    FAIL() << "copy into a table of 16 positions accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("covers 1 blocks of 16"), std::string::npos) << e.what();
  }
  b.block_table = {2, 3};
  m.copy_sequence(a, b);
  EXPECT_THROW(m.copy_sequence(a, b), Error);  // b is no longer fresh
  SequenceState c = m.new_sequence(cache, 0);  // a's slot
  c.block_table = {4, 5};
  EXPECT_THROW(m.copy_sequence(a, c), Error);
}
