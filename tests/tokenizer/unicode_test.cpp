// UTF-8 decoding and replacement (Unicode 15 section 3.9, tables 3-7 and 3-8), NFC (the fast path against
// utf8proc's full normalization, and examples from UAX #15), White_Space, and the Oniguruma -> PCRE2 pattern
// translation and match iteration of the pre-tokenizer.
#include "tokenizer/unicode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>

#include "core/error.h"
#include "tok_test_util.h"
#include "tokenizer/pretokenizer.h"

namespace flashnext {
namespace {

using test::from_hex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Utf8, WellFormedSequencesOfTable37) {
  struct Case {
    const char* hex;
    char32_t cp;
  };
  for (const Case& c : {Case{"00", 0}, Case{"7f", 0x7F}, Case{"c280", 0x80}, Case{"dfbf", 0x7FF}, Case{"e0a080", 0x800},
                        Case{"e0bfbf", 0xFFF}, Case{"e18080", 0x1000}, Case{"ecbfbf", 0xCFFF}, Case{"ed8080", 0xD000},
                        Case{"ed9fbf", 0xD7FF}, Case{"ee8080", 0xE000}, Case{"efbfbf", 0xFFFF},
                        Case{"f0908080", 0x10000}, Case{"f0bfbfbf", 0x3FFFF}, Case{"f1808080", 0x40000},
                        Case{"f3bfbfbf", 0xFFFFF}, Case{"f4808080", 0x100000}, Case{"f48fbfbf", 0x10FFFF}}) {
    const std::string s = from_hex(c.hex);
    const unicode::Utf8Step st = unicode::utf8_step(s, 0);
    EXPECT_TRUE(st.valid) << c.hex;
    EXPECT_EQ(st.cp, c.cp) << c.hex;
    EXPECT_EQ(st.len, static_cast<int>(s.size())) << c.hex;
  }
}

TEST(Utf8, IllFormedSequencesConsumeTheirMaximalSubpart) {
  struct Case {
    const char* hex;
    int len;
    bool truncated;
  };
  for (const Case& c :
       {Case{"80", 1, false}, Case{"c0af", 1, false}, Case{"c1bf", 1, false}, Case{"f5808080", 1, false},
        Case{"ff", 1, false}, Case{"e09f80", 1, false}, Case{"eda080", 1, false}, Case{"f08f8080", 1, false},
        Case{"f4908080", 1, false}, Case{"e2", 1, true}, Case{"e282", 2, true}, Case{"f09f98", 3, true},
        Case{"e22861", 1, false}, Case{"e28261", 2, false}, Case{"f09f9841", 3, false}, Case{"c2", 1, true}}) {
    const std::string s = from_hex(c.hex);
    const unicode::Utf8Step st = unicode::utf8_step(s, 0);
    EXPECT_FALSE(st.valid) << c.hex;
    EXPECT_EQ(st.len, c.len) << c.hex;
    EXPECT_EQ(st.truncated, c.truncated) << c.hex;
  }
}

TEST(Utf8, ReplacementFollowsTable38) {
  // Unicode 15 section 3.9, table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d
  EXPECT_EQ(unicode::replace_invalid_utf8(from_hex("61f18080e180c262806380bf64")),
            "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(unicode::replace_invalid_utf8("valid \u00e9\U0001F600"), "valid \u00e9\U0001F600");
  EXPECT_EQ(unicode::replace_invalid_utf8(from_hex("eda080")), "\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(unicode::replace_invalid_utf8(from_hex("f09f98")), "\uFFFD");              // truncated at the end
  EXPECT_TRUE(unicode::is_valid_utf8(""));
  EXPECT_FALSE(unicode::is_valid_utf8(from_hex("c0af")));
}

TEST(Utf8, StablePrefixHoldsOnlyATruncatedTail) {
  EXPECT_EQ(unicode::utf8_stable_prefix(""), 0u);
  EXPECT_EQ(unicode::utf8_stable_prefix("abc"), 3u);
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("61f09f98")), 1u);
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("61f09f9880")), 5u);
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("61e2")), 1u);
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("6180")), 2u);    // a lone continuation byte is final
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("61e241")), 3u);  // E2 followed by A is final
  EXPECT_EQ(unicode::utf8_stable_prefix(from_hex("808080e282")), 3u);
}

TEST(Nfc, ExamplesFromUax15) {
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");              // ANGSTROM SIGN is a singleton
  EXPECT_EQ(unicode::nfc("\u2126"), "\u03a9");              // OHM SIGN
  EXPECT_EQ(unicode::nfc("\u1e0b\u0323"), "\u1e0d\u0307");  // d + dot above + dot below: reordered, recomposed
  EXPECT_EQ(unicode::nfc("q\u0307\u0323"), "q\u0323\u0307");
  EXPECT_EQ(unicode::nfc("\u0958"), "\u0915\u093c");        // composition exclusion
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul L V T
  EXPECT_EQ(unicode::nfc("\uac00\u11a8"), "\uac01");        // Hangul LV + T
  EXPECT_EQ(unicode::nfc("\u0b47\u0b3e"), "\u0b4b");        // second element with combining class 0
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::nfc_quick_check("plain ascii \u4e2d\u6587"), std::string_view::npos);
  EXPECT_NE(unicode::nfc_quick_check("e\u0301"), std::string_view::npos);
}

