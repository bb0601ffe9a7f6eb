// Error type and checks used everywhere in flashnext.
//
// Every user-facing failure (bad file, bad config, bad request) throws flashnext::Error with a message that names
// the file, field or request and what was expected. The CLI prints the message and exits with status 1; the server
// turns it into an HTTP 400. Internal invariants use FN_CHECK, which also throws Error (never aborts), so a bad
// input can never take down a process that serves other requests.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace flashnext {

/// The one exception type flashnext throws for bad input and failed checks. `what()` is a complete sentence for
/// the user.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace flashnext

/// FN_CHECK(cond, fmt, args...): throws flashnext::Error with the formatted message when `cond` is false.
#define FN_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ::flashnext::fail(__VA_ARGS__); \
  } while (0)
