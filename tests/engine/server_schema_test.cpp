// OpenAI request schema: field types, ranges, defaults and the 400 errors (server/openai_schema.h).
#include <gtest/gtest.h>

#include "server/openai_schema.h"
#include "server_test_util.h"

namespace flashnext::server {
namespace {

using test::chat_body;
using test::expect_400;
using test::kVocab;


json chat(const json& extra = json::object()) {
  return chat_body(extra);
}


ApiRequest parse_chat(const json& body, SamplingParams defaults = {}) {
  return parse_chat_request(body, defaults, kVocab);
}

TEST(ServerSchema, MalformedBodies) {
  expect_400([] { parse_body("{\"model\": "); }, "", "not valid JSON");
  expect_400([] { parse_body("[1, 2]"); }, "", "must be a JSON object");
  expect_400([] { parse_body(""); }, "", "not valid JSON");
  EXPECT_EQ(parse_body("{\"a\": 1}")["a"], 1);
}

// `n` levels of `open` ... `close` around `inner` (a balanced nesting of arrays or objects).
std::string nest(int n, const std::string& open, const std::string& close, const std::string& inner = "1") {
  std::string s;
  for (int i = 0; i < n; ++i) s += open;
  s += inner;
  for (int i = 0; i < n; ++i) s += close;
  return s;
}

// A chat request body with field `field` given as the JSON text `value` (parsed as the server does).
json chat_with(const std::string& field, const std::string& value) {
  json body = chat();
  body[field] = parse_body("{\"v\": " + value + "}")["v"];
  return body;
}

// The body {"<field>": <value>} as text.
std::string body_with(const std::string& field, const std::string& value) {
  return "{\"" + field + "\": " + value + "}";
}

TEST(ServerSchema, NestingIsLimitedWhileParsing) {
  const JsonLimits limits;  // 64 levels; the body object is level 1
  // At the limit: parses, and a wrong-type error on it quotes a short excerpt only.
  const std::string at = body_with("temperature", nest(limits.max_depth - 1, "[", "]"));
  const json doc = parse_body(at);
  expect_400([&] { parse_chat(doc); }, "temperature", "must be a number, got array [[[[");
  try {
    parse_chat(doc);
  } catch (const ApiError& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u) << e.what();
  }
  // One past the limit, and the 60,000 levels of the issue, in arrays and in objects: a 400 from the parser.
  expect_400([&] { parse_body(body_with("temperature", nest(limits.max_depth, "[", "]"))); }, "",
             "deeper than 64 levels");
  expect_400([&] { parse_body(body_with("messages", nest(60000, "[", "]"))); }, "", "deeper than 64 levels");
  expect_400([&] { parse_body(body_with("tools", nest(60000, "{\"a\":", "}"))); }, "", "deeper than 64 levels");
  // Unbalanced (never closed) nesting is caught as early.
  expect_400([&] { parse_body("{\"stop\": " + std::string(200000, '[')); }, "", "deeper than 64 levels");
  // Tool-call arguments given as JSON text are parsed within the same limits.
  json msgs = json::array(
      {{{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         json::array({{{"type", "function"},
                       {"function", {{"name", "f"}, {"arguments", "{\"x\": " + nest(60000, "[", "]") + "}"}}}}})}}});
  expect_400([&] { normalize_messages(msgs); }, "messages[0].tool_calls[0].function.arguments", "deeper than 64");
  // Element counts.
  std::string ids = "[1";
  for (int i = 0; i < 200; ++i) ids += ",1";
  expect_400([&] { parse_body(body_with("prompt", ids + "]"), {64, 100}); }, "", "more than 100 JSON elements");
  EXPECT_NO_THROW(parse_body(body_with("prompt", ids + "]"), {64, 300}));
}

TEST(ServerSchema, ErrorMessagesNeverQuoteUnboundedInput) {
  // A long unterminated string, a long bad literal: the parser's message is cut.
  for (const std::string& body :
       {"{\"model\": \"" + std::string(1 << 20, 'x'), "{\"model\": " + std::string(1 << 20, 't')}) {
    try {
      parse_body(body);
      ADD_FAILURE() << "no error";
    } catch (const ApiError& e) {
      EXPECT_LT(std::string(e.what()).size(), 300u);
    }
  }
  // describe() of a huge or deep value costs a bounded excerpt.
  json deep = 1;
  for (int i = 0; i < 100; ++i) deep = json::array({deep});
  EXPECT_EQ(describe(deep).size(), std::string("array ").size() + 60);
  EXPECT_EQ(describe(json(std::string(1 << 20, 'y'))).size(), std::string("string ").size() + 60);
  EXPECT_EQ(describe(json{{"k", 1}}), "object {\"k\":1}");
}

TEST(ServerSchema, NumbersAreCheckedWithoutOverflow) {
  // A number beyond a double is a 400 naming the body, not a 500.
  expect_400([] { parse_body(body_with("temperature", "1e309")); }, "", "number out of range");
  expect_400([] { parse_body(body_with("temperature", "-1e309")); }, "", "number out of range");
  // 2^63 and 2^64 - 1 are not wrapped to negative values; the message shows the value sent.
  expect_400([] { parse_chat(chat_with("max_tokens", "9223372036854775808")); }, "max_tokens",
             "max_tokens must be <= 9223372036854775807, got 9223372036854775808");
  expect_400([] { parse_chat(chat_with("seed", "18446744073709551615")); }, "seed", "got 18446744073709551615");
  expect_400([] { parse_chat(chat_with("max_tokens", "1e300")); }, "max_tokens",
             "max_tokens must be <= 9223372036854775807, got 1e+300");
  expect_400([] { parse_chat(chat_with("max_tokens", "-9223372036854775808")); }, "max_tokens",
             "max_tokens must be >= 1, got -9223372036854775808");
  // Non-negative numbers parse as unsigned: 0 is still below 1.
  expect_400([] { parse_chat(chat_with("max_tokens", "0")); }, "max_tokens", "max_tokens must be >= 1, got 0");
  // INT64_MAX itself parses (the server then compares it with the context without forming prompt + max_tokens).
  EXPECT_EQ(parse_chat(chat({{"max_tokens", INT64_MAX}})).sampling.max_tokens, INT64_MAX);
  expect_400(
      [] {
        parse_chat(chat({{"stop_token_ids", {uint64_t(1) << 63}}}));
      },
      "stop_token_ids", "stop token id 9223372036854775808 (stop_token_ids[0]) is out of range");
  expect_400(
      [] {
        parse_detokenize_request(json{{"tokens", {UINT64_MAX}}}, kVocab);
      },
      "tokens", "tokens[0] = 18446744073709551615 is outside");
  expect_400(
      [] {
        parse_completion_request(json{{"prompt", {uint64_t(1) << 63}}}, {}, kVocab);
      },
      "prompt", "prompt token id 9223372036854775808 at position 0");
  EXPECT_EQ(integer_in(json(100.0), 0, 100), 100);
  EXPECT_EQ(integer_in(json(uint64_t(1) << 63), INT64_MIN, INT64_MAX), std::nullopt);
  EXPECT_EQ(integer_in(json(1e300), INT64_MIN, INT64_MAX), std::nullopt);
}

TEST(ServerSchema, ChatDefaultsAndOverrides) {
  SamplingParams d;
  d.temperature = 0.6;
  d.top_p = 0.95;
  d.top_k = 20;
  ApiRequest r = parse_chat(chat(), d);
  EXPECT_EQ(r.endpoint, Endpoint::Chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 0.6);  // the model's defaults apply when the request says nothing
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_EQ(r.top_logprobs, -1);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_FALSE(r.parse_tool_calls);

  r = parse_chat(chat({{"temperature", 0},
                       {"top_p", 0.5},
                       {"top_k", 5},
                       {"min_p", 0.1},
                       {"seed", 42},
                       {"max_tokens", 7},
                       {"presence_penalty", 0.5},
                       {"frequency_penalty", -0.5},
                       {"repetition_penalty", 1.1},
                       {"stop", "END"},
                       {"stop_token_ids", {3, 4}},
                       {"ignore_eos", true},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}},
                       {"logprobs", true},
                       {"top_logprobs", 3}}),
                 d);
  EXPECT_TRUE(r.sampling.greedy());
  EXPECT_DOUBLE_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_DOUBLE_EQ(r.sampling.min_p, 0.1);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_DOUBLE_EQ(r.sampling.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(r.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.top_logprobs, 3);

  // max_completion_tokens wins over max_tokens; logprobs alone means top_logprobs 0; null means "not given".
  r = parse_chat(chat(
      {{"max_tokens", 9}, {"max_completion_tokens", 4}, {"logprobs", true}, {"seed", nullptr}, {"stop", {"a", "b"}}}));
  EXPECT_EQ(r.sampling.max_tokens, 4);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_FALSE(r.sampling.seed.has_value());
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"a", "b"}));
  // 100.0 is an integer, 1.5 is not
  EXPECT_EQ(parse_chat(chat({{"max_tokens", 100.0}})).sampling.max_tokens, 100);
}

