// The Responses API (server/responses_api.h): the translation of a Responses request into a chat-completions one
// (which parse_chat_request then validates), errors named after the Responses fields, and the Response object and
// SSE events built from the chat path's output pieces.
#include <gtest/gtest.h>

#include "server/openai_schema.h"
#include "server_test_util.h"
#include "server/responses_api.h"

namespace flashnext::server {
namespace {

using test::chat_body;
using test::expect_400;
using test::kVocab;


json parse(const std::string& text) {
  return json::parse(text);
}


// Translates `body`, then parses the chat body as /v1/chat/completions does; a chat error is remapped.
ApiRequest translate_and_parse(const json& body) {
  const ResponsesRequest r = translate_responses_request(body);
  try {
    return parse_chat_request(r.chat, SamplingParams{}, kVocab);
  } catch (const ApiError& e) {
    throw r.remap(e);
  }
}

TEST(ServerResponses, StringInputIsOneUserMessage) {
  const ResponsesRequest r = translate_responses_request(parse(R"({"model": "m", "input": "hi"})"));
  EXPECT_EQ(r.chat, parse(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})"));
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.echo["tools"], json::array());
  EXPECT_EQ(r.echo["tool_choice"], "auto");
  EXPECT_EQ(r.echo["text"], parse(R"({"format": {"type": "text"}})"));
  EXPECT_EQ(r.echo["parallel_tool_calls"], true);
  EXPECT_TRUE(r.echo["instructions"].is_null());
}

TEST(ServerResponses, InstructionsAndItemsBecomeMessages) {
  const json body = parse(R"({
    "instructions": "Be brief.",
    "input": [
      {"role": "developer", "content": "Use metric units."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                                      {"type": "input_text", "text": "in Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_b", "name": "time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
      {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]},
      {"role": "user", "content": "Thanks"}
    ]})");
  const ResponsesRequest r = translate_responses_request(body);
  EXPECT_EQ(r.chat["messages"], parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Use metric units."},
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "reasoning_content": "Call it.", "content": [{"type": "text", "text": "Checking."}],
     "tool_calls": [
       {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
       {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "noon"}]},
    {"role": "user", "content": "Thanks"}])"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  // ... which the chat parser accepts and normalises (parts joined, arguments parsed).
  const ApiRequest chat = parse_chat_request(r.chat, SamplingParams{}, kVocab);
  EXPECT_EQ(chat.messages[2]["content"], "Weather\nin Paris?");
  EXPECT_EQ(chat.messages[3]["tool_calls"][0]["function"]["arguments"], parse(R"({"city": "Paris"})"));
  EXPECT_EQ(chat.messages[5]["content"], "noon");
}

TEST(ServerResponses, FunctionCallWithoutAssistantTextStartsATurn) {
  const ResponsesRequest r = translate_responses_request(parse(R"({"input": [
      {"role": "user", "content": "hi"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "ok"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"}]})"));
  const json& m = r.chat["messages"];
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_FALSE(m[1].contains("content"));
  EXPECT_EQ(m[1]["tool_calls"].size(), 1u);
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[3]["tool_calls"][0]["id"], "c2");  // after a tool message: a new assistant turn
}

TEST(ServerResponses, SettingsTranslate) {
  const ResponsesRequest r = translate_responses_request(parse(R"({
    "model": "m", "input": "hi", "stream": true, "max_output_tokens": 32, "temperature": 0.5, "top_p": 0.9,
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "f"},
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true},
             "verbosity": "low"},
    "reasoning": {"effort": "low", "summary": "auto"},
    "store": false, "metadata": {"k": "v"}, "user": "u", "parallel_tool_calls": false,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "truncation": "disabled"})"));
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.chat, parse(R"({
    "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"},
                                                "strict": true}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": false, "max_tokens": 32, "temperature": 0.5, "top_p": 0.9,
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"},
                                                               "strict": true}},
    "reasoning_effort": "low", "user": "u"})"));
  // The echo keeps the Responses forms.
  EXPECT_EQ(r.echo["tools"][0]["name"], "f");
  EXPECT_EQ(r.echo["tool_choice"], parse(R"({"type": "function", "name": "f"})"));
  EXPECT_EQ(r.echo["text"]["format"]["type"], "json_schema");
  EXPECT_EQ(r.echo["max_output_tokens"], 32);
  EXPECT_EQ(r.echo["metadata"], parse(R"({"k": "v"})"));
  EXPECT_EQ(r.echo["reasoning"], parse(R"({"effort": "low", "summary": "auto"})"));
  EXPECT_EQ(r.echo["parallel_tool_calls"], false);

  for (const char* choice : {"auto", "none", "required"}) {
    json body = parse(R"({"input": "hi"})");
    body["tool_choice"] = choice;
    EXPECT_EQ(translate_responses_request(body).chat["tool_choice"], choice);
  }
  EXPECT_EQ(translate_responses_request(parse(R"({"input": "hi", "text": {"format": {"type": "json_object"}}})"))
                .chat["response_format"],
            parse(R"({"type": "json_object"})"));
  // Through the chat parser: max_output_tokens is max_tokens; store true is accepted (nothing is stored).
  const ApiRequest a = translate_and_parse(parse(R"({"input": "hi", "max_output_tokens": 7, "store": true})"));
  EXPECT_EQ(a.sampling.max_tokens, 7);
  EXPECT_TRUE(a.max_tokens_given);
}

