// HTTP-level policies of `flashnext serve` that do not depend on the HTTP library, so that they can be tested on
// their own: CORS (the rules of Starlette's CORSMiddleware, which vLLM's --allowed-origins / --allowed-methods /
// --allowed-headers / --allow-credentials configure), the X-Request-Id header, and the list syntax of those flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashnext::server {

/// Response headers, in the order they are to be sent.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

/// Cross-origin resource sharing (https://fetch.spec.whatwg.org/#http-cors-protocol), as vLLM configures FastAPI's
/// CORSMiddleware. With no allowed origin (the default) CORS is off: no response gets an Access-Control-* header
/// and OPTIONS requests are not answered as preflights, so a web page of another origin can neither read an answer
/// nor send a JSON POST (browsers preflight those; a form or text/plain POST without preflight gets 415).
struct CorsOptions {
  std::vector<std::string> allowed_origins;          ///< exact origins ("https://a.example"), or "*" for any
  std::vector<std::string> allowed_methods = {"*"};  ///< methods a preflight may ask for ("*": any)
  std::vector<std::string> allowed_headers = {"*"};  ///< request headers a preflight may ask for ("*": any)
  bool allow_credentials = false;  ///< send Access-Control-Allow-Credentials: true (cookies, HTTP auth)

  /// Whether any origin is allowed (CORS is on).
  bool enabled() const { return !allowed_origins.empty(); }
  /// Whether `origin` (the request's Origin header) may read responses.
  bool origin_allowed(std::string_view origin) const;
};

/// The CORS headers for an actual (not preflight) request from `origin` ("" when the request has no Origin
/// header): none when CORS is off or the origin is not allowed; else Access-Control-Allow-Origin ("*" when every
/// origin is allowed without credentials; else the origin itself, with Vary: Origin) and, with credentials,
/// Access-Control-Allow-Credentials: true.
HeaderList cors_response_headers(const CorsOptions& cors, std::string_view origin);

/// Whether a request is a CORS preflight: OPTIONS with an Origin and an Access-Control-Request-Method header.
bool is_cors_preflight(std::string_view method, std::string_view origin, std::string_view request_method);

/// The answer to a preflight.
struct PreflightAnswer {
  int status = 200;     ///< 200 when allowed, else 400
  HeaderList headers;   ///< Access-Control-Allow-{Origin, Methods, Headers, Credentials}, Max-Age, Vary
  std::string failure;  ///< status 400: what was refused ("origin", "method", "headers", joined by ", ")
};

/// Answers a preflight from `origin` that asks for `request_method` and the comma-separated `request_headers`
/// (Access-Control-Request-Headers; header names compare case-insensitively). As Starlette does: the allowed
/// methods are listed ("*" expands to DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT), the allowed headers are the
/// configured ones plus the CORS-safelisted Accept, Accept-Language, Content-Language, Content-Type (or, with "*",
/// the requested ones), Access-Control-Max-Age is 600 s, and a refused origin, method or header gets 400 naming it.
PreflightAnswer cors_preflight(const CorsOptions& cors, std::string_view origin, std::string_view request_method,
                               std::string_view request_headers);

/// Parses the value of a list flag (--allowed-origins, --allowed-methods, --allowed-headers): a JSON array of
/// strings as vLLM takes it ('["https://a.example", "https://b.example"]'), or a comma-separated list
/// ("https://a.example,https://b.example"; items trimmed, empty ones dropped). Throws Error naming `flag` when the
/// text starts with '[' but is not a JSON array of strings.
std::vector<std::string> parse_list_flag(std::string_view text, std::string_view flag);

/// A request refused on its headers, before its body is read: the status to answer and why (in English).
struct HeaderRefusal {
  int status = 0;
  std::string message;
};

/// Checks the headers of a POST before its body is read (each header's value, nullopt when absent): 415 unless
/// Content-Type is application/json (any case, parameters such as charset allowed; so that a web page cannot post
/// without a CORS preflight) or when a Content-Encoding other than identity is declared (bodies are not
/// decompressed); 411 with neither Content-Length nor Transfer-Encoding; 413 when Content-Length is over
/// `max_body_bytes` or is not a plain decimal number. nullopt: the body may be read.
std::optional<HeaderRefusal> check_post_headers(std::optional<std::string_view> content_type,
                                                std::optional<std::string_view> content_length,
                                                std::optional<std::string_view> transfer_encoding,
                                                std::optional<std::string_view> content_encoding,
                                                uint64_t max_body_bytes);

/// The most bytes of an X-Request-Id a client may send for it to be echoed.
inline constexpr size_t kMaxRequestIdBytes = 128;

/// The request id of a request whose X-Request-Id header is `header` ("" when absent): the header itself when it is
/// 1 to kMaxRequestIdBytes bytes of visible ASCII (0x21 to 0x7e: it goes into headers and log lines as it is);
/// otherwise a new random id of 32 hex digits (a UUID4's digits, as vLLM generates).
std::string request_id_for(std::string_view header);

/// A random 32-hex-digit id.
std::string random_request_id();

}  // namespace flashnext::server