TEST(ServerSchema, ChatErrorsNameTheField) {
  expect_400([] { parse_chat(chat({{"temprature", 0.5}})); }, "temprature", "unknown field");
  expect_400([] { parse_chat(chat({{"temperature", "hot"}})); }, "temperature", "must be a number, got string");
  expect_400([] { parse_chat(chat({{"max_tokens", 1.5}})); }, "max_tokens", "must be an integer");
  expect_400([] { parse_chat(chat({{"max_tokens", 0}})); }, "max_tokens", ">= 1");
  expect_400([] { parse_chat(chat({{"top_p", 0}})); }, "top_p", "(0, 1]");
  expect_400([] { parse_chat(chat({{"temperature", -1}})); }, "temperature", ">= 0");
  expect_400([] { parse_chat(chat({{"presence_penalty", 3}})); }, "presence_penalty", "[-2, 2]");
  expect_400([] { parse_chat(chat({{"top_k", -2}})); }, "top_k", "top_k");
  expect_400([] { parse_chat(chat({{"stop_token_ids", {5000}}})); }, "stop_token_ids", "out of range");
  expect_400([] { parse_chat(chat({{"stop", {1}}})); }, "stop", "stop[0] must be a string");
  expect_400([] { parse_chat(chat({{"stream", "yes"}})); }, "stream", "must be a boolean");
  expect_400([] { parse_chat(chat({{"n", 0}})); }, "n", "n must be in [1, 128]");
  expect_400([] { parse_chat(chat({{"n", 129}})); }, "n", "n must be in [1, 128]");
  expect_400([] { parse_chat(chat({{"top_logprobs", 2}})); }, "top_logprobs", "requires logprobs");
  expect_400([] { parse_chat(chat({{"logprobs", true}, {"top_logprobs", 21}})); }, "top_logprobs", "[0, 20]");
  expect_400(
      [] {
        parse_chat(chat({{"stream_options", {{"include_usage", true}}}}));
      },
      "stream_options", "only be given when stream is true");
  expect_400([] { parse_chat(chat({{"logit_bias", {{"x5", 10}}}})); }, "logit_bias", "must be a token id");
  expect_400([] { parse_chat(chat({{"logit_bias", {{"5000", 10}}}})); }, "logit_bias", "must be a token id in [0,");
  expect_400([] { parse_chat(chat({{"logit_bias", {{"5", 101}}}})); }, "logit_bias", "[-100, 100]");
  expect_400([] { parse_chat(chat({{"logit_bias", {{"5", "up"}}}})); }, "logit_bias", "[-100, 100]");
  expect_400([] { parse_chat(chat({{"min_tokens", -1}})); }, "min_tokens", ">= 0");
  expect_400([] { parse_chat(chat({{"max_tokens", 4}, {"min_tokens", 5}})); }, "min_tokens", "min_tokens");
  expect_400([] { parse_chat(chat({{"prompt_logprobs", 21}})); }, "prompt_logprobs", "[0, 20]");
  expect_400([] { parse_chat(chat({{"tool_choice", "required"}})); }, "tool_choice", "needs tools");
  expect_400([] { parse_chat(chat({{"tool_choice", "sometimes"}})); }, "tool_choice", "tool_choice must be");
  expect_400([] { parse_chat(chat({{"response_format", {{"type", "yaml"}}}})); }, "response_format.type",
             "must be \"text\", \"json_object\" or \"json_schema\"");
  expect_400([] { parse_chat(chat({{"response_format", {{"type", "json_schema"}}}})); },
             "response_format.json_schema", "is required");
  expect_400(
      [] {
        parse_chat(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}));
      },
      "response_format.json_schema.schema", "is required");
  expect_400([] { parse_chat(json{{"model", "m"}}); }, "messages", "required");
  expect_400([] { parse_chat(json{{"messages", json::array()}}); }, "messages", "must not be empty");
  expect_400([] { parse_chat(json{{"messages", "hi"}}); }, "messages", "must be an array");
}

