// Bad requests get a clear flashnext::Error and leave the sequence usable.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kModel = "tests/data/fixtures/tiny-a/model";

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BadInput, TokenIdOutOfRange) {
  Model& model = shared_model(kModel);
  SequenceState seq = model.new_sequence();
  std::vector<int32_t> ids = {1, 2, 1024};  // vocab_size is 1024
  expect_error([&] { model.forward(seq, ids); }, "token id 1024 at index 2 is outside the vocabulary [0, 1024)");
  ids = {-1};
  expect_error([&] { model.forward(seq, ids); }, "token id -1 at index 0");
  EXPECT_EQ(seq.length, 0);
  ids = {1, 2};
  EXPECT_NO_THROW(model.forward(seq, ids));  // the sequence is still usable
  EXPECT_EQ(seq.length, 2);
}

TEST(BadInput, EmptyPrompt) {
  Model& model = shared_model(kModel);
  SequenceState seq = model.new_sequence();
  expect_error([&] { model.forward(seq, std::span<const int32_t>()); }, "empty input");
}

TEST(BadInput, PromptLongerThanMaxPositionEmbeddings) {
  Model& model = shared_model(kModel);
  const int64_t max_pos = model.config().max_position_embeddings;  // 4096
  SequenceState seq = model.new_sequence();
  std::vector<int32_t> ids(size_t(max_pos + 1), 7);
  expect_error([&] { model.forward(seq, ids); }, "more than max_position_embeddings = 4096");
  // Also when a later decode step would cross the limit.
  SequenceState near = model.new_sequence();
  near.length = max_pos;  // pretend full: the next token no longer fits
  std::vector<int32_t> one = {5};
  expect_error([&] { model.forward(near, one); }, "max_position_embeddings");
}

TEST(BadInput, MissingModelFolder) {
  expect_error([] { Model::load(source_path("tests/data/no-such-model")); }, "no-such-model");
}

}  // namespace
}  // namespace flashnext::test
