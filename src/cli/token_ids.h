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
/// that is not an int32 integer, including an empty entry between commas. An empty text gives no ids.
inline std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty() || end < text.size()) {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < INT32_MIN || v > INT32_MAX) {
        fail("{}: '{}' is not a token id (expected comma-separated integers, e.g. 1,2,3)", flag, item);
      }
      ids.push_back(int32_t(v));
    }
    pos = end + 1;
  }
  return ids;
}

}  // namespace flashnext::cli