TEST(ServerResponses, ErrorsNameTheResponsesField) {
  auto t = [](const char* text) { return [text] { translate_responses_request(parse(text)); }; };
  expect_400(t(R"({"input": "hi", "frequency": 1})"), "frequency", "unknown field");  // strict: the default
  FieldLogger log;
  const RequestPolicy lenient{false, &log, "test"};
  const json lax = translate_responses_request(parse(R"({"input": "hi", "frequency": 1, "text": {"tone": 2}})"),
                                               lenient).chat;
  EXPECT_FALSE(lax.contains("frequency"));
  EXPECT_EQ(lax["messages"].size(), 1u);
  EXPECT_EQ(log.logged(), (std::vector<std::string>{"frequency", "text.tone"}));
  expect_400(t(R"({"model": "m"})"), "input", "required");
  expect_400(t(R"({"input": 5})"), "input", "must be a string or an array");
  expect_400(t(R"({"input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                             {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})"),
             "input[2].content[0].type", "input_image");
  expect_400(t(R"({"input": [{"role": "tool", "content": "a"}]})"), "input[0].role", "must be one of");
  expect_400(t(R"({"input": [{"role": "user"}]})"), "input[0].content", "required");
  expect_400(t(R"({"input": [{"content": "a"}]})"), "input[0].type", "required");
  expect_400(t(R"({"input": [{"type": "web_search_call", "id": "x"}]})"), "input[0].type", "web_search_call");
  expect_400(t(R"({"input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type", "stores no");
  expect_400(t(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"), "input[0].call_id",
             "required");
  expect_400(t(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"), "input[0].output", "required");
  expect_400(t(R"({"input": [{"type": "function_call_output", "call_id": "c",
                              "output": [{"type": "input_file", "file_id": "f"}]}]})"),
             "input[0].output[0].type", "input_file");
  expect_400(t(R"({"input": "hi", "previous_response_id": "resp_1"})"), "previous_response_id",
             "not supported: the server stores no responses");
  expect_400(t(R"({"input": "hi", "conversation": "conv_1"})"), "conversation", "stores no");
  expect_400(t(R"({"input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]})"),
             "tools[1].type", "web_search");
  expect_400(t(R"({"input": "hi", "tools": [{"type": "function"}]})"), "tools[0].name", "required");
  expect_400(t(R"({"input": "hi", "tool_choice": {"type": "file_search"}})"), "tool_choice.type", "file_search");
  expect_400(t(R"({"input": "hi", "text": {"format": {"type": "xml"}}})"), "text.format.type", "xml");
  expect_400(t(R"({"input": "hi", "text": {"format": "json"}})"), "text.format", "JSON object");
  expect_400(t(R"({"input": "hi", "reasoning": {"effort": 3}})"), "reasoning.effort", "a string");
  expect_400(t(R"({"input": "hi", "temperature": "hot"})"), "temperature", "a number");
  expect_400(t(R"({"input": "hi", "stream_options": {}})"), "stream_options", "stream is true");
  expect_400(t(R"({"input": "hi", "background": true})"), "background", "not supported");
  expect_400(t(R"({"input": "hi", "truncation": "auto"})"), "truncation", "not supported");
  expect_400(t(R"({"input": "hi", "include": ["message.output_text.logprobs"]})"), "include[0]", "not supported");
  expect_400(t(R"({"input": "hi", "metadata": []})"), "metadata", "an object");
}

