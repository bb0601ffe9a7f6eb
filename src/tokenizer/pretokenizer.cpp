#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"

namespace flashnext::tokenizer_impl {

namespace {

// Unicode White_Space (what Oniguruma's \s matches in UTF-8 mode), as class members.
constexpr std::string_view kSpaceMembers =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
// Unicode word characters (Oniguruma's \w), as class members.
constexpr std::string_view kWordMembers = R"(\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D})";

// The GPT-2 pattern that ByteLevel uses when `use_regex` is true (tokenizers pre_tokenizers/byte_level.rs).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

namespace {

using unicode_tables::kBaseUnicodeVersion;
using unicode_tables::kUnicodeVersion;
using UnicodePropertyDelta = unicode_tables::PropertyDelta;

const UnicodePropertyDelta* property_delta(std::string_view name) {
  for (const auto& d : unicode_tables::kPropertyDeltas) {
    if (name == d.property) return &d;
  }
  return nullptr;
}

/// Throws Error unless PCRE2's Unicode tables are at least the baseline the delta tables start from.
void check_pcre2_unicode_version(std::string_view where) {
  char buf[32] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  int have[3] = {}, need[3] = {};
  std::sscanf(buf, "%d.%d.%d", &have[0], &have[1], &have[2]);
  std::sscanf(kBaseUnicodeVersion, "%d.%d.%d", &need[0], &need[1], &need[2]);
  if (std::lexicographical_compare(have, have + 3, need, need + 3))
    fail(
        "{}: PCRE2 here has Unicode {} tables; the tokenizer needs Unicode {} or later to reproduce the reference's "
        "character classes",
        where, buf, kBaseUnicodeVersion);
}

}  // namespace

std::string onig_to_pcre2(std::string_view pattern, std::string_view where) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  bool checked_version = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's' || e == 'w') {
        const std::string_view members = e == 's' ? kSpaceMembers : kWordMembers;
        if (in_class) {
          out += members;
        } else {
          out += '[';
          out += members;
          out += ']';
        }
      } else if (e == 'S' || e == 'W') {
        if (in_class) fail("{}: `\\{}` inside a character class is not supported (pattern {})", where, e, pattern);
        out += "[^";
        out += e == 'S' ? kSpaceMembers : kWordMembers;
        out += ']';
      } else if (e == 'p' || e == 'P') {
        // \p{X} / \pX for a general category: add the code points the reference's newer Unicode gives it.
        std::string_view name;
        size_t end = i;  // index of the last character of the escape
        if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
          const size_t close = pattern.find('}', i + 2);
          if (close == std::string_view::npos) fail("{}: unterminated \\{}{{ in pattern {}", where, e, pattern);
          name = pattern.substr(i + 2, close - i - 2);
          end = close;
        } else if (i + 1 < pattern.size()) {
          name = pattern.substr(i + 1, 1);
          end = i + 1;
        }
        const UnicodePropertyDelta* d = property_delta(name);
        const std::string escape = fmt::format("\\{}{{{}}}", e, name);
        if (!d || (!*d->added && !*d->removed)) {
          out += pattern.substr(i - 1, end - i + 2);
        } else {
          if (!checked_version) check_pcre2_unicode_version(where), checked_version = true;
          const bool negated = e == 'P';
          if (in_class && (negated || *d->removed))
            fail("{}: `{}` inside a character class cannot be adapted to Unicode {} (pattern {})", where, escape,
                 kUnicodeVersion, pattern);
          const std::string members = fmt::format("\\p{{{}}}{}", name, d->added);  // old set plus additions
          if (in_class) {
            out += members;
          } else if (!*d->removed) {
            out += fmt::format("[{}{}]", negated ? "^" : "", members);
          } else if (!negated) {
            out += fmt::format("(?:(?![{}])[{}])", d->removed, members);
          } else {
            out += fmt::format("(?:[{}]|[^{}])", d->removed, members);
          }
        }
        i = end;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out += pattern.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string where;
};

namespace {

/// Per-thread match data and JIT stack, shared by all patterns (neither is tied to one pattern).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!data || !context || !jit_stack) fail("PCRE2: out of memory creating match data");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal, std::string_view where) : impl_(std::make_unique<Impl>()) {
  impl_->where = std::string(where);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &err_offset, nullptr);
  if (!impl_->code) {
    fail("{}: PCRE2 cannot compile the pattern `{}` (at offset {}): {}", where, std::string(pattern), err_offset,
         pcre2_message(err));
  }
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  impl_->jit = have_jit && pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const size_t n = s.size();
  size_t search_from = 0;
  std::optional<size_t> last_match_end;
  while (search_from <= n) {
    const int rc = impl_->jit
                       ? pcre2_jit_match(impl_->code, subject, n, search_from, 0, st.data, st.context)
                       : pcre2_match(impl_->code, subject, n, search_from, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      fail("{}: PCRE2 match failed at byte {} of a {}-byte piece: {}", impl_->where, search_from, n, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (b == e && last_match_end == e) {
      // Oniguruma's find_iter: no empty match right after the previous match; step over one character.
      if (e >= n) break;
      search_from = e + unicode::utf8_step(s, e).len;
      continue;
    }
    out.emplace_back(b, e);
    search_from = e;
    last_match_end = e;
  }
}

namespace {

SplitBehavior parse_behavior(const nlohmann::json& j, std::string_view where) {
  const std::string b = j.is_string() ? j.get<std::string>() : std::string();
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  fail(
      "{}: pre_tokenizer Split has behavior {}; expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
      "Contiguous",
      where, j.dump());
}

bool json_bool(const nlohmann::json& obj, const char* key, bool fallback, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}: `{}` must be true or false, got {}", where, key, it->dump());
  return it->get<bool>();
}

}  // namespace

