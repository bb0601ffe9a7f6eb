// Incremental state: prefilling a prompt in chunks of any size must give the logits of one full forward (1e-4),
// for every tiny-a prompt (the 300-token one is sparse in QSA and crosses GDN's 64-token chunks; eos_inside and
// eos_first exercise the PLE boundary rules across chunk edges) and every tiny-b prompt.
#include <gtest/gtest.h>

#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr double kTol = 1e-4;

struct Case {
  std::string model, fixture, prompt;
};

// Readable test listings (gtest otherwise prints the bytes of the struct).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << "/" << c.prompt;
}

class ChunkedPrefill : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedPrefill, AnyChunkSizeEqualsFullForward) {
  const Case& c = GetParam();
  Reference ref(c.fixture);
  Model& model = shared_model(c.model);
  const auto ids = ref.ids(c.prompt);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState full_seq = model.new_sequence();
  const std::vector<float> full = model.forward(full_seq, ids);
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(4), int64_t(5), int64_t(17), T}) {
    SequenceState seq;
    const std::vector<float> got = forward_in_chunks(model, ids, chunk, &seq);
    EXPECT_EQ(seq.length, T);
    ASSERT_EQ(got.size(), size_t(T * V));
    EXPECT_LE(max_abs_diff(got.data(), full.data(), got.size()), kTol) << c.prompt << " chunk " << chunk;
  }
}

// A cloned sequence continues exactly like the original.
TEST(ChunkedPrefill, ClonedSequenceContinuesIdentically) {
  Reference ref("tiny-a");
  Model& model = shared_model("tests/data/fixtures/tiny-a/model");
  const auto ids = ref.ids("long");
  SequenceState a = model.new_sequence();
  model.forward(a, std::span<const int32_t>(ids.data(), 150));
  SequenceState b = model.clone_sequence(a);
  const auto rest = std::span<const int32_t>(ids.data() + 150, ids.size() - 150);
  const auto la = model.forward(a, rest);
  const auto lb = model.forward(b, rest);
  ASSERT_EQ(la, lb);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* p : {"short", "eos_inside", "long", "single", "eos_first"}) {
    out.push_back({"tests/data/fixtures/tiny-a/model", "tiny-a", p});
  }
  for (const char* p : {"chat0", "chat2", "code"}) out.push_back({"models/tiny-b-random", "tiny-b", p});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Prompts, ChunkedPrefill, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.fixture.substr(5) + "_" + info.param.prompt; });

}  // namespace
}  // namespace flashnext::test
