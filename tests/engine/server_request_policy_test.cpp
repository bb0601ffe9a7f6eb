// Unknown request fields (server/openai_schema.h RequestPolicy, FieldLogger): 400 under a strict policy (the parse
// functions' default), ignored under a lenient one, with each name logged once and the logged set bounded.
#include <gtest/gtest.h>

#include "server/openai_schema.h"
#include "server_test_util.h"

namespace flashnext::server {
namespace {

using test::chat_body;
using test::expect_400;
using test::kVocab;



// The param of the ApiError(400) that `f` throws ("<none>" when it throws nothing).
template <class F>
std::string error_param(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("unknown field"), std::string::npos) << e.what();
    return e.param();
  }
  return "<none>";
}

TEST(RequestPolicy, StrictByDefaultAndWhenAsked) {
  const RequestPolicy strict{true, nullptr, ""};
  EXPECT_EQ(error_param([] { parse_chat_request(chat_body({{"foo", 1}}), {}, kVocab); }), "foo");
  EXPECT_EQ(error_param([&] { parse_chat_request(chat_body({{"foo", 1}}), {}, kVocab, strict); }), "foo");
  EXPECT_EQ(error_param([&] {
              parse_completion_request({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"bar", 1}}}}, {},
                                       kVocab, strict);
            }),
            "stream_options.bar");
  EXPECT_EQ(error_param([&] { parse_tokenize_request({{"prompt", "x"}, {"baz", 1}}, strict); }), "baz");
  EXPECT_EQ(error_param([&] { parse_detokenize_request({{"tokens", {1}}, {"qux", 1}}, kVocab, strict); }), "qux");
}

TEST(RequestPolicy, LenientIgnoresUnknownFieldsAndLogsEachNameOnce) {
  FieldLogger log;
  const RequestPolicy lenient{false, &log, "POST /v1/chat/completions request_id=r1"};
  const ApiRequest plain = parse_chat_request(chat_body({{"temperature", 0.5}}), {}, kVocab, lenient);
  const ApiRequest extra = parse_chat_request(
      chat_body({{"temperature", 0.5}, {"foo", {{"deep", {1, 2}}}}, {"guided_json", nullptr}}), {}, kVocab, lenient);
  EXPECT_EQ(extra.sampling.temperature, plain.sampling.temperature);
  EXPECT_EQ(extra.messages, plain.messages);
  parse_chat_request(chat_body({{"foo", 2}}), {}, kVocab, lenient);  // logged already
  const ApiRequest streamed = parse_completion_request(
      {{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", true}, {"bar", 1}}}, {"foo", 0}}, {},
      kVocab, lenient);
  EXPECT_TRUE(streamed.include_usage);
  parse_tokenize_request({{"prompt", "x"}, {"baz", 1}}, lenient);
  parse_detokenize_request({{"tokens", {1}}, {"qux", 1}}, kVocab, lenient);
  // A null value is "not given" for known fields; an unknown one is still an unknown name.
  EXPECT_EQ(log.logged(), (std::vector<std::string>{"foo", "guided_json", "stream_options.bar", "baz", "qux"}));
  // Known fields keep their checks.
  EXPECT_THROW(parse_chat_request(chat_body({{"temperature", "hot"}}), {}, kVocab, lenient), ApiError);
  // Without a logger: ignored silently.
  EXPECT_NO_THROW(parse_chat_request(chat_body({{"zzz", 1}}), {}, kVocab, RequestPolicy{false, nullptr, ""}));
}

TEST(RequestPolicy, TheLoggedSetIsBounded) {
  FieldLogger log;
  for (size_t i = 0; i < FieldLogger::kMaxNames; ++i) EXPECT_TRUE(log.note("f" + std::to_string(i)));
  EXPECT_FALSE(log.note("f0"));
  EXPECT_FALSE(log.note("one-too-many"));  // logs that no more names are logged
  EXPECT_FALSE(log.note("another"));
  EXPECT_EQ(log.logged().size(), FieldLogger::kMaxNames);
  // Long names are cut, so that distinct huge names cost a bounded amount each.
  FieldLogger cut;
  EXPECT_TRUE(cut.note(std::string(100000, 'z')));
  EXPECT_FALSE(cut.note(std::string(200000, 'z')));
  ASSERT_EQ(cut.logged().size(), 1u);
  EXPECT_LE(cut.logged()[0].size(), FieldLogger::kMaxNameBytes);
}

TEST(RequestPolicy, NestedCheckedObjectsFollowThePolicy) {
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  const json schema = {{"type", "json_schema"},
                       {"json_schema", {{"name", "s"}, {"schema", {{"type", "object"}}}, {"extra_js", 1}}},
                       {"extra_rf", 1}};
  const json named = {{"type", "function"}, {"function", {{"name", "f"}, {"extra_fn", 1}}}, {"extra_tc", 1}};
  EXPECT_EQ(error_param([&] {
              parse_chat_request(chat_body({{"response_format", schema}}), {}, kVocab);
            }),
            "response_format.extra_rf");
  EXPECT_EQ(error_param([&] {
              parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", named}}), {}, kVocab);
            }),
            "tool_choice.extra_tc");
  FieldLogger log;
  const RequestPolicy lenient{false, &log, ""};
  const ApiRequest a = parse_chat_request(chat_body({{"response_format", schema}}), {}, kVocab, lenient);
  EXPECT_EQ(a.response_format, ResponseFormat::JsonSchema);
  const ApiRequest b = parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", named}}), {}, kVocab, lenient);
  EXPECT_EQ(b.tool_choice, ToolChoice::Named);
  EXPECT_EQ(b.forced_tool, "f");
  EXPECT_EQ(log.logged(), (std::vector<std::string>{"response_format.extra_rf", "response_format.json_schema.extra_js",
                                                    "tool_choice.extra_tc", "tool_choice.function.extra_fn"}));
}

}  // namespace
}  // namespace flashnext::server
