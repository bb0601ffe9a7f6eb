// Stop strings on streamed text (vLLM semantics): the output stops at the first occurrence of any stop string in
// the detokenized text; the stop string itself is not emitted (unless asked) and neither is anything after it.
// Text that could still be the start of a stop string is held back until the next piece decides it, so a stop
// string split across tokens is never half-emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashnext {

/// Incremental stop-string matcher for one sequence. Works on bytes; when the pieces fed are whole UTF-8
/// characters and the stop strings are valid UTF-8, every emitted chunk is valid UTF-8 too (a held-back suffix
/// always starts where a stop string starts).
class StopStringMatcher {
 public:
  /// `stops`: non-empty strings (an empty one throws Error). `include_stop`: emit the matched stop string.
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string text;      ///< text that is now safe to emit (may be empty)
    bool stopped = false;  ///< a stop string matched: `text` is the last output, feed no more
    int matched = -1;      ///< index in `stops` of the matched stop string, -1 when none
  };

  /// Appends a newly decoded piece. On a match, the earliest occurrence (in text order) wins; among stop strings
  /// starting at the same place, the longest (a stop string that is a prefix of another can only ever win if it
  /// completes first, so this only matters within one piece). Throws Error when called after a stop.
  Result feed(std::string_view piece);
  /// Ends the stream without a match (EOS, max tokens): returns the held-back text.
  std::string flush();

  /// Bytes currently held back.
  size_t held() const { return pending_.size(); }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  bool stopped_ = false;
  std::string pending_;  // text not yet emitted: a possible stop-string prefix, or (inside feed) new text
};

}  // namespace flashnext