TEST(ServerSchema, MessagesAreNormalisedForTheTemplate) {
  json messages = json::array(
      {{{"role", "system"}, {"content", "sys"}},
       {{"role", "user"},
        {"content", json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"reasoning", "thought"},
        {"tool_calls",
         json::array(
             {{{"id", "call_1"},
               {"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\", \"days\": 2}"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}});
  json out = normalize_messages(messages);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[1]["content"], "a\nb");  // text parts joined with a newline, as vLLM does
  EXPECT_EQ(out[2]["content"], "");
  EXPECT_EQ(out[2]["reasoning_content"], "thought");
  const json& call = out[2]["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_TRUE(call["function"]["arguments"].is_object());  // the templates iterate arguments|items
  EXPECT_EQ(call["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(call["function"]["arguments"]["days"], 2);
  EXPECT_EQ(out[3]["tool_call_id"], "call_1");
  // "developer" is OpenAI's newer name for "system".
  EXPECT_EQ(normalize_messages(json::array({{{"role", "developer"}, {"content", "d"}}}))[0]["role"], "system");

  expect_400(
      [] {
        normalize_messages(json::array({{{"role", "robot"}, {"content", "x"}}}));
      },
      "messages[0].role", "must be one of");
  expect_400([] { normalize_messages(json::array({{{"content", "x"}}})); }, "messages[0].role", "required");
  expect_400([] { normalize_messages(json::array({{{"role", "user"}}})); }, "messages[0].content", "required");
  expect_400(
      [] {
        normalize_messages(
            json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}, {"image_url", "x"}}})}}}));
      },
      "messages[0].content[0].type", "not supported");
  expect_400(
      [] {
        normalize_messages(
            json::array({{{"role", "assistant"},
                          {"tool_calls", json::array({{{"function", {{"name", "f"}, {"arguments", "{oops"}}}}})}}}));
      },
      "messages[0].tool_calls[0].function.arguments", "JSON object");
  expect_400([] { normalize_messages(json::array({"hi"})); }, "messages[0]", "must be a JSON object");
}