PreTokenizer::~PreTokenizer() = default;

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, std::string_view where) {
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  std::vector<const nlohmann::json*> items;
  if (!j.is_object()) fail("{}: `pre_tokenizer` must be an object, got {}", where, j.dump().substr(0, 80));
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) fail("{}: pre_tokenizer Sequence lacks the `pretokenizers` list", where);
    for (const auto& item : *it) items.push_back(&item);
  } else {
    items.push_back(&j);
  }
  bool byte_level = false;
  for (size_t k = 0; k < items.size(); ++k) {
    const nlohmann::json& item = *items[k];
    const std::string t = item.is_object() ? item.value("type", "") : "";
    const std::string item_where = fmt::format("{}: pre_tokenizer[{}] ({})", where, k, t);
    if (byte_level) fail("{}: only Split steps before a final ByteLevel step are supported", item_where);
    if (t == "Split") {
      Step step;
      auto pat = item.find("pattern");
      if (pat == item.end() || !pat->is_object()) fail("{}: missing `pattern` object", item_where);
      if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
        step.regex = std::make_unique<Regex>(onig_to_pcre2(r->get<std::string>(), item_where), false, item_where);
      } else if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
        step.regex = std::make_unique<Regex>(s->get<std::string>(), true, item_where);
      } else {
        fail("{}: `pattern` must be {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", item_where, pat->dump());
      }
      step.behavior = parse_behavior(item.value("behavior", nlohmann::json()), item_where);
      step.invert = json_bool(item, "invert", false, item_where);
      pt->steps_.push_back(std::move(step));
    } else if (t == "ByteLevel") {
      byte_level = true;
      pt->add_prefix_space_ = json_bool(item, "add_prefix_space", true, item_where);
      if (json_bool(item, "use_regex", true, item_where)) {
        pt->byte_regex_ = std::make_unique<Regex>(onig_to_pcre2(kGpt2Pattern, item_where), false, item_where);
      }
    } else {
      fail("{}: unsupported pre-tokenizer type; this engine handles byte-level BPE (Split and ByteLevel)", item_where);
    }
  }
  if (!byte_level) fail("{}: the pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", where);
  return pt;
}

namespace {

struct Range {
  size_t begin, end;
  bool match;
};

/// Applies one Split step to `piece` (tokenizers NormalizedString::split with a regex Pattern, optionally
/// inverted), appending the non-empty pieces to `out`.
void split_step(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view piece,
                std::vector<std::string_view>& out) {
  if (piece.empty()) return;
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  thread_local std::vector<Range> ranges, acc;
  matches.clear();
  regex.find_all(piece, matches);
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  };
  if (behavior == SplitBehavior::Isolated) {  // the common case, straight through
    size_t prev = 0;
    for (auto [b, e] : matches) {
      emit(prev, b);
      emit(b, e);
      prev = e;
    }
    emit(prev, piece.size());
    return;
  }
  ranges.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) ranges.push_back({prev, b, invert});
    ranges.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != piece.size()) ranges.push_back({prev, piece.size(), invert});
  acc.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Range& r : ranges) {
        if (!r.match) acc.push_back(r);
      }
      break;
    case SplitBehavior::Contiguous:
      for (const Range& r : ranges) {
        if (r.match == previous_match && !acc.empty()) {
          acc.back().end = r.end;
        } else {
          acc.push_back(r);
        }
        previous_match = r.match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.match && !previous_match && !acc.empty()) {
          acc.back().end = r.end;
        } else {
          acc.push_back(r);
        }
        previous_match = r.match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->match && !previous_match && !acc.empty()) {
          acc.back().begin = it->begin;
        } else {
          acc.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    case SplitBehavior::Isolated:
      break;
  }
  for (const Range& r : acc) emit(r.begin, r.end);
}

}  // namespace

void PreTokenizer::split_impl(std::string_view text, void (*fn)(void*, std::string_view), void* ctx) const {
  thread_local std::vector<std::string_view> cur, next;
  thread_local std::vector<std::pair<size_t, size_t>> byte_matches;
  thread_local std::string prefixed;
  cur.clear();
  if (!text.empty()) cur.push_back(text);
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view p : cur) split_step(*step.regex, step.behavior, step.invert, p, next);
    cur.swap(next);
  }
  for (std::string_view p : cur) {
    std::string_view q = p;
    if (add_prefix_space_ && q.front() != ' ') {
      prefixed.clear();
      prefixed.push_back(' ');
      prefixed.append(p);
      q = prefixed;
    }
    if (!byte_regex_) {
      fn(ctx, q);
      continue;
    }
    byte_matches.clear();
    byte_regex_->find_all(q, byte_matches);
    size_t prev = 0;
    for (auto [b, e] : byte_matches) {
      if (b > prev) fn(ctx, q.substr(prev, b - prev));
      if (e > b) fn(ctx, q.substr(b, e - b));
      prev = e;
    }
    if (q.size() > prev) fn(ctx, q.substr(prev));
  }
}

}  // namespace flashnext::tokenizer_impl
