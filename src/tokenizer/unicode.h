// UTF-8 and Unicode helpers of the tokenizer: decoding with the Unicode "maximal subpart" error rule, replacement of
// invalid sequences by U+FFFD (exactly what Python's `bytes.decode("utf-8", errors="replace")` and Rust's
// `String::from_utf8_lossy` produce), the stable prefix used by the streaming detokenizer, NFC through utf8proc, and
// the White_Space / word-character predicates that Hugging Face `tokenizers` uses for added tokens.
#pragma once

#include "core/utf8.h"
#include <cstddef>
#include <string>
#include <string_view>

namespace flashnext::unicode {

/// One step of UTF-8 decoding at a byte position (Unicode 15, section 3.9, table 3-7 "well-formed byte sequences").
struct Utf8Step {
  char32_t cp = 0;         ///< the code point when `valid`
  int len = 1;             ///< bytes consumed: the sequence, or the maximal subpart of an ill-formed one (>= 1)
  bool valid = false;      ///< a complete well-formed sequence
  bool truncated = false;  ///< ill-formed only because the input ends inside a sequence that could still complete
};

/// Decodes the sequence starting at `s[i]` (requires i < s.size()).
inline Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned b0 = p[i];
  if (b0 < 0x80) return {b0, 1, true, false};
  int need;                       // continuation bytes
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {0, 1, false, false};  // 80..C1, F5..FF never start a sequence
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return {0, k, false, true};
    const unsigned b = p[i + k];
    if (b < lo || b > hi) return {0, k, false, false};
    cp = (cp << 6) | (b & 0x3F);
    lo = 0x80, hi = 0xBF;
  }
  return {cp, need + 1, true, false};
}

/// True when all of `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

/// `s` with every maximal subpart of an ill-formed sequence replaced by one U+FFFD (EF BF BD); a valid input is
/// returned unchanged.
std::string replace_invalid_utf8(std::string_view s);

/// Length of the longest prefix of `s` whose lossy decoding can no longer change when more bytes are appended: all
/// of `s` except a trailing truncated sequence (at most 3 bytes).
size_t utf8_stable_prefix(std::string_view s);

using ::flashnext::append_utf8;  // core/utf8.h

/// Byte offset of the first character of valid UTF-8 `s` from which NFC might change the text, or npos when `s`
/// is certainly in NFC already (every character is a composition boundary, see nfc()).
size_t nfc_quick_check(std::string_view s);

/// Canonical composition (NFC) of valid UTF-8 `s`, through utf8proc. Runs of characters that NFC cannot change
/// (combining class 0, no decomposition, never the second half of a composition) are copied as they are, so that
/// ASCII, CJK and most other text costs one table look-up per character.
std::string nfc(std::string_view s);

/// Unicode White_Space property (what Rust's `char::is_whitespace` and regex `\s` match).
bool is_white_space(char32_t cp);

/// Rust regex `\w` (Unicode Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control), approximated
/// with general categories L*, M*, Nd, Nl, Pc plus U+200C/U+200D. Used for the `single_word` flag of added tokens.
bool is_word_char(char32_t cp);

}  // namespace flashnext::unicode