TEST(ServerSchema, ToolsAndTemplateVariables) {
  json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  ApiRequest r = parse_chat(
      chat({{"tools", tools}, {"chat_template_kwargs", {{"enable_thinking", false}}}, {"reasoning_effort", "low"}}));
  EXPECT_EQ(r.tools, tools);
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_EQ(r.template_vars["enable_thinking"], false);
  EXPECT_EQ(r.template_vars["reasoning_effort"], "low");
  EXPECT_FALSE(parse_chat(chat({{"tools", tools}, {"tool_choice", "none"}})).parse_tool_calls);
  expect_400([] { check_tools(json::array({{{"type", "function"}}})); }, "tools[0].function", "required");
  expect_400([] { check_tools(json::array({{{"type", "code"}}})); }, "tools[0].type", "must be \"function\"");
  expect_400(
      [] {
        check_tools(json::array({{{"type", "function"}, {"function", {{"name", 3}}}}}));
      },
      "tools[0].function.name", "must be a string");
  expect_400([] { parse_chat(chat({{"chat_template_kwargs", "x"}})); }, "chat_template_kwargs", "must be an object");
}

TEST(ServerSchema, StructuredOutputToolChoiceAndSamplingExtensions) {
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  ApiRequest r = parse_chat(chat({{"tools", tools}, {"tool_choice", "required"}}));
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  EXPECT_TRUE(r.parse_tool_calls);
  r = parse_chat(chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_EQ(r.forced_tool, "get_weather");
  expect_400(
      [&] {
        parse_chat(chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}));
      },
      "tool_choice.function.name", "not among the tools");
  r = parse_chat(chat({{"tools", tools}, {"tool_choice", "none"}}));
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  EXPECT_FALSE(r.parse_tool_calls);
  r = parse_chat(chat({{"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(r.response_format, ResponseFormat::JsonObject);
  const json schema = {{"type", "object"}, {"properties", {{"b", {{"type", "integer"}}}, {"a", {{"type", "string"}}}}}};
  r = parse_chat(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", true}}}}}}));
  EXPECT_EQ(r.response_format, ResponseFormat::JsonSchema);
  EXPECT_EQ(r.json_schema.dump(), schema.dump());
  EXPECT_EQ(r.json_schema.begin().value().dump(), "\"object\"");
  expect_400(
      [&] {
        parse_chat(chat({{"tools", tools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}));
      },
      "response_format", "cannot be combined");
  r = parse_chat(chat({{"n", 3}, {"seed", 5}, {"logit_bias", {{"7", -100}, {"9", 2.5}}}, {"min_tokens", 2},
                       {"priority", -4}, {"prompt_logprobs", 1}}));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.f}, {9, 2.5f}}));
  EXPECT_EQ(r.sampling.min_tokens, 2);
  EXPECT_EQ(r.priority, -4);
  EXPECT_EQ(r.prompt_logprobs, 1);
}

// flashnext's per-request speculative decoding fields: read as given (the server resolves them against its
// --speculative), contradictions and wrong types are 400 naming the field.
TEST(ServerSchema, SpeculativeFields) {
  ApiRequest r = parse_chat(chat());
  EXPECT_FALSE(r.speculative);
  EXPECT_FALSE(r.num_speculative_tokens);
  r = parse_chat(chat({{"speculative", false}}));
  EXPECT_EQ(r.speculative, false);
  r = parse_chat(chat({{"num_speculative_tokens", 3}, {"speculative", true}}));
  EXPECT_EQ(r.num_speculative_tokens, 3);
  EXPECT_EQ(r.speculative, true);
  r = parse_completion_request(json{{"prompt", "x"}, {"num_speculative_tokens", 0}, {"speculative", false}}, {},
                               kVocab);
  EXPECT_EQ(r.num_speculative_tokens, 0);
  expect_400(
      [&] {
        parse_chat(chat({{"speculative", false}, {"num_speculative_tokens", 2}}));
      },
      "num_speculative_tokens", "contradicts speculative: false");
  expect_400(
      [&] {
        parse_chat(chat({{"speculative", true}, {"num_speculative_tokens", 0}}));
      },
      "num_speculative_tokens", "contradicts speculative: true");
  expect_400([&] { parse_chat(chat({{"num_speculative_tokens", -1}})); }, "num_speculative_tokens", ">= 0");
  expect_400([&] { parse_chat(chat({{"speculative", "no"}})); }, "speculative", "must be a boolean");
}

TEST(ServerSchema, Completions) {
  SamplingParams d;
  ApiRequest r = parse_completion_request(json{{"prompt", "hello"}}, d, kVocab);
  EXPECT_EQ(r.endpoint, Endpoint::Completion);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hello");
  EXPECT_EQ(r.sampling.max_tokens, 16);  // the OpenAI / vLLM completions default
  EXPECT_EQ(r.prompt_logprobs, -1);
  r = parse_completion_request(json{{"prompt", {1, 2, 3}}, {"logprobs", 2}, {"echo", true}, {"max_tokens", 0}}, d,
                               kVocab);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].text.has_value());
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.prompt_logprobs, 2);  // echo with logprobs scores the prompt
  EXPECT_EQ(r.sampling.max_tokens, 0);  // allowed with echo: lm-eval-harness loglikelihood
  EXPECT_TRUE(r.echo);
  expect_400([&] { parse_completion_request(json{{"prompt", "x"}, {"max_tokens", 0}}, d, kVocab); }, "max_tokens",
             ">= 1");
  r = parse_completion_request(json{{"prompt", json::array({json::array({7, 8})})}}, d, kVocab);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{7, 8}));
  r = parse_completion_request(json{{"prompt", json::array({"a", json::array({7}), "b"})}, {"n", 2}}, d, kVocab);
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[0].text, "a");
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(r.prompts[2].text, "b");
  EXPECT_EQ(r.n, 2);
  expect_400([&] { parse_completion_request(json{{"prompt", json::array({"a", 5})}}, d, kVocab); }, "prompt",
             "prompt[1] must be a string or an array of token ids");
  expect_400([&] { parse_completion_request(json{{"prompt", json::array({"a", "b"})}, {"n", 100}}, d, kVocab); }, "n",
             "make 200 choices, more than 128");
  expect_400([&] { parse_completion_request(json{{"prompt", "x"}, {"best_of", 3}}, d, kVocab); }, "best_of",
             "best_of must equal n");
  expect_400(
      [&] {
        parse_completion_request(json{{"prompt", {1, 1000}}}, d, kVocab);
      },
      "prompt", "outside the vocabulary");
  expect_400([&] { parse_completion_request(json{{"prompt", ""}}, d, kVocab); }, "prompt", "empty");
  expect_400([&] { parse_completion_request(json{{"prompt", 5}}, d, kVocab); }, "prompt", "must be a string");
  expect_400(
      [&] {
        parse_completion_request(json{{"prompt", "x"}, {"logprobs", 30}}, d, kVocab);
      },
      "logprobs", "[0, 20]");
  expect_400(
      [&] {
        parse_completion_request(json{{"prompt", "x"}, {"messages", json::array()}}, d, kVocab);
      },
      "messages", "unknown field");
  expect_400([&] { parse_completion_request(json{{"max_tokens", 3}}, d, kVocab); }, "prompt", "required");
}

