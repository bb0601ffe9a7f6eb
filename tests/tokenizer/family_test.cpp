// The Qwen3.5-3.8 family tokenizer (248,320 rows; /work/shared/docs/ARTIFACTS.md section 4): the real file is not
// available, so this test builds a small tokenizer.json with the family's pre-tokenizer regex and its 33 added
// tokens, and checks the pre-tokenization that differs from Qwen3: combining marks (\p{M}) stay with their letters,
// digits split one by one, newline runs. Expected pieces are worked out from the regex by hand (the same strings are
// also compared with Hugging Face tokenizers on tests/data/tokenizer/family in reference_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace flashnext {
namespace {

using ::testing::ElementsAre;

// ARTIFACTS.md section 4, verbatim.
constexpr const char* kFamilyRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct FamilyAdded {
  TokenId id;
  const char* content;
  bool special;
};
// ARTIFACTS.md section 4: 248044-248057 special, 248058-248069 not, 248070-248076 special.
constexpr FamilyAdded kFamilyAdded[] = {
    {248044, "<|endoftext|>", true},      {248045, "<|im_start|>", true},
    {248046, "<|im_end|>", true},         {248047, "<|object_ref_start|>", true},
    {248048, "<|object_ref_end|>", true}, {248049, "<|box_start|>", true},
    {248050, "<|box_end|>", true},        {248051, "<|quad_start|>", true},
    {248052, "<|quad_end|>", true},       {248053, "<|vision_start|>", true},
    {248054, "<|vision_end|>", true},     {248055, "<|vision_pad|>", true},
    {248056, "<|image_pad|>", true},      {248057, "<|video_pad|>", true},
    {248058, "<tool_call>", false},       {248059, "</tool_call>", false},
    {248060, "<|fim_prefix|>", false},    {248061, "<|fim_middle|>", false},
    {248062, "<|fim_suffix|>", false},    {248063, "<|fim_pad|>", false},
    {248064, "<|repo_name|>", false},     {248065, "<|file_sep|>", false},
    {248066, "<tool_response>", false},   {248067, "</tool_response>", false},
    {248068, "<think>", false},           {248069, "</think>", false},
    {248070, "<|audio_start|>", true},    {248071, "<|audio_end|>", true},
    {248072, "<tts_pad>", true},          {248073, "<tts_text_bos>", true},
    {248074, "<tts_text_eod>", true},     {248075, "<tts_text_bos_single>", true},
    {248076, "<|audio_pad|>", true},
};

/// GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100.. in order.
std::string byte_char(int b) {
  static const std::vector<char32_t> map = [] {
    std::vector<char32_t> m(256);
    char32_t next = 256;
    for (int x = 0; x < 256; ++x) {
      const bool direct = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      m[x] = direct ? char32_t(x) : next++;
    }
    return m;
  }();
  std::string s;
  unicode::append_utf8(s, map[b]);
  return s;
}

/// The small family tokenizer.json: 256 byte tokens, one merge ("1" + "2", which the digit rule must never let
/// apply), NFC, Split(family regex) + ByteLevel, and the 33 added tokens. The added tokens are also listed in
/// model.vocab at their ids, so that the reference library keeps those ids with a 257-entry vocabulary.
std::string family_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["12"] = 256;
  nlohmann::json added = nlohmann::json::array();
  for (const auto& a : kFamilyAdded) {
    vocab[a.content] = a.id;
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", a.special}});
  }
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         nlohmann::json::array(
             {{{"type", "Split"}, {"pattern", {{"Regex", kFamilyRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
              byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({nlohmann::json::array({"1", "2"})})}}},
  };
  return j.dump();
}

const Tokenizer& family() {
  static const Tokenizer tok = Tokenizer::from_json(family_json(), "family test tokenizer.json");
  return tok;
}

TEST(FamilyRegex, CombiningMarksStayWithTheirLetters) {
  const Tokenizer& tok = family();
  // Devanagari vowel signs and virama are \p{M} (Mn / Mc): one piece per word.
  EXPECT_THAT(tok.pre_tokenize("नमस्ते दुनिया"), ElementsAre("नमस्ते", " दुनिया"));
  // Thai vowel and tone marks.
  EXPECT_THAT(tok.pre_tokenize("กิน ข้าว"), ElementsAre("กิน", " ข้าว"));
  // A mark after a space: the space is the optional prefix, the mark starts the letter run.
  EXPECT_THAT(tok.pre_tokenize(" \u0301a"), ElementsAre(" \u0301a"));
  EXPECT_THAT(tok.pre_tokenize("x \u0308y"), ElementsAre("x", " \u0308y"));
  // Marks alone form a piece.
  EXPECT_THAT(tok.pre_tokenize("\u0301\u0301"), ElementsAre("\u0301\u0301"));
  // NFC first: a + U+0301 becomes U+00E1, U+0302 stays a mark and stays in the piece.
  EXPECT_THAT(tok.pre_tokenize("a\u0301\u0302b"), ElementsAre("\u00e1\u0302b"));
  EXPECT_THAT(tok.pre_tokenize("ab\u0300\u0301cd"), ElementsAre("ab\u0300\u0301cd"));
}

TEST(FamilyRegex, QwenThreeRegexSplitsMarksInstead) {
  // The Qwen3 regex has \p{L}+ without \p{M}: the virama starts a new piece, the last vowel sign is "other".
  EXPECT_THAT(test::qwen3().pre_tokenize("नमस्ते"), ElementsAre("नमस", "्त", "े"));
}

TEST(FamilyRegex, DigitsSplitOneByOne) {
  const Tokenizer& tok = family();
  EXPECT_THAT(tok.pre_tokenize("12345"), ElementsAre("1", "2", "3", "4", "5"));
  EXPECT_THAT(tok.pre_tokenize(" 2024"), ElementsAre(" ", "2", "0", "2", "4"));
  EXPECT_THAT(tok.pre_tokenize("3.14"), ElementsAre("3", ".", "1", "4"));
  EXPECT_THAT(tok.pre_tokenize("a1b2"), ElementsAre("a", "1", "b", "2"));
  EXPECT_THAT(tok.pre_tokenize("٣٤٥"), ElementsAre("٣", "٤", "٥"));
  // The merge "1" + "2" -> 256 exists, but never applies across pieces.
  const auto one = tok.token_to_id("1"), two = tok.token_to_id("2");
  ASSERT_TRUE(one && two);
  EXPECT_THAT(tok.encode("12"), ElementsAre(*one, *two));
  EXPECT_EQ(tok.token_to_id("12"), 256);
}

TEST(FamilyRegex, Newlines) {
  const Tokenizer& tok = family();
  EXPECT_THAT(tok.pre_tokenize("a\n\nb"), ElementsAre("a", "\n\n", "b"));
  EXPECT_THAT(tok.pre_tokenize("a \n b"), ElementsAre("a", " \n", " b"));
  EXPECT_THAT(tok.pre_tokenize("x.\n\ny"), ElementsAre("x", ".\n\n", "y"));
  EXPECT_THAT(tok.pre_tokenize("a\r\n\r\nb"), ElementsAre("a", "\r\n\r\n", "b"));
  EXPECT_THAT(tok.pre_tokenize("a   \n"), ElementsAre("a", "   \n"));
  EXPECT_THAT(tok.pre_tokenize("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(tok.pre_tokenize("\n\n\n"), ElementsAre("\n\n\n"));
  EXPECT_THAT(tok.pre_tokenize("end\n"), ElementsAre("end", "\n"));
}

TEST(FamilyRegex, AddedTokens) {
  const Tokenizer& tok = family();
  EXPECT_EQ(tok.vocab_size(), 248077);
  EXPECT_EQ(tok.added_tokens().size(), 33u);
  for (const auto& a : kFamilyAdded) {
    EXPECT_EQ(tok.token_to_id(a.content), a.id) << a.content;
    EXPECT_EQ(tok.is_special(a.id), a.special) << a.content;
    EXPECT_EQ(tok.encode(a.content), std::vector<TokenId>{a.id}) << a.content;
    // Not parsing special tokens leaves the others (e.g. <think>) recognised, as the reference does.
    const auto plain = tok.encode(a.content, /*parse_special=*/false);
    if (a.special) {
      EXPECT_EQ(plain.size(), std::string(a.content).size()) << a.content;  // one byte token per ASCII byte
    } else {
      EXPECT_EQ(plain, std::vector<TokenId>{a.id}) << a.content;
    }
  }
  EXPECT_THAT(tok.pre_tokenize("<|im_start|>user\n<think>\n"),
              ElementsAre("<|im_start|>", "user", "\n", "<think>", "\n"));
}

TEST(FamilyRegex, CommittedSyntheticTokenizerUsesTheSameRegex) {
  // tests/data/tokenizer/family/tokenizer.json (compared with Hugging Face tokenizers in reference_test.cpp) must
  // carry the regex and added tokens checked here.
  const nlohmann::json j = test::read_json("tests/data/tokenizer/family/tokenizer.json");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>(), kFamilyRegex);
  ASSERT_EQ(j["added_tokens"].size(), 33u);
  for (size_t k = 0; k < 33; ++k) {
    EXPECT_EQ(j["added_tokens"][k]["id"].get<int>(), kFamilyAdded[k].id);
    EXPECT_EQ(j["added_tokens"][k]["content"].get<std::string>(), kFamilyAdded[k].content);
    EXPECT_EQ(j["added_tokens"][k]["special"].get<bool>(), kFamilyAdded[k].special);
  }
}

}  // namespace
}  // namespace flashnext
