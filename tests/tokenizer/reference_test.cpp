// Comparison with Hugging Face `tokenizers` (tests/data/tokenizer/reference_cases.json, written by
// tools/tokenizer_reference.py): for the Qwen3 tokenizer, the synthetic Qwen3.5-3.8 family tokenizer and the
// synthetic added-token-flags tokenizer, every string's ids (special tokens parsed and not parsed), decoded text (with
// and without skip_special_tokens) and pre-tokenizer pieces; decoding of arbitrary id sequences (also streamed); and
// a sweep of every Unicode scalar value in several regex contexts, compared per block by an FNV-1a hash of the ids.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace flashnext {
namespace {

const nlohmann::json& entry(const std::string& name) {
  return test::reference_cases()["tokenizers"][name];
}

const Tokenizer& tokenizer(const std::string& name) {
  return test::tokenizer_at(entry(name)["path"]);
}

std::string case_input(const nlohmann::json& c) {
  return c.contains("hex") ? test::from_hex(c["hex"]) : c["text"].get<std::string>();
}

std::string describe(const nlohmann::json& c) {
  return c.contains("hex") ? "bytes " + c["hex"].get<std::string>() : "text " + c["text"].dump();
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, EncodeMatches) {
  const Tokenizer& tok = tokenizer(GetParam());
  const auto& cases = entry(GetParam())["cases"];
  ASSERT_GE(cases.size(), 300u);
  size_t invalid = 0;
  for (const auto& c : cases) {
    const std::string input = case_input(c);
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok.encode(input), ids) << describe(c);
    const auto plain = c.contains("ids_no_special") ? c["ids_no_special"].get<std::vector<TokenId>>() : ids;
    EXPECT_EQ(tok.encode(input, /*parse_special=*/false), plain) << describe(c);
    if (c.contains("hex")) {
      ++invalid;
      // The text the reference was given: Python's bytes.decode("utf-8", errors="replace").
      EXPECT_EQ(unicode::replace_invalid_utf8(input), test::from_hex(c["replaced_hex"])) << describe(c);
    }
  }
  EXPECT_GE(invalid, 40u);
}

TEST_P(Reference, DecodeMatches) {
  const Tokenizer& tok = tokenizer(GetParam());
  for (const auto& c : entry(GetParam())["cases"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    const std::string decoded = c["decoded"];
    EXPECT_EQ(tok.decode(ids), decoded) << describe(c);
    EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), c.value("decoded_skip", decoded)) << describe(c);
  }
  for (const auto& c : entry(GetParam())["decode"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>()) << c["ids"].dump();
  }
}

TEST_P(Reference, StreamingDecodeMatchesReferenceDecode) {
  const Tokenizer& tok = tokenizer(GetParam());
  auto check = [&](const nlohmann::json& c, const std::string& expected, bool skip) {
    IncrementalDecoder dec(tok, skip);
    std::string text;
    for (TokenId id : c["ids"].get<std::vector<TokenId>>()) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(unicode::is_valid_utf8(piece)) << c["ids"].dump();
      text += piece;
    }
    text += dec.finish();
    EXPECT_EQ(text, expected) << c["ids"].dump();
  };
  for (const auto& c : entry(GetParam())["decode"]) {
    check(c, c["decoded"], false);
    check(c, c["decoded_skip"], true);
  }
  for (const auto& c : entry(GetParam())["cases"]) check(c, c["decoded"], false);
}

// Only the tokenizers whose reference records pieces (tools/tokenizer_reference.py writes none for "flags", whose
// ByteLevel pre-tokenizer with add_prefix_space is covered by the sweep's pieces_fnv1a64 of every code point).
class ReferencePieces : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferencePieces, PreTokenizerPiecesMatch) {
  const Tokenizer& tok = tokenizer(GetParam());
  size_t n = 0;
  for (const auto& c : entry(GetParam())["cases"]) {
    if (!c.contains("pieces")) continue;
    ++n;
    EXPECT_EQ(tok.pre_tokenize(case_input(c)), c["pieces"].get<std::vector<std::string>>()) << describe(c);
  }
  EXPECT_GE(n, 300u);
}

/// Same construction as sweep_blocks(), fnv1a64() and fnv1a64_pieces() in tools/tokenizer_reference.py.
std::string sweep_block(uint32_t block) {
  std::string s;
  for (char32_t cp = block * 4096; cp < (block + 1) * 4096; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string c;
    unicode::append_utf8(c, cp);
    s += "x" + c + c + " " + c + "9" + c + "\u0316" + c + "\u0301\n";
  }
  return s;
}

uint64_t fnv1a64(std::string_view data, uint64_t h = 0xCBF29CE484222325ULL) {
  for (unsigned char b : data) {
    h ^= b;
    h *= 0x100000001B3ULL;
  }
  return h;
}

std::string ids_hash(const std::vector<TokenId>& ids) {
  std::string data;
  for (TokenId id : ids) {
    for (int k = 0; k < 4; ++k) data.push_back(static_cast<char>((static_cast<uint32_t>(id) >> (8 * k)) & 0xFF));
  }
  return fmt::format("{:016x}", fnv1a64(data));
}

std::string pieces_hash(const std::vector<std::string>& pieces) {
  std::string data;
  for (const std::string& p : pieces) data += p + '\xff';
  return fmt::format("{:016x}", fnv1a64(data));
}

class ReferenceSweep : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceSweep, EveryCodePointMatches) {
  const auto& sweep = entry(GetParam())["sweep"];
  const Tokenizer& tok = tokenizer(GetParam());
  ASSERT_EQ(sweep.size(), 272u);
  for (const auto& b : sweep) {
    const std::string text = sweep_block(b["block"]);
    const std::string where = fmt::format("code points U+{:04X}..+4095", b["block"].get<int>() * 4096);
    const std::vector<TokenId> ids = tok.encode(text);
    EXPECT_EQ(ids.size(), b["n"].get<size_t>()) << where;
    EXPECT_EQ(ids_hash(ids), b["ids_fnv1a64"].get<std::string>()) << where;
    const std::vector<std::string> pieces = tok.pre_tokenize(text);
    EXPECT_EQ(pieces.size(), b["n_pieces"].get<size_t>()) << where;
    EXPECT_EQ(pieces_hash(pieces), b["pieces_fnv1a64"].get<std::string>()) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Reference, ::testing::Values("qwen3", "family", "flags"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferencePieces, ::testing::Values("qwen3", "family"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceSweep, ::testing::Values("qwen3", "family", "flags"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flashnext