TEST(Nfc, CharactersUnknownToTheReferenceNormalizerStayAsTheyAre) {
  // The reference normalizer has Unicode 9.0 tables: U+1DF6 (combining class 232, Unicode 10.0) is an unassigned
  // starter there, so it is not reordered after U+0345 (class 240), while U+0301 (230) is.
  EXPECT_EQ(unicode::nfc("a\u0345\u1df6"), "a\u0345\u1df6");
  EXPECT_EQ(unicode::nfc("a\u0345\u0301"), "\u00e1\u0345");  // reordered, then a + U+0301 composes
  // U+11935 U+11930 composes to U+11938 since Unicode 13.0, not in the reference.
  EXPECT_EQ(unicode::nfc("\U00011935\U00011930"), "\U00011935\U00011930");
  EXPECT_EQ(unicode::nfc("\U00011938"), "\U00011938");
}

std::string utf8proc_nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<const char*>(out));
  std::free(out);
  return r;
}

TEST(Nfc, FastPathEqualsFullNormalizationOfKnownCharacters) {
  // Random strings over characters chosen to interact: starters that compose, combining marks of several classes,
  // Hangul jamo and syllables, singletons, exclusions, class-0 second elements, CJK and ASCII.
  const std::vector<char32_t> pool = {'a',     'e',     'A',    'O',    'u',     ' ',    'x',    0x00e9, 0x00c5,
                                      0x0300,  0x0301,  0x0302, 0x0308, 0x0316,  0x0323, 0x0327, 0x0345, 0x0344,
                                      0x0340,  0x05b8,  0x05bc, 0x093c, 0x0915,  0x0958, 0x0b47, 0x0b3e, 0x0b56,
                                      0x0bc6,  0x0bbe,  0x0cc6, 0x0cd5, 0x1100,  0x1161, 0x11a8, 0xac00, 0xac01,
                                      0x212b,  0x2126,  0x1e0b, 0x1e69, 0x3099,  0x304b, 0x4e2d, 0xf900, 0x1d15e,
                                      0x1d165, 0x1d16e, 0x0e34, 0x0e48, 0x1f600, 0x05d0, 0x0627, 0x0653, 0x0654};
  std::mt19937 rng(12345);
  for (int n = 0; n < 20000; ++n) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) unicode::append_utf8(s, pool[rng() % pool.size()]);
    ASSERT_EQ(unicode::nfc(s), utf8proc_nfc(s)) << "input " << s;
  }
}

TEST(WhiteSpace, IsTheUnicodeWhiteSpaceProperty) {
  // PropList.txt White_Space: 0009..000D, 0020, 0085, 00A0, 1680, 2000..200A, 2028, 2029, 202F, 205F, 3000.
  std::vector<char32_t> ws;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (unicode::is_white_space(cp)) ws.push_back(cp);
  }
  EXPECT_THAT(
      ws, ElementsAre(0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                      0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000));
}

TEST(OnigToPcre2, TranslatesSpaceAndGeneralCategories) {
  using tokenizer_impl::onig_to_pcre2;
  const std::string space = R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  EXPECT_EQ(onig_to_pcre2(R"(\s+)", "t"), "[" + space + "]+");
  EXPECT_EQ(onig_to_pcre2(R"(\S)", "t"), "[^" + space + "]");
  EXPECT_EQ(onig_to_pcre2(R"([^\s])", "t"), "[^" + space + "]");
  EXPECT_EQ(onig_to_pcre2(R"(\p{Han}x\\s)", "t"), R"(\p{Han}x\\s)");  // other escapes stay
  EXPECT_EQ(onig_to_pcre2(R"([]\s])", "t"), "[]" + space + "]");      // a leading ] is a member
  // \p{L}: PCRE2's letters plus the letters added after Unicode 14 (Todhri U+105C0.. is one).
  const std::string l = onig_to_pcre2(R"(\p{L})", "t");
  EXPECT_EQ(l.rfind(R"([\p{L})", 0), 0u) << l;
  EXPECT_THAT(l, HasSubstr(R"(\x{105C0}-\x{105F3})"));
  EXPECT_THROW(onig_to_pcre2(R"([\S])", "t"), Error);
  EXPECT_THROW(onig_to_pcre2(R"([\P{L}])", "t"), Error);
}

TEST(Regex, FindAllFollowsOnigurumaFindIter) {
  using tokenizer_impl::Regex;
  std::vector<std::pair<size_t, size_t>> m;
  // Empty matches: one per position, but none right after a previous match.
  Regex("x*", false, "t").find_all("abxxc", m);
  EXPECT_THAT(m, ElementsAre(std::pair<size_t, size_t>{0, 0}, std::pair<size_t, size_t>{1, 1},
                             std::pair<size_t, size_t>{2, 4}, std::pair<size_t, size_t>{5, 5}));
  m.clear();
  Regex("a.", true, "t").find_all("xa.ya.a.", m);  // literal
  EXPECT_THAT(m, ElementsAre(std::pair<size_t, size_t>{1, 3}, std::pair<size_t, size_t>{4, 6},
                             std::pair<size_t, size_t>{6, 8}));
  EXPECT_THROW(Regex("(unclosed", false, "t"), Error);
}

}  // namespace
}  // namespace flashnext
