// Errors of the OpenAI-compatible API: an HTTP status plus a message, sent in OpenAI's error schema
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": 400}}
// (`code` carries the HTTP status, as vLLM does).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace flashnext::server {

/// At most `max` bytes of `text`, with "..." when cut: for quoting request text in error messages.
inline std::string clip(std::string_view text, size_t max = 60) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max > 3 ? max - 3 : 0)) + "...";
}

/// Longest message and param an ApiError keeps: a backstop so that no error echoes unbounded request text.
inline constexpr size_t kMaxErrorMessage = 1024, kMaxErrorParam = 200;

/// An error to send to the client with `status` (400 bad request, 401 wrong API key, 404 unknown route or model, 405
/// a route of another method, 408 body too slow, 413 body too large, 415 not JSON, 503 full queue, 500 internal).
/// `param` names the offending request field ("" when none). Message and param are clipped to kMaxErrorMessage /
/// kMaxErrorParam bytes.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {})
      : Error(clip(message, kMaxErrorMessage)), status_(status), param_(clip(param, kMaxErrorParam)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

/// Throws ApiError(400) with a fmt-formatted message naming field `param`.
template <class... Args>
[[noreturn]] void bad_request(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), std::move(param));
}

/// OpenAI error `type` for an HTTP status: 401 "authentication_error", 404 "not_found_error", 503
/// "server_overloaded_error", any other client error (400, 408, 413, 414, 415, ...) "invalid_request_error",
/// everything else "internal_server_error".
inline const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 503:
      return "server_overloaded_error";
    default:
      return status >= 400 && status < 500 ? "invalid_request_error" : "internal_server_error";
  }
}

/// The error body for `status` and `message` (param null when empty; the message clipped to kMaxErrorMessage).
inline nlohmann::ordered_json error_body(int status, const std::string& message, const std::string& param = {}) {
  nlohmann::ordered_json e;
  e["message"] = clip(message, kMaxErrorMessage);
  e["type"] = error_type(status);
  e["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  e["code"] = status;
  return {{"error", std::move(e)}};
}

}  // namespace flashnext::server
