// CORS, X-Request-Id and list flags (server/http_policy.h), checked against Starlette's CORSMiddleware rules.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "server/http_policy.h"

namespace flashnext::server {
namespace {

// The value of header `name` in `h` ("<absent>" when it is not there).
std::string header(const HeaderList& h, const std::string& name) {
  auto it = std::find_if(h.begin(), h.end(), [&](auto& kv) { return kv.first == name; });
  return it == h.end() ? "<absent>" : it->second;
}

TEST(Cors, OffByDefault) {
  CorsOptions cors;
  EXPECT_FALSE(cors.enabled());
  EXPECT_TRUE(cors_response_headers(cors, "https://a.example").empty());
  EXPECT_EQ(cors_preflight(cors, "https://a.example", "POST", "").status, 400);
}

TEST(Cors, ExplicitOriginsAreEchoedWithVary) {
  CorsOptions cors;
  cors.allowed_origins = {"https://a.example", "http://localhost:3000"};
  EXPECT_TRUE(cors.enabled());
  const HeaderList h = cors_response_headers(cors, "https://a.example");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(header(h, "Vary"), "Origin");
  EXPECT_EQ(header(h, "Access-Control-Allow-Credentials"), "<absent>");
  EXPECT_TRUE(cors_response_headers(cors, "https://evil.example").empty());
  EXPECT_TRUE(cors_response_headers(cors, "").empty());                   // no Origin header: not a CORS request
  EXPECT_TRUE(cors_response_headers(cors, "https://A.example").empty());  // origins compare exactly
}

TEST(Cors, AnyOriginIsAStarUnlessCredentialsAreAllowed) {
  CorsOptions cors;
  cors.allowed_origins = {"*"};
  HeaderList h = cors_response_headers(cors, "https://x.example");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(h, "Vary"), "<absent>");
  cors.allow_credentials = true;  // "*" is not allowed with credentials: the origin is named
  h = cors_response_headers(cors, "https://x.example");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "https://x.example");
  EXPECT_EQ(header(h, "Vary"), "Origin");
  EXPECT_EQ(header(h, "Access-Control-Allow-Credentials"), "true");
}

TEST(Cors, PreflightWithDefaultMethodsAndHeaders) {
  EXPECT_TRUE(is_cors_preflight("OPTIONS", "https://a.example", "POST"));
  EXPECT_FALSE(is_cors_preflight("OPTIONS", "https://a.example", ""));
  EXPECT_FALSE(is_cors_preflight("OPTIONS", "", "POST"));
  EXPECT_FALSE(is_cors_preflight("POST", "https://a.example", "POST"));
  CorsOptions cors;
  cors.allowed_origins = {"https://a.example"};
  const PreflightAnswer a = cors_preflight(cors, "https://a.example", "POST", "content-type, authorization");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.failure, "");
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Headers"), "content-type, authorization");  // "*": mirrored
  EXPECT_EQ(header(a.headers, "Access-Control-Max-Age"), "600");
  const PreflightAnswer no_headers = cors_preflight(cors, "https://a.example", "GET", "");
  EXPECT_EQ(no_headers.status, 200);
  EXPECT_EQ(header(no_headers.headers, "Access-Control-Allow-Headers"), "<absent>");
  const PreflightAnswer bad = cors_preflight(cors, "https://evil.example", "POST", "");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.failure, "origin");
  EXPECT_EQ(header(bad.headers, "Access-Control-Allow-Origin"), "<absent>");
}

TEST(Cors, PreflightWithListedMethodsAndHeaders) {
  CorsOptions cors;
  cors.allowed_origins = {"*"};
  cors.allowed_methods = {"get", "POST"};
  cors.allowed_headers = {"Authorization", "X-Request-Id"};
  PreflightAnswer a = cors_preflight(cors, "https://a.example", "POST", "Content-Type,AUTHORIZATION, x-request-id");
  EXPECT_EQ(a.status, 200) << a.failure;
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(a.headers, "Access-Control-Allow-Headers"),
            "Accept, Accept-Language, Authorization, Content-Language, Content-Type, X-Request-Id");
  a = cors_preflight(cors, "https://a.example", "DELETE", "X-Other");
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.failure, "method, headers");
}

TEST(ListFlag, JsonOrCommaSeparated) {
  EXPECT_EQ(parse_list_flag(R"(["https://a.example", "http://b:8080"])", "--allowed-origins"),
            (std::vector<std::string>{"https://a.example", "http://b:8080"}));
  EXPECT_EQ(parse_list_flag(" https://a.example , http://b:8080,, ", "--allowed-origins"),
            (std::vector<std::string>{"https://a.example", "http://b:8080"}));
  EXPECT_EQ(parse_list_flag("*", "--allowed-methods"), (std::vector<std::string>{"*"}));
  EXPECT_EQ(parse_list_flag(R"(["*"])", "--allowed-headers"), (std::vector<std::string>{"*"}));
  EXPECT_TRUE(parse_list_flag("", "--allowed-origins").empty());
  EXPECT_TRUE(parse_list_flag("[]", "--allowed-origins").empty());
  EXPECT_THROW(parse_list_flag("[\"a\", 3]", "--allowed-origins"), Error);
  EXPECT_THROW(parse_list_flag("[\"a\"", "--allowed-origins"), Error);
}

TEST(RequestId, EchoedWhenUsableElseGenerated) {
  EXPECT_EQ(request_id_for("my-id-42"), "my-id-42");
  EXPECT_EQ(request_id_for(std::string(kMaxRequestIdBytes, 'a')), std::string(kMaxRequestIdBytes, 'a'));
  auto is_generated = [](const std::string& id) {
    return id.size() == 32 &&
           std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(c) && !std::isupper(c); });
  };
  for (const std::string& bad : {std::string(), std::string(kMaxRequestIdBytes + 1, 'a'), std::string("has space"),
                                 std::string("line\nbreak"), std::string("caf\xc3\xa9")})
    EXPECT_TRUE(is_generated(request_id_for(bad))) << bad;
  EXPECT_NE(random_request_id(), random_request_id());
}

}  // namespace
}  // namespace flashnext::server
