// Token ids given on the command line (`logits --ids`, `perplexity --ids`).
#pragma once

#include <charconv>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace flashnext::cli {

/// "1,2, 3" -> {1, 2, 3} (spaces around entries allowed). Throws Error naming `flag` and the bad entry for anything
/// that is not an int32 integer, including an empty entry ("1,,2", "1,2,"). A text of spaces alone gives no ids.
inline std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  if (text.find_first_not_of(" \t") == std::string::npos) return ids;
  size_t pos = 0;
  for (;;) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < INT32_MIN || v > INT32_MAX) {
      fail("{}: '{}' is not a token id (expected comma-separated integers, e.g. 1,2,3)", flag, item);
    }
    ids.push_back(int32_t(v));
    if (end == text.size()) return ids;
    pos = end + 1;
  }
}

}  // namespace flashnext::cli