TEST(ServerResponses, ChatParserErrorsAreRenamed) {
  auto p = [](const char* text) { return [text] { translate_and_parse(parse(text)); }; };
  expect_400(p(R"({"input": "hi", "max_output_tokens": 0})"), "max_output_tokens", "max_output_tokens must be >= 1");
  expect_400(p(R"({"input": [{"role": "user", "content": "a"},
                             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]})"),
             "input[1].arguments", "input[1].arguments");
  expect_400(p(R"({"input": "hi", "tools": [{"type": "function", "name": ""}]})"), "tools[0].name", "tools[0].name");
  expect_400(p(R"({"input": []})"), "input", "must not be empty");
  // A field of a translated message keeps its place in the item.
  ResponsesRequest r = translate_responses_request(parse(R"({"instructions": "x", "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
      {"type": "function_call_output", "call_id": "c", "output": "o"}]})"));
  EXPECT_EQ(r.remap(ApiError(400, "bad messages[1].content[0].text", "messages[1].content[0].text")).param(),
            "input[0].content[0].text");
  EXPECT_EQ(r.remap(ApiError(400, "bad", "messages[2].content")).param(), "input[1].output");
  EXPECT_EQ(r.remap(ApiError(400, "bad", "messages[0].content")).param(), "instructions");
  EXPECT_EQ(r.remap(ApiError(400, "m", "temperature")).param(), "temperature");  // same name both ways
  const ApiError renamed =
      r.remap(ApiError(400, "field \"messages[1].content[0].text\" is bad", "messages[1].content[0].text"));
  EXPECT_STREQ(renamed.what(), "field \"input[0].content[0].text\" is bad");
}

// ---- the writer ---------------------------------------------------------------------------------------------------

ToolCall call(const char* id, const char* name, const char* args) {
  return ToolCall{id, name, args};
}

struct Event {
  std::string name;  // the `event:` line
  json data;
};

// Splits an SSE text into its events ("event: NAME\ndata: JSON\n\n"; each data is one line here).
std::vector<Event> events_of(const std::string& sse) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = block.find('\n');
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    out.push_back({block.substr(7, nl - 7), json::parse(block.substr(nl + 7))});
  }
  return out;
}

std::vector<std::string> types_of(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const Event& e : events) out.push_back(e.name);
  return out;
}

// Output items without their random ids.
json without_ids(json output) {
  for (json& item : output) item.erase("id");
  return output;
}

ResponsesWriter writer(bool stream) {
  return ResponsesWriter(json{{"tools", json::array()}, {"temperature", 0.0}}, "resp_1", "tiny", 123, stream);
}

