// The OpenAI Responses API (POST /v1/responses) on top of the chat-completions path.
//
// Request side: translate_responses_request() turns a Responses body into the equivalent /v1/chat/completions body,
// which parse_chat_request (openai_schema.h) then validates like any chat request, so both endpoints render, sample,
// and parse reasoning and tool calls the same way:
//   input (a string, or items: messages with content strings or input_text / output_text parts, function_call,
//   function_call_output, reasoning)            -> messages (function_call -> assistant tool_calls, outputs -> tool
//                                                  messages, reasoning -> reasoning_content of the next assistant turn)
//   instructions                                -> a leading system message
//   tools [{type: function, name, ...}]         -> tools [{type: function, function: {name, ...}}]
//   tool_choice {type: function, name}          -> tool_choice {type: function, function: {name}} (strings as given)
//   max_output_tokens, text.format, reasoning.effort -> max_tokens, response_format, reasoning_effort
//   temperature, top_p, stream, user, parallel_tool_calls -> the same fields
// The server stores nothing: `store` is accepted either way, `previous_response_id`, `conversation` and
// item_reference inputs are 400. Errors name the Responses field (`input[2].content[0].type`); errors the chat parser
// (or a later check) raises name chat fields and are mapped back with ResponsesRequest::remap.
//
// Output side: ResponsesWriter builds the Response object ({id: "resp_...", object: "response", status, output:
// [reasoning, message, function_call items], usage, ...}) from the pieces the chat path produces (reasoning text,
// content text, tool calls, finish reason, usage), and, when streaming, the SSE events of the Responses API
// (`event: TYPE` + `data: {...}` with a rising sequence_number; no `[DONE]`):
//   response.created, response.in_progress,
//   per item: response.output_item.added, then for a message: response.content_part.added,
//             response.output_text.delta..., response.output_text.done, response.content_part.done; for reasoning the
//             same with response.reasoning_text.delta/done; for a function call:
//             response.function_call_arguments.delta/done; then response.output_item.done,
//   and last response.completed, response.incomplete (the output hit max_output_tokens or the context) or
//   response.failed (the engine failed).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/openai_schema.h"
#include "server/output_parsers.h"

namespace flashnext::server {

/// A Responses request translated to the chat-completions form, plus what the Response object echoes back.
struct ResponsesRequest {
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();  ///< the /v1/chat/completions body
  bool stream = false;
  /// The request settings a Response object repeats (instructions, tools in Responses form, tool_choice,
  /// max_output_tokens, parallel_tool_calls, text, reasoning, metadata, user, truncation, ...); temperature and top_p
  /// are filled in by the server with the values the request runs with.
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  /// Chat field prefixes and the Responses fields they came from ("messages[1]" -> "input[0]", "max_tokens" ->
  /// "max_output_tokens"), longest first, for remap().
  std::vector<std::pair<std::string, std::string>> fields;

  /// `error` (raised on the chat body) with its param, and that param's mentions in its message, renamed to the
  /// Responses field it came from; unchanged when its param is not one of `fields`.
  ApiError remap(const ApiError& error) const;
};

/// Translates a Responses request body (a JSON object, parsed with parse_body) into the chat form. Throws
/// ApiError(400) naming the Responses field: an unknown field (under a strict `policy`, the default; otherwise it is
/// logged through the policy and ignored), a field of the wrong type, an input item or content part of a kind this
/// server does not support (images, files, hosted tools' items), a tool other than a function,
/// `previous_response_id` / `conversation` / item references (the server stores no responses).
ResponsesRequest translate_responses_request(const nlohmann::ordered_json& body, const RequestPolicy& policy = {});

/// Token counts of a finished response.
struct ResponsesUsage {
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t reasoning_tokens = 0;  ///< of output_tokens, those that produced reasoning text
  int64_t cached_tokens = 0;     ///< of input_tokens, those found in the prefix cache
};

/// Builds a Response object, and its stream of SSE events, from the output of a chat generation.
///
/// Call add() with each piece of output in order (reasoning text, content text, tool calls; any may be empty), then
/// finish() once, or fail() when the generation failed. Each item is opened when its first text arrives and closed
/// when output of another kind follows or the response ends: usually a reasoning item, a message item and one
/// function_call item per call, in that order. A response with neither text nor calls gets one empty message item,
/// so that it always has a final message or a call. Not streaming, add() / finish() return "" and only response()
/// matters; both ways produce the same `output`.
class ResponsesWriter {
 public:
  /// `echo`: ResponsesRequest::echo (with temperature / top_p filled in); `id`: "resp_..."; `model`: the name the
  /// server reports; `created_at`: Unix seconds.
  ResponsesWriter(nlohmann::ordered_json echo, std::string id, std::string model, int64_t created_at, bool stream);

  /// Streaming: the response.created and response.in_progress events.
  std::string start();
  /// Adds the next piece of output: `reasoning` text, then `content` text, then `calls`. Returns its events.
  std::string add(const std::string& reasoning, const std::string& content, const std::vector<ToolCall>& calls);
  /// Ends the output. `finish_reason` is the chat path's ("stop", "tool_calls", "length", ...): "length" makes the
  /// response "incomplete" (incomplete_details.reason "max_output_tokens") and the item open at that point
  /// "incomplete"; anything else "completed". Returns the remaining events, response.completed or
  /// response.incomplete last.
  std::string finish(const std::string& finish_reason, const ResponsesUsage& usage);
  /// Ends the output with a failure: status "failed", error {code: "server_error", message}. Returns the
  /// response.failed event.
  std::string fail(const std::string& message);
  /// The Response object as it stands (in progress until finish() or fail()).
  nlohmann::ordered_json response() const;

 private:
  enum class Kind { None, Reasoning, Message };
  std::string event(const char* type, nlohmann::ordered_json data);
  std::string open(Kind kind);
  std::string close(const char* status);
  std::string add_call(const ToolCall& call);

  nlohmann::ordered_json echo_;
  std::string id_, model_;
  int64_t created_at_;
  bool stream_;
  int64_t sequence_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  ///< items, the open one last
  Kind open_ = Kind::None;                                           ///< the kind of output_.back() while it is open
  std::string text_;                                                 ///< the open item's text so far
  std::string status_ = "in_progress";
  nlohmann::ordered_json incomplete_details_, error_, usage_;
};

}  // namespace flashnext::server