TEST(ServerSchema, TokenizeAndDetokenize) {
  auto t = parse_tokenize_request(json{{"prompt", "abc"}});
  EXPECT_EQ(t.prompt, "abc");
  t = parse_tokenize_request(
      json{{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"add_generation_prompt", false}});
  EXPECT_FALSE(t.prompt.has_value());
  EXPECT_EQ(t.messages.size(), 1u);
  EXPECT_FALSE(t.add_generation_prompt);
  expect_400([] { parse_tokenize_request(json::object()); }, "prompt", "exactly one");
  auto d = parse_detokenize_request(json{{"tokens", {1, 2}}}, kVocab);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2}));
  expect_400([] { parse_detokenize_request(json{{"tokens", {-1}}}, kVocab); }, "tokens", "outside the vocabulary");
  expect_400([] { parse_detokenize_request(json{{"tokens", "1 2"}}, kVocab); }, "tokens", "must be an array");
}

TEST(ServerSchema, ErrorBodyIsOpenAIShaped) {
  json e = error_body(400, "bad", "temperature");
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_EQ(e["error"]["code"], 400);
  EXPECT_TRUE(error_body(401, "k")["error"]["param"].is_null());
  EXPECT_EQ(error_body(401, "k")["error"]["type"], "authentication_error");
  EXPECT_EQ(error_body(503, "k")["error"]["type"], "server_overloaded_error");
}

}  // namespace
}  // namespace flashnext::server