TEST(ServerResponses, WriterBuildsTheResponseObject) {
  ResponsesWriter w = writer(false);
  EXPECT_EQ(w.start(), "");
  EXPECT_EQ(w.add("Let me ", "", {}), "");
  w.add("think.", "", {});
  w.add("", "Calling", {});
  w.add("", " now.", {call("call_1", "weather", R"({"city": "Paris"})"), call("call_2", "time", "{}")});
  EXPECT_EQ(w.finish("tool_calls", {10, 8, 3}), "");
  const json r = w.response();
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 123);
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_TRUE(r["error"].is_null());
  EXPECT_EQ(r["temperature"], 0.0);
  EXPECT_EQ(r["tool_choice"], "auto");
  EXPECT_EQ(without_ids(r["output"]), parse(R"([
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Let me think."}],
     "status": "completed"},
    {"type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Calling now.", "annotations": [], "logprobs": []}]},
    {"type": "function_call", "status": "completed", "arguments": "{\"city\": \"Paris\"}", "call_id": "call_1",
     "name": "weather"},
    {"type": "function_call", "status": "completed", "arguments": "{}", "call_id": "call_2", "name": "time"}])"));
  EXPECT_EQ(r["output"][0]["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(r["output"][1]["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(r["output"][2]["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(r["usage"], parse(R"({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0,
    "cache_write_tokens": 0}, "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 18})"));
}

TEST(ServerResponses, WriterLengthIsIncomplete) {
  ResponsesWriter w = writer(false);
  w.add("", "cut sh", {});
  w.finish("length", {5, 4, 0});
  const json r = w.response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], parse(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "cut sh");
}

TEST(ServerResponses, WriterWithoutOutputHasAnEmptyMessage) {
  for (const char* reasoning : {"", "only thinking"}) {
    ResponsesWriter w = writer(false);
    w.add(reasoning, "", {});
    w.finish("stop", {5, 1, 0});
    const json out = w.response()["output"];
    ASSERT_EQ(out.size(), std::string(reasoning).empty() ? 1u : 2u);
    EXPECT_EQ(out.back()["type"], "message");
    EXPECT_EQ(out.back()["content"][0]["text"], "");
  }
}

TEST(ServerResponses, WriterStreamsEventsInOrder) {
  ResponsesWriter w = writer(true);
  std::string sse = w.start();
  sse += w.add("Hm", "", {});
  sse += w.add(".", "", {});
  sse += w.add("", "Hel", {});
  sse += w.add("", "lo", {call("call_1", "f", R"({"a": 1})")});
  sse += w.finish("tool_calls", {3, 6, 2});
  const std::vector<Event> events = events_of(sse);
  EXPECT_EQ(types_of(events), (std::vector<std::string>{"response.created",
                                                        "response.in_progress",
                                                        "response.output_item.added",
                                                        "response.content_part.added",
                                                        "response.reasoning_text.delta",
                                                        "response.reasoning_text.delta",
                                                        "response.reasoning_text.done",
                                                        "response.content_part.done",
                                                        "response.output_item.done",
                                                        "response.output_item.added",
                                                        "response.content_part.added",
                                                        "response.output_text.delta",
                                                        "response.output_text.delta",
                                                        "response.output_text.done",
                                                        "response.content_part.done",
                                                        "response.output_item.done",
                                                        "response.output_item.added",
                                                        "response.function_call_arguments.delta",
                                                        "response.function_call_arguments.done",
                                                        "response.output_item.done",
                                                        "response.completed"}));
  std::string reasoning, text;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& d = events[i].data;
    EXPECT_EQ(d["type"], events[i].name);
    EXPECT_EQ(d["sequence_number"], i);
    if (d["type"] == "response.reasoning_text.delta") reasoning += d["delta"].get<std::string>();
    if (d["type"] == "response.output_text.delta") {
      text += d["delta"].get<std::string>();
      EXPECT_EQ(d["output_index"], 1);
      EXPECT_EQ(d["content_index"], 0);
      EXPECT_EQ(d["item_id"], events[9].data["item"]["id"]);
    }
  }
  EXPECT_EQ(reasoning, "Hm.");
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(events[0].data["response"]["output"], json::array());
  EXPECT_EQ(events[13].data["text"], "Hello");
  EXPECT_EQ(events[16].data["item"]["arguments"], "");
  EXPECT_EQ(events[17].data["delta"], R"({"a": 1})");
  EXPECT_EQ(events[19].data["item"]["arguments"], R"({"a": 1})");
  // The final response lists the items the stream closed, as a non-streaming writer does.
  const json& final_response = events.back().data["response"];
  EXPECT_EQ(final_response["status"], "completed");
  EXPECT_EQ(final_response["output"][1], events[15].data["item"]);
  ResponsesWriter plain = writer(false);
  plain.add("Hm", "", {});
  plain.add(".", "", {});
  plain.add("", "Hel", {});
  plain.add("", "lo", {call("call_1", "f", R"({"a": 1})")});
  plain.finish("tool_calls", {3, 6, 2});
  EXPECT_EQ(without_ids(final_response["output"]), without_ids(plain.response()["output"]));
  EXPECT_EQ(final_response["usage"], plain.response()["usage"]);
}

TEST(ServerResponses, WriterStreamsIncompleteAndFailed) {
  ResponsesWriter w = writer(true);
  std::string sse = w.start() + w.add("", "abc", {});
  sse += w.finish("length", {1, 1, 0});
  std::vector<Event> events = events_of(sse);
  EXPECT_EQ(events.back().name, "response.incomplete");
  EXPECT_EQ(events.back().data["response"]["incomplete_details"]["reason"], "max_output_tokens");

  ResponsesWriter f = writer(true);
  sse = f.start();
  sse += f.add("", "partial", {});
  sse += f.fail("the engine failed");
  events = events_of(sse);
  EXPECT_EQ(events.back().name, "response.failed");
  const json& r = events.back().data["response"];
  EXPECT_EQ(r["status"], "failed");
  EXPECT_EQ(r["error"], parse(R"({"code": "server_error", "message": "the engine failed"})"));
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "partial");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
}

}  // namespace
}  // namespace flashnext::server
