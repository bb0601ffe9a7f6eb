// IncrementalDecoder: ids fed one by one give text as soon as it is complete, never a broken UTF-8 sequence, never a
// character twice, and the pieces add up to decode(all ids). Expected texts follow from UTF-8 (Unicode section 3.9)
// and from the reference decodes in reference_cases.json.
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace flashnext {
namespace {

/// Id of the single-byte token for each byte value (the 256 ByteLevel tokens of the Qwen3 vocabulary).
std::vector<TokenId> byte_tokens(const Tokenizer& tok) {
  std::vector<TokenId> ids(256, -1);
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    const std::string_view b = tok.token_bytes(id);
    if (b.size() == 1 && !tok.added_token(id)) ids[static_cast<unsigned char>(b[0])] = id;
  }
  for (int b = 0; b < 256; ++b) EXPECT_GE(ids[b], 0) << "no token for byte " << b;
  return ids;
}

TEST(IncrementalDecoder, HoldsBytesUntilTheCharacterIsComplete) {
  const Tokenizer& tok = test::qwen3();
  const auto byte = byte_tokens(tok);
  IncrementalDecoder dec(tok);
  // U+1F600 is F0 9F 98 80.
  EXPECT_EQ(dec.push(byte[0xF0]), "");
  EXPECT_EQ(dec.pending_bytes(), 1u);
  EXPECT_EQ(dec.push(byte[0x9F]), "");
  EXPECT_EQ(dec.push(byte[0x98]), "");
  EXPECT_EQ(dec.pending_bytes(), 3u);
  EXPECT_EQ(dec.push(byte[0x80]), "\U0001F600");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  // ASCII comes out at once.
  EXPECT_EQ(dec.push(byte['a']), "a");
  EXPECT_EQ(dec.finish(), "");
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementCharactersWhereDecodePutsThem) {
  const Tokenizer& tok = test::qwen3();
  const auto byte = byte_tokens(tok);
  IncrementalDecoder dec(tok);
  // F0 then 'A': F0 can no longer start a sequence -> one U+FFFD, then A.
  EXPECT_EQ(dec.push(byte[0xF0]), "");
  EXPECT_EQ(dec.push(byte['A']), "\uFFFDA");
  // A lone continuation byte is replaced at once.
  EXPECT_EQ(dec.push(byte[0x80]), "\uFFFD");
  // E2 82 is a truncated sequence (the prefix of U+20AC): held, then one U+FFFD at the end of the stream.
  EXPECT_EQ(dec.push(byte[0xE2]), "");
  EXPECT_EQ(dec.push(byte[0x82]), "");
  EXPECT_EQ(dec.finish(), "\uFFFD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{byte[0xF0], byte['A'], byte[0x80], byte[0xE2], byte[0x82]}),
            "\uFFFDA\uFFFD\uFFFD");
  // The decoder is reusable after finish().
  EXPECT_EQ(dec.push(byte[0xE2]), "");
  EXPECT_EQ(dec.push(byte[0x82]), "");
  EXPECT_EQ(dec.push(byte[0xAC]), "\u20AC");
}

TEST(IncrementalDecoder, SkipsSpecialTokensWhenAsked) {
  const Tokenizer& tok = test::qwen3();
  const TokenId im_start = *tok.token_to_id("<|im_start|>");
  const TokenId think = *tok.token_to_id("<think>");  // an added token that is not special
  IncrementalDecoder keep(tok, false), skip(tok, true);
  EXPECT_EQ(keep.push(im_start), "<|im_start|>");
  EXPECT_EQ(skip.push(im_start), "");
  EXPECT_EQ(skip.push(think), "<think>");
}

TEST(IncrementalDecoder, EveryPrefixIsEmittedAsSoonAsItIsComplete) {
  // After each push, what was emitted is decode(prefix) exactly, except that a trailing incomplete character
  // (which decode() shows as one U+FFFD) is held back.
  const Tokenizer& tok = test::qwen3();
  size_t checked = 0;
  for (const auto& c : test::reference_cases()["tokenizers"]["qwen3"]["decode"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    IncrementalDecoder dec(tok);
    std::string emitted;
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::string piece = dec.push(ids[k]);
      ASSERT_TRUE(unicode::is_valid_utf8(piece));
      emitted += piece;
      const std::string prefix = tok.decode(std::span<const TokenId>(ids.data(), k + 1));
      EXPECT_EQ(prefix, dec.pending_bytes() ? emitted + "\uFFFD" : emitted) << c["ids"].dump() << " at " << k;
      ++checked;
    }
    emitted += dec.finish();
    EXPECT_EQ(emitted, c["decoded"].get<std::string>());
  }
  EXPECT_GT(checked, 300u);
}

}  // namespace
}  // namespace flashnext
