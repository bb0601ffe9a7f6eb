// Pre-tokenization of a Hugging Face tokenizer.json: the `Split` and `ByteLevel` pre-tokenizers (alone or in a
// `Sequence`), with the semantics of the `tokenizers` crate (pre_tokenizers/split.rs, byte_level.rs and
// NormalizedString::split). Regexes run on PCRE2 in UTF + UCP mode (JIT when available); the few places where the
// Oniguruma syntax of tokenizer.json differs from PCRE2 are translated (see `onig_to_pcre2`).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace flashnext::tokenizer_impl {

/// Rewrites an Oniguruma pattern (as written in tokenizer.json) into PCRE2 syntax with the same meaning:
/// `\s` / `\S` become the Unicode White_Space set and its complement (PCRE2's `\s` also matches U+180E, Oniguruma's
/// does not), `\w` / `\W` the Unicode word set (Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
/// Join_Control). Everything else is kept. Throws Error for `\S` or `\W` inside a character class.
std::string onig_to_pcre2(std::string_view pattern, std::string_view where);

/// A compiled PCRE2 pattern (UTF, UCP; JIT-compiled where the library supports it). Thread-safe: each thread keeps
/// its own match data.
class Regex {
 public:
  /// Compiles `pattern` (already PCRE2 syntax), or the literal string when `literal`. `where` names the pattern in
  /// errors. Throws Error when PCRE2 rejects it.
  Regex(std::string_view pattern, bool literal, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Byte ranges [begin, end) of the successive non-overlapping matches in valid UTF-8 `s`, searched left to right
  /// like Oniguruma's find_iter (an empty match right after the previous match is skipped). Appends to `out`.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// How a Split step treats the matches (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

/// The pre-tokenizer of a byte-level BPE tokenizer: zero or more Split steps, then ByteLevel (which may add a
/// prefix space and split with the GPT-2 regex). Pieces are byte ranges of the input (plus an optional leading
/// space from `add_prefix_space`).
class PreTokenizer {
 public:
  /// Parses the `pre_tokenizer` object of tokenizer.json (`where` is the file name for errors). Accepts Split,
  /// ByteLevel and a Sequence of them with ByteLevel last; throws Error for anything else.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& j, std::string_view where);
  ~PreTokenizer();

  /// Splits valid UTF-8 `text` into pre-tokens and calls `sink(std::string_view piece)` for each, in order. Empty
  /// pieces are dropped (as the reference does). A piece is a view of `text`, or of a temporary that lives until
  /// `sink` returns (when ByteLevel adds a prefix space).
  template <class Sink>
  void split(std::string_view text, Sink&& sink) const {
    split_impl(
        text, [](void* ctx, std::string_view piece) { (*static_cast<Sink*>(ctx))(piece); }, &sink);
  }

 private:
  struct Step {
    std::unique_ptr<Regex> regex;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
  };
  PreTokenizer() = default;
  void split_impl(std::string_view text, void (*fn)(void*, std::string_view), void* ctx) const;

  std::vector<Step> steps_;            // the Split steps, in order
  std::unique_ptr<Regex> byte_regex_;  // ByteLevel with use_regex: the GPT-2 pattern (Isolated)
  bool add_prefix_space_ = false;      // ByteLevel: prepend ' ' to each piece that does not start with one
};

}  // namespace flashnext::tokenizer_impl
