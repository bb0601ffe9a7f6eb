// Server-sent events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html), as the OpenAI
// streaming API uses it: every chunk is one `data:` event carrying a JSON object, and the stream ends with
// `data: [DONE]`.
#pragma once

#include <string>
#include <string_view>

namespace flashnext::server {

/// One event whose data is `data`: each line of `data` becomes a `data: ` line ("\n", "\r\n" and "\r" all end a
/// line, as the spec reads them), and a blank line ends the event.
inline std::string sse_event(std::string_view data) {
  std::string out = "data: ";
  for (size_t i = 0; i < data.size(); ++i) {
    char c = data[i];
    if (c == '\r' || c == '\n') {
      if (c == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
      out += "\ndata: ";
    } else {
      out += c;
    }
  }
  out += "\n\n";
  return out;
}

/// The event that ends an OpenAI stream.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace flashnext::server
