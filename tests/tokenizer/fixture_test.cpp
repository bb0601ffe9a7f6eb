// The tiny-b fixture's tokenizer cases (tests/data/fixtures/tiny-b/tokenizer_cases.json, written by the transformers
// tokenizer from the Qwen3 tokenizer.json): encode ids, decoded text, and the ids of every rendered chat prompt.
#include <gtest/gtest.h>

#include "tok_test_util.h"

namespace flashnext {
namespace {

const nlohmann::json& cases() {
  static const nlohmann::json j = test::read_json("tests/data/fixtures/tiny-b/tokenizer_cases.json");
  return j;
}

TEST(TokenizerFixture, EncodeAndDecodeMatchTransformers) {
  const Tokenizer& tok = test::qwen3();
  ASSERT_EQ(cases()["encode"].size(), 18u);
  for (const auto& c : cases()["encode"]) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<TokenId>>();
    const std::vector<TokenId> ids = tok.encode(text);
    EXPECT_EQ(ids, expected) << "text: " << text;
    // transformers' decode() keeps special tokens by default.
    EXPECT_EQ(tok.decode(expected), c["decoded"].get<std::string>()) << "text: " << text;
  }
}

TEST(TokenizerFixture, RenderedChatsMatchTransformers) {
  const Tokenizer& tok = test::qwen3();
  ASSERT_EQ(cases()["chat"].size(), 6u);
  for (const auto& c : cases()["chat"]) {
    const std::string rendered = c["rendered"];
    EXPECT_EQ(tok.encode(rendered), c["ids"].get<std::vector<TokenId>>()) << "rendered: " << rendered;
  }
}

}  // namespace
}  // namespace flashnext
