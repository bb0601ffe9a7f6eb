// Token masks against brute force: at chosen states, every token of the real Qwen3 vocabulary (151669 ids) is fed to
// a copy of the matcher and the result compared with its mask bit.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace flashnext::grammar {
namespace {

using test::bit;
using test::check_mask_brute_force;

TEST(TokenMask, EveryQwen3TokenAtChosenStates) {
  auto vocab = test::qwen3_vocab();
  ASSERT_EQ(vocab->mask_size(), 151669);
  auto g = compile_json_schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","bc"]}},
      "when":{"type":"string","format":"date"}},"required":["name"]})");
  TokenMasker masker(g, vocab);
  // Prefixes: start, after '{', inside a key, inside a string value (plain, after a backslash, inside \u, inside a
  // UTF-8 sequence), after a value (',' or '}' next), inside a number, inside an enum, inside a date, complete.
  for (const char* prefix : {"", "{", "{\"na", "{\"name\": \"ab", "{\"name\":\"a\\", "{\"name\":\"\\u00",
                             "{\"name\":\"\xC3", "{\"name\":\"x\"", "{\"name\":\"x\",\"age\":1",
                             "{\"name\":\"x\",\"tags\":[\"b", "{\"name\":\"x\",\"when\":\"2026-1",
                             "{\"name\":\"x\",\"age\":12}"}) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    size_t allowed = check_mask_brute_force(masker, m);
    EXPECT_GT(allowed, 0u) << prefix;
  }
}

// Deep stacks: tokens that finish more frames than the cache's context (kContextFrames) are checked on the real stack.
TEST(TokenMask, EveryQwen3TokenInDeepAndRecursiveSchemas) {
  auto vocab = test::qwen3_vocab();
  auto nested = compile_json_schema(R"({"type":"object","properties":{"a":{"type":"object","properties":{
      "b":{"type":"object","properties":{"c":{"type":"string","maxLength":4}},"required":["c"]}},"required":["b"]}},
      "required":["a"]})");
  TokenMasker m1(nested, vocab);
  for (const char* prefix : {R"({"a":{"b":{"c":")", R"({"a":{"b":{"c":"xy)", R"({"a":{"b":{"c":"wxyz)",
                             R"({"a":{"b":{"c":"x")", R"({"a":{"b":{"c":"x"})"}) {
    GrammarMatcher m(nested);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    EXPECT_GT(check_mask_brute_force(m1, m), 0u) << prefix;
  }
  auto tree = compile_json_schema(R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"string"},
      "k":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v"]}},"$ref":"#/$defs/n"})");
  TokenMasker m2(tree, vocab);
  for (const char* prefix : {R"({"v":"a","k":[{"v":"b","k":[{"v":"c)", R"({"v":"a","k":[{"v":"b","k":[{"v":"c")",
                             R"({"v":"a","k":[{"v":"b","k":[{"v":"c"}])"}) {
    GrammarMatcher m(tree);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    EXPECT_GT(check_mask_brute_force(m2, m), 0u) << prefix;
  }
}

TEST(TokenMask, EveryQwen3TokenInJsonObjectMode) {
  auto vocab = test::qwen3_vocab();
  auto g = json_object_grammar();
  TokenMasker masker(g, vocab);
  for (const char* prefix : {"", "{", R"({"k": [1, {"a": tr)", R"({"k": [1, {"a": "x\u)", R"({"k": -1.5e)",
                             R"({"k": [])", R"({"k": []})"}) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    EXPECT_GT(check_mask_brute_force(masker, m), 0u) << prefix;
  }
}

TEST(TokenMask, RollbackRestoresTheMask) {
  auto vocab = test::qwen3_vocab();
  const Tokenizer& tok = test::qwen3_tokenizer();
  auto g = compile_json_schema(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  TokenMasker masker(g, vocab);
  GrammarMatcher m(g);
  std::vector<uint32_t> before = masker.mask(m);
  for (TokenId id : tok.encode(R"({"n": 12})")) ASSERT_TRUE(masker.accept_token(m, id)) << id;
  EXPECT_TRUE(m.can_end());
  m.rollback(m.num_checkpoints());
  EXPECT_EQ(masker.mask(m), before);
  EXPECT_FALSE(m.can_end());
}

TEST(TokenMask, EosOnlyWhenTheGrammarCanEnd) {
  auto vocab = test::qwen3_vocab();
  auto g = compile_json_schema(R"({"type":"integer"})");
  TokenMasker masker(g, vocab);
  GrammarMatcher m(g);
  int32_t eos = vocab->eos_ids()[0];
  EXPECT_FALSE(bit(masker.mask(m), eos));
  ASSERT_TRUE(m.accept_bytes("12"));
  std::vector<uint32_t> mask = masker.mask(m);
  EXPECT_TRUE(bit(mask, eos));
  EXPECT_TRUE(bit(mask, *test::qwen3_tokenizer().token_to_id("3")));
  EXPECT_FALSE(bit(mask, *test::qwen3_tokenizer().token_to_id("a")));
  EXPECT_FALSE(bit(mask, *test::qwen3_tokenizer().token_to_id("<|im_start|>")));  // special: never text
  ASSERT_TRUE(masker.accept_token(m, eos));
  EXPECT_TRUE(m.is_terminated());
  mask = masker.mask(m);
  EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }));
}

TEST(TokenMask, PaddedVocabularyAndApply) {
  // A toy vocabulary, padded to 70 rows: rows 5..69 have no token and are never allowed.
  auto vocab = std::make_shared<const TokenVocabulary>(std::vector<std::string>{"tr", "ue", "true", "f", ""},
                                                       std::vector<int32_t>{4}, 70);
  auto g = compile_json_schema(R"({"type":"boolean"})");
  TokenMasker masker(g, vocab);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask = masker.mask(m);
  ASSERT_EQ(mask.size(), 3u);
  EXPECT_EQ(mask[0], 0b01101u);  // "tr", "true", "f"
  EXPECT_EQ(mask[1], 0u);
  EXPECT_EQ(mask[2], 0u);
  std::vector<float> logits(70, 1.0f);
  apply_token_mask(logits, mask);
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(logits[69], -std::numeric_limits<float>::infinity());
  ASSERT_TRUE(masker.accept_token(m, 0));
  mask = masker.mask(m);
  EXPECT_EQ(mask[0], 0b00010u);  // "ue"
  ASSERT_TRUE(masker.accept_token(m, 1));
  EXPECT_EQ(masker.mask(m)[0], 0b10000u);  // only EOS
}

}  // namespace
}  // namespace flashnext::grammar
