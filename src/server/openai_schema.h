// Request side of the OpenAI-compatible API: JSON bodies of /v1/chat/completions, /v1/completions, /tokenize and
// /detokenize, checked field by field and converted to what the engine needs. Unknown fields: see RequestPolicy.
//
// Fields are those of the OpenAI API plus vLLM's extensions (top_k, min_p, repetition_penalty, stop_token_ids,
// ignore_eos, include_stop_str_in_output, chat_template_kwargs, add_generation_prompt, continue_final_message,
// echo, return_tokens_as_token_ids, min_tokens, priority, prompt_logprobs) and flashnext's speculative /
// num_speculative_tokens (per-request speculative decoding). A null value means "not given". Every
// error is an ApiError(400) naming the field and what was expected: malformed JSON, a top-level field this server does
// not know (as the OpenAI API does), a field of the wrong type, a value out of range, or an option this server does not
// implement (non-text content parts, best_of > 1, suffix).
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling.h"
#include "server/api_error.h"

namespace flashnext::server {

using json = nlohmann::ordered_json;

enum class Endpoint { Chat, Completion };

/// What `response_format` asks for.
enum class ResponseFormat {
  Text,        ///< free text (also when absent)
  JsonObject,  ///< {"type": "json_object"}: any JSON object
  JsonSchema,  ///< {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: JSON valid against schema
};

/// What `tool_choice` asks for (tools given).
enum class ToolChoice {
  None,      ///< no tool calls are parsed
  Auto,      ///< the model may call tools; its calls are parsed
  Required,  ///< the output is one or more tool calls (constrained)
  Named,     ///< the output is one call of ApiRequest::forced_tool (constrained)
};

/// One prompt of a completion request (text or token ids).
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;  ///< when text is absent
};

/// The most choices (n) one request may ask for, and the most prompts one completion request may carry.
inline constexpr int64_t kMaxChoices = 128;

/// Logs the unknown request fields that a lenient RequestPolicy ignores: a warning on stderr (spdlog)
///   CONTEXT: ignoring unknown request field "foo" (logged once)
/// (CONTEXT: the request's, e.g. "POST /v1/completions request_id=..."; omitted when empty) the first time each
/// field name is seen, whatever the number of requests that send it. Names are quoted as JSON
/// strings of at most kMaxNameBytes bytes of the field's place in the request ("foo", "stream_options.bar").
/// At most kMaxNames names are remembered; the name after them logs one line saying that no more are logged, so
/// that clients cannot grow the set or flood the log. Thread-safe.
class FieldLogger {
 public:
  static constexpr size_t kMaxNames = 256;
  static constexpr size_t kMaxNameBytes = 80;

  /// Logs `field` unless it (cut to kMaxNameBytes) was logged before or kMaxNames names were; returns whether this
  /// call logged it. `context` starts the line when not empty.
  bool note(std::string_view field, std::string_view context = {});
  /// The names logged so far (cut to kMaxNameBytes), in order.
  std::vector<std::string> logged() const;

 private:
  mutable std::mutex mutex_;
  std::set<std::string, std::less<>> seen_;
  std::vector<std::string> order_;
  bool full_ = false;
};

/// What the parse functions below do with a request field they do not know, at the top level of a body or in the
/// nested objects whose keys are checked: stream_options, response_format (and its json_schema), a tool_choice
/// object (and its function). Other keys inside messages and tools are dropped as before.
struct RequestPolicy {
  /// true (the default of these functions): answer 400 naming the field. false (`flashnext serve` unless
  /// --strict-requests): ignore it, as vLLM does, after logging it through `log` when that is set.
  bool strict = true;
  FieldLogger* log = nullptr;  ///< not owned; may be null (then unknown fields are ignored silently)
  std::string log_context;     ///< starts the log line (the request: method, path, request id); may be empty
};

