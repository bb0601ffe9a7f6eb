#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "tokenizer/unicode_tables.h"

namespace flashnext::unicode {

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(s, i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step st = utf8_step(s, i);
    if (st.valid) {
      out.append(s.data() + i, st.len);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.len;
  }
  return out;
}

size_t utf8_stable_prefix(std::string_view s) {
  // A truncated sequence is at most 3 bytes long, so only the last few steps matter. Every byte that is not a
  // continuation byte (80..BF) starts a step of the left-to-right decoding (no sequence or maximal subpart can
  // contain it past its first byte), so decoding may start at the last such byte before the final 4.
  const size_t n = s.size();
  size_t i = n > 4 ? n - 4 : 0;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  while (i < n) {
    const Utf8Step st = utf8_step(s, i);
    if (st.truncated) return i;
    i += st.len;
  }
  return n;
}

namespace {

constexpr char32_t kMaxCp = 0x110000;

/// Full NFC of a valid UTF-8 chunk through utf8proc.
void nfc_chunk(std::string_view chunk, std::string& out) {
  utf8proc_uint8_t* res = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(chunk.data()), static_cast<utf8proc_ssize_t>(chunk.size()),
                   &res, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) fail("NFC normalization failed: {}", utf8proc_errmsg(len));
  out.append(reinterpret_cast<const char*>(res), static_cast<size_t>(len));
  std::free(res);
}

/// Per code point: whether NFC leaves it alone wherever it stands and whether it ends any composition before it
/// ("boundary": canonical combining class 0, NFC(c) == c, never the second character of a primary composite, what
/// Unicode calls NFC_Quick_Check = Yes with ccc = 0), and whether it is "opaque": a character whose NFC data the
/// reference normalizer lacks (unicode_tables::kNfcOpaque), which must act as an unassigned character (a boundary
/// that also never composes with what follows). Built once from utf8proc's data.
class NfcBoundary {
 public:
  NfcBoundary() : boundary_(kMaxCp / 64, ~uint64_t{0}), opaque_(kMaxCp / 64, 0) {
    std::vector<char32_t> seconds;
    utf8proc_int32_t buf[32];
    for (char32_t cp = 0x80; cp < kMaxCp; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      if (p->combining_class != 0) clear(cp);
      const bool hangul = cp >= 0xAC00 && cp <= 0xD7A3;
      const bool canonical = p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
      if (!hangul && !canonical) continue;
      int last_bound = 0;
      const utf8proc_ssize_t n =
          utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32, UTF8PROC_DECOMPOSE, &last_bound);
      if (n <= 0 || n > 32) continue;
      std::string one, composed;
      append_utf8(one, cp);
      nfc_chunk(one, composed);
      if (composed != one) {
        clear(cp);  // a singleton or an excluded composite: NFC replaces it
      } else if (n >= 2) {
        seconds.push_back(static_cast<char32_t>(buf[n - 1]));  // the last character of a primary composite
      }
    }
    for (char32_t cp : seconds) clear(cp);
    for (const auto& range : unicode_tables::kNfcOpaque) {
      for (char32_t cp = range[0]; cp <= range[1]; ++cp) {
        boundary_[cp >> 6] |= uint64_t{1} << (cp & 63);
        opaque_[cp >> 6] |= uint64_t{1} << (cp & 63);
      }
    }
  }
  bool boundary(char32_t cp) const { return cp < 0x80 || ((boundary_[cp >> 6] >> (cp & 63)) & 1) != 0; }
  bool opaque(char32_t cp) const { return cp >= 0x80 && ((opaque_[cp >> 6] >> (cp & 63)) & 1) != 0; }

 private:
  void clear(char32_t cp) { boundary_[cp >> 6] &= ~(uint64_t{1} << (cp & 63)); }
  std::vector<uint64_t> boundary_, opaque_;
};

const NfcBoundary& nfc_boundary() {
  static const NfcBoundary table;
  return table;
}

}  // namespace

size_t nfc_quick_check(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  if (i == s.size()) return std::string_view::npos;
  const NfcBoundary& table = nfc_boundary();
  while (i < s.size()) {
    const Utf8Step st = utf8_step(s, i);
    if (!st.valid || !table.boundary(st.cp)) return i;
    i += st.len;
  }
  return std::string_view::npos;
}

std::string nfc(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  if (i == s.size()) return std::string(s);
  const NfcBoundary& table = nfc_boundary();
  std::string out;
  out.reserve(s.size());
  size_t copied = 0;  // s[0, copied) is already in `out`
  size_t prev = 0;    // start of the previous character (a boundary) when prev_ok
  bool prev_ok = false;
  i = 0;
  while (i < s.size()) {
    const Utf8Step st = utf8_step(s, i);
    if (!st.valid) fail("NFC normalization: invalid UTF-8 at byte {}", i);
    if (table.boundary(st.cp)) {
      prev = i, prev_ok = !table.opaque(st.cp);  // an opaque character never composes with what follows
      i += st.len;
      continue;
    }
    // Normalize from the last boundary character (it may compose with what follows) to the next boundary.
    const size_t chunk_begin = prev_ok ? prev : i;
    size_t j = i + st.len;
    while (j < s.size()) {
      const Utf8Step nx = utf8_step(s, j);
      if (!nx.valid) fail("NFC normalization: invalid UTF-8 at byte {}", j);
      if (table.boundary(nx.cp)) break;
      j += nx.len;
    }
    out.append(s.data() + copied, chunk_begin - copied);
    nfc_chunk(s.substr(chunk_begin, j - chunk_begin), out);
    copied = j;
    prev_ok = false;
    i = j;
  }
  out.append(s.data() + copied, s.size() - copied);
  return out;
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace flashnext::unicode
