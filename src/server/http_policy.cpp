#include "server/http_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "server/ids.h"

namespace flashnext::server {

namespace {

// The methods "*" stands for, and the request headers every preflight may ask for (Starlette's lists).
const std::vector<std::string> kAllMethods = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
const std::vector<std::string> kSafelistedHeaders = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// The headers for an allowed origin, shared by preflights and actual requests.
void add_origin_headers(const CorsOptions& cors, std::string_view origin, HeaderList& out) {
  // "*" cannot be used with credentials (browsers refuse it): the origin is named then.
  if (contains(cors.allowed_origins, "*") && !cors.allow_credentials) {
    out.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    out.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    out.emplace_back("Vary", "Origin");
  }
  if (cors.allow_credentials) out.emplace_back("Access-Control-Allow-Credentials", "true");
}

}  // namespace

bool CorsOptions::origin_allowed(std::string_view origin) const {
  if (origin.empty()) return false;
  return contains(allowed_origins, "*") || contains(allowed_origins, origin);
}

HeaderList cors_response_headers(const CorsOptions& cors, std::string_view origin) {
  HeaderList out;
  if (cors.origin_allowed(origin)) add_origin_headers(cors, origin, out);
  return out;
}

bool is_cors_preflight(std::string_view method, std::string_view origin, std::string_view request_method) {
  return method == "OPTIONS" && !origin.empty() && !request_method.empty();
}

PreflightAnswer cors_preflight(const CorsOptions& cors, std::string_view origin, std::string_view request_method,
                               std::string_view request_headers) {
  PreflightAnswer a;
  std::vector<std::string> failures;
  if (cors.origin_allowed(origin))
    add_origin_headers(cors, origin, a.headers);
  else
    failures.push_back("origin");

  std::vector<std::string> methods;
  if (contains(cors.allowed_methods, "*")) {
    methods = kAllMethods;
  } else {
    for (const auto& m : cors.allowed_methods) methods.push_back(upper(m));
  }
  a.headers.emplace_back("Access-Control-Allow-Methods", join(methods));
  if (!contains(methods, upper(trim(request_method)))) failures.push_back("method");

  const bool any_header = contains(cors.allowed_headers, "*");
  if (any_header) {
    if (!trim(request_headers).empty())
      a.headers.emplace_back("Access-Control-Allow-Headers", std::string(trim(request_headers)));
  } else {
    std::vector<std::string> allowed = kSafelistedHeaders;
    for (const auto& h : cors.allowed_headers) {
      bool dup = false;
      for (const auto& a2 : allowed) dup = dup || lower(a2) == lower(h);
      if (!dup) allowed.push_back(h);
    }
    std::sort(allowed.begin(), allowed.end());
    a.headers.emplace_back("Access-Control-Allow-Headers", join(allowed));
    std::set<std::string> allowed_lower;
    for (const auto& h : allowed) allowed_lower.insert(lower(h));
    std::string_view rest = request_headers;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = trim(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (!item.empty() && !allowed_lower.count(lower(item))) {
        failures.push_back("headers");
        break;
      }
    }
  }
  a.headers.emplace_back("Access-Control-Max-Age", "600");
  if (!failures.empty()) {
    a.status = 400;
    a.failure = join(failures);
  }
  return a;
}

std::vector<std::string> parse_list_flag(std::string_view text, std::string_view flag) {
  std::vector<std::string> out;
  const std::string_view t = trim(text);
  if (!t.empty() && t.front() == '[') {
    nlohmann::json j = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) fail("{}: '{}' is not a JSON array of strings", flag, std::string(t.substr(0, 200)));
    for (const auto& v : j) {
      if (!v.is_string()) fail("{}: '{}' is not a JSON array of strings", flag, std::string(t.substr(0, 200)));
      const std::string_view s = trim(v.get_ref<const std::string&>());
      if (!s.empty()) out.emplace_back(s);
    }
    return out;
  }
  std::string_view rest = t;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (!item.empty()) out.emplace_back(item);
  }
  return out;
}

std::optional<HeaderRefusal> check_post_headers(std::optional<std::string_view> content_type,
                                                std::optional<std::string_view> content_length,
                                                std::optional<std::string_view> transfer_encoding,
                                                std::optional<std::string_view> content_encoding,
                                                uint64_t max_body_bytes) {
  const std::string type = lower(trim(content_type.value_or("").substr(0, content_type.value_or("").find(';'))));
  if (type != "application/json")
    return HeaderRefusal{415, fmt::format("POST bodies must have Content-Type application/json, got \"{}\"",
                                          content_type.value_or("").substr(0, 80))};
  if (content_encoding && lower(trim(*content_encoding)) != "identity")
    return HeaderRefusal{415, fmt::format("Content-Encoding \"{}\" is not supported: send the body uncompressed",
                                          content_encoding->substr(0, 40))};
  if (!content_length && !transfer_encoding)
    return HeaderRefusal{411, "a POST needs a Content-Length header (or chunked Transfer-Encoding)"};
  if (content_length) {
    // Not a plain decimal number, or one that overflows: fails the size check.
    uint64_t n = 0;
    bool number = !content_length->empty() && content_length->size() <= 19;
    for (char c : *content_length) {
      if (c < '0' || c > '9') number = false;
      if (number) n = n * 10 + uint64_t(c - '0');
    }
    if (!number || n > max_body_bytes)
      return HeaderRefusal{
          413, fmt::format("the request body is {} bytes, more than the {} this server accepts (--max-request-bytes)",
                           content_length->substr(0, 20), max_body_bytes)};
  }
  return std::nullopt;
}

std::string random_request_id() {
  return random_hex(32);
}

std::string request_id_for(std::string_view header) {
  const bool usable = !header.empty() && header.size() <= kMaxRequestIdBytes &&
                      std::all_of(header.begin(), header.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
  return usable ? std::string(header) : random_request_id();
}

}  // namespace flashnext::server