/// A validated generation request (chat or completion).
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;  ///< as given; "" when absent
  bool stream = false;
  bool include_usage = false;     ///< stream_options.include_usage
  SamplingParams sampling;        ///< the model's defaults overridden by the request; validated
  bool max_tokens_given = false;  ///< false: the server picks max_tokens (chat: what the context leaves)
  int top_logprobs = -1;          ///< -1: no logprobs; else how many alternatives per token (0..20)
  /// -1: none; else log-probabilities of the prompt tokens with this many alternatives (vLLM's prompt_logprobs, or
  /// completions' echo with logprobs)
  int prompt_logprobs = -1;
  int64_t n = 1;                  ///< choices per prompt, 1..kMaxChoices (independent samples; seeds seed, seed+1, ...)
  int64_t priority = 0;           ///< vLLM's scheduling priority (lower first; needs --scheduling-policy priority)
  /// Speculative decoding of this request (serve --speculative): `speculative` false opts out, true asks for it
  /// (400 from the server when it runs without); `num_speculative_tokens` (>= 0) caps the drafts per step (0: off;
  /// above the server's K: 400). Absent: the server's setting. Resolved by the server into Request::speculative_tokens.
  std::optional<bool> speculative;
  std::optional<int64_t> num_speculative_tokens;
  int speculative_tokens = -1;    ///< resolved (Request::speculative_tokens): -1 the server's, 0 off, 1..K
  bool echo = false;              ///< prepend the prompt to the output (completions; chat: the last message)
  bool tokens_as_ids = false;     ///< return_tokens_as_token_ids (vLLM): logprobs name tokens "token_id:ID"
  std::string user;

  // Chat
  json messages = json::array();  ///< normalised for the template: string contents, tool_call arguments as objects
  json tools;                     ///< null or the array of tool definitions
  bool parse_tool_calls = false;  ///< tools given and tool_choice auto, required or named
  ToolChoice tool_choice = ToolChoice::None;
  std::string forced_tool;        ///< tool_choice Named: the function's name (one of `tools`)
  bool parallel_tool_calls = true;  ///< false: tool_choice required forces exactly one call
  ResponseFormat response_format = ResponseFormat::Text;
  json json_schema;               ///< response_format JsonSchema: the schema (members in document order)
  json template_vars = json::object();  ///< chat_template_kwargs, plus reasoning_effort when given top-level
  bool add_generation_prompt = true;
  bool continue_final_message = false;

  // Completion: one or more prompts (a batch gets n choices per prompt, indexed prompt-major, as OpenAI does)
  std::vector<CompletionPrompt> prompts;
};

/// Limits on the JSON of a request body, enforced while it is parsed: a document past them is rejected before it is
/// built in full or any field is looked at (deeply nested values would otherwise overflow the stack of every
/// recursive walk: copies, comparisons, the chat template, error messages).
struct JsonLimits {
  int max_depth = 64;                     ///< most nesting levels of arrays and objects; the body object is level 1
  size_t max_elements = size_t(1) << 20;  ///< most values (scalars, arrays, objects) plus object keys in the document
};

/// Parses an HTTP body within `limits`. Throws ApiError(400) on malformed JSON (the message quotes at most a short
/// excerpt of the body), a number out of the range of a double (1e309), nesting deeper than limits.max_depth, more
/// than limits.max_elements elements, or a body that is not a JSON object.
json parse_body(std::string_view body, const JsonLimits& limits = {});

/// Parses JSON that is not a request body (tool-call arguments in the model's output) within `limits`: a discarded
/// value (is_discarded()) when `text` is not valid JSON or nests or counts past the limits (the model's output can be
/// as deep as its context is long, and every walk of a JSON value recurses).
json parse_json_or_discard(std::string_view text, const JsonLimits& limits = {});

/// `value` as compact JSON text for the wire; invalid UTF-8 in strings (a model's partial token) becomes U+FFFD.
inline std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// A short description of a JSON value for error messages: its type and at most about 60 characters of its text,
/// whatever its size or depth.
std::string describe(const json& value);

/// The value of an integer JSON number (or of a float with an integral value below 2^53) when it lies in [lo, hi];
/// nullopt when `value` is not such a number. Unsigned values above INT64_MAX are never wrapped.
std::optional<int64_t> integer_in(const json& value, int64_t lo, int64_t hi);

/// /v1/chat/completions. `defaults`: the model's sampling defaults (generation_config.json); `vocab_size` bounds
/// token ids (stop_token_ids); `policy`: what to do with unknown fields.
ApiRequest parse_chat_request(const json& body, const SamplingParams& defaults, int64_t vocab_size,
                              const RequestPolicy& policy = {});
/// /v1/completions (max_tokens defaults to 16, as in the OpenAI API and vLLM).
ApiRequest parse_completion_request(const json& body, const SamplingParams& defaults, int64_t vocab_size,
                                    const RequestPolicy& policy = {});

/// /tokenize (vLLM): either `prompt` (text) or `messages` (+ tools, chat_template_kwargs, add_generation_prompt).
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  json messages;  ///< normalised like a chat request's, or null
  json tools;
  json template_vars = json::object();
  bool add_generation_prompt = true;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize_request(const json& body, const RequestPolicy& policy = {});

/// /detokenize (vLLM): `tokens`, each in [0, vocab_size).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(const json& body, int64_t vocab_size, const RequestPolicy& policy = {});

/// Checks a chat `messages` array and normalises it for the chat template: contents become strings (text parts
/// joined with "\n", null -> ""), the "developer" role becomes "system", `reasoning` is renamed `reasoning_content`, tool_call `arguments` given as JSON
/// text become objects. Throws ApiError(400) naming `messages[i]...`.
json normalize_messages(const json& messages);

/// Checks a `tools` array (function tools: {"type": "function", "function": {"name", "description"?,
/// "parameters"?}}). Throws ApiError(400).
void check_tools(const json& tools);

}  // namespace flashnext::server
