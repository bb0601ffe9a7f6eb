#include "server/responses_api.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "server/ids.h"
#include "server/openai_schema.h"
#include "server/sse.h"

namespace flashnext::server {

namespace {

// ---- request side -------------------------------------------------------------------------------------------------

[[noreturn]] void type_error(const std::string& where, const char* expected, const json& got) {
  bad_request(where, "field \"{}\" must be {}, got {}", where, expected, describe(got));
}

// The value of `key` in object `obj`, or nullptr when it is absent or null.
const json* get(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// Field `key` of `obj` (located at `prefix`, "" or "input[2].") as a string; nullopt when absent or null.
std::optional<std::string> string_of(const json& obj, std::string_view key, const std::string& prefix) {
  const json* v = get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) type_error(prefix + std::string(key), "a string", *v);
  return v->get<std::string>();
}

// The string field `key` of `obj`, which must be present.
std::string required_string(const json& obj, std::string_view key, const std::string& prefix) {
  auto v = string_of(obj, key, prefix);
  if (!v) bad_request(prefix + std::string(key), "field \"{}{}\" is required", prefix, key);
  return *v;
}

void check_object(const json& v, const std::string& where) {
  if (!v.is_object()) type_error(where, "a JSON object", v);
}

void check_type(const json& obj, std::string_view key, json::value_t type, const char* expected,
                const std::string& prefix = "") {
  const json* v = get(obj, key);
  if (!v) return;
  const bool ok = type == json::value_t::number_float ? v->is_number() : v->type() == type;
  if (!ok) type_error(prefix + std::string(key), expected, *v);
}

// Keys of `obj` outside `known`: 400 under a strict policy, else logged once per name and ignored (as the chat
// endpoint does with the same policy).
void only(const json& obj, const std::set<std::string_view>& known, const std::string& prefix,
          const RequestPolicy& policy) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key())) continue;
    if (!policy.strict) {
      if (policy.log) policy.log->note(prefix + clip(it.key(), FieldLogger::kMaxNameBytes), policy.log_context);
      continue;
    }
    bad_request(prefix + clip(it.key()), "unknown field \"{}{}\"{}; this server does not support it", prefix,
                  clip(it.key()), prefix.empty() ? " in the request" : "");
  }
}

// Text parts (input_text, output_text, refusal) of a message content or a function_call_output output, as chat
// text parts ({"type": "text", "text"}); `where` is the array's field ("input[2].content").
json text_parts(const json& parts, const std::string& where) {
  json out = json::array();
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string pw = fmt::format("{}[{}]", where, j);
    check_object(parts[j], pw);
    const std::string type = required_string(parts[j], "type", pw + ".");
    std::string text;
    if (type == "input_text" || type == "output_text") {
      text = required_string(parts[j], "text", pw + ".");
    } else if (type == "refusal") {
      text = required_string(parts[j], "refusal", pw + ".");
    } else {
      bad_request(pw + ".type",
                  "content part type \"{}\" is not supported by this server (text only: input_text, output_text)",
                  clip(type));
    }
    out.push_back({{"type", "text"}, {"text", std::move(text)}});
  }
  return out;
}

// A content (string or text parts) in the chat form: the string, or the parts as chat text parts.
json content_of(const json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) type_error(where, "a string or an array of content parts", content);
  return text_parts(content, where);
}

// The text of a reasoning item: its reasoning_text content, else its summary, parts joined with "\n".
std::string reasoning_text(const json& item, const std::string& prefix) {
  for (const char* key : {"content", "summary"}) {
    const json* parts = get(item, key);
    if (!parts) continue;
    if (!parts->is_array()) type_error(prefix + key, "an array", *parts);
    std::string text;
    for (size_t j = 0; j < parts->size(); ++j) {
      const std::string pw = fmt::format("{}{}[{}]", prefix, key, j);
      check_object((*parts)[j], pw);
      if (j) text += "\n";
      text += required_string((*parts)[j], "text", pw + ".");
    }
    if (!text.empty()) return text;
  }
  return {};
}

// Builds the chat messages from `instructions` and `input`, remembering where each came from.
class MessageBuilder {
 public:
  json messages = json::array();
  std::vector<std::pair<std::string, std::string>> fields;

  void instructions(const std::string& text) {
    map(key() + ".content", "instructions");
    map(key(), "instructions");
    push({{"role", "system"}, {"content", text}});
  }

  void input(const json& input) {
    if (input.is_string()) {
      map(key(), "input");
      push({{"role", "user"}, {"content", input}});
      return;
    }
    if (!input.is_array()) type_error("input", "a string or an array of input items", input);
    for (size_t i = 0; i < input.size(); ++i) item(input[i], fmt::format("input[{}]", i));
  }

 private:
  std::string key() const { return fmt::format("messages[{}]", messages.size()); }
  void map(std::string chat, std::string responses) { fields.emplace_back(std::move(chat), std::move(responses)); }
  void push(json msg) { messages.push_back(std::move(msg)); }

  // An assistant message, carrying the reasoning item that came before it.
  json assistant() {
    json msg = {{"role", "assistant"}};
    if (reasoning_) msg["reasoning_content"] = std::move(*reasoning_);
    reasoning_.reset();
    return msg;
  }

  void item(const json& it, const std::string& where) {
    check_object(it, where);
    const std::string p = where + ".";
    std::string type = string_of(it, "type", p).value_or(get(it, "role") ? "message" : "");
    if (type.empty()) bad_request(p + "type", "field \"{}type\" is required", p);
    if (type == "message") {
      const std::string role = required_string(it, "role", p);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad_request(p + "role", "field \"{}role\" must be one of user, system, developer, assistant; got \"{}\"", p,
                    clip(role));
      const json* content = get(it, "content");
      if (!content) bad_request(p + "content", "field \"{}content\" is required", p);
      if (role != "assistant") reasoning_.reset();  // reasoning belongs to the assistant turn right after it
      json msg = role == "assistant" ? assistant() : json{{"role", role}};
      msg["content"] = content_of(*content, p + "content");
      map(key(), where);
      push(std::move(msg));
    } else if (type == "function_call") {
      const std::string call_id = required_string(it, "call_id", p);
      const std::string name = required_string(it, "name", p);
      const std::string arguments = required_string(it, "arguments", p);
      // Calls join the assistant message before them (its text, or the calls made with them in parallel) unless a
      // reasoning item came in between; otherwise they start one.
      if (messages.empty() || messages.back()["role"] != "assistant" || reasoning_) {
        map(key(), where);
        push(assistant());
      }
      json& msg = messages.back();
      if (!msg.contains("tool_calls")) msg["tool_calls"] = json::array();
      const std::string call_key =
          fmt::format("messages[{}].tool_calls[{}]", messages.size() - 1, msg["tool_calls"].size());
      map(call_key + ".function", where);
      map(call_key, where);
      msg["tool_calls"].push_back(
          {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(it, "call_id", p);
      const json* output = get(it, "output");
      if (!output) bad_request(p + "output", "field \"{}output\" is required", p);
      map(key() + ".content", p + "output");
      map(key(), where);
      push({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_of(*output, p + "output")}});
    } else if (type == "reasoning") {
      std::string text = reasoning_text(it, p);
      if (!text.empty()) reasoning_ = reasoning_ ? *reasoning_ + "\n" + text : text;
    } else if (type == "item_reference") {
      bad_request(p + "type",
                  "input items of type \"item_reference\" are not supported: the server stores no "
                  "responses; send the items themselves");
    } else {
      bad_request(p + "type",
                  "input item type \"{}\" is not supported by this server (message, function_call, "
                  "function_call_output, reasoning)",
                  clip(type));
    }
  }

  std::optional<std::string> reasoning_;  // a reasoning item waiting for its assistant message
};

const std::set<std::string_view> kResponsesFields = {"model",
                                                     "input",
                                                     "instructions",
                                                     "tools",
                                                     "tool_choice",
                                                     "max_output_tokens",
                                                     "temperature",
                                                     "top_p",
                                                     "text",
                                                     "reasoning",
                                                     "stream",
                                                     "stream_options",
                                                     "store",
                                                     "previous_response_id",
                                                     "conversation",
                                                     "metadata",
                                                     "user",
                                                     "parallel_tool_calls",
                                                     "truncation",
                                                     "include",
                                                     "top_logprobs",
                                                     "max_tool_calls",
                                                     "background",
                                                     "service_tier",
                                                     "prompt",
                                                     "prompt_cache_key",
                                                     "prompt_cache_retention",
                                                     "safety_identifier"};

// tools: Responses' flat function tools -> chat's nested form. Returns the chat tools.
json translate_tools(const json& tools, ResponsesRequest& r) {
  if (!tools.is_array()) type_error("tools", "an array", tools);
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string tw = fmt::format("tools[{}]", i);
    check_object(tools[i], tw);
    const std::string type = required_string(tools[i], "type", tw + ".");
    if (type != "function")
      bad_request(tw + ".type", "tool type \"{}\" is not supported by this server (only \"function\" tools)",
                  clip(type));
    json fn = json::object();
    for (const char* key : {"name", "description", "parameters", "strict"}) {
      if (const json* v = get(tools[i], key)) fn[key] = *v;
    }
    if (!fn.contains("name")) bad_request(tw + ".name", "field \"{}.name\" is required", tw);
    r.fields.emplace_back(tw + ".function", tw);
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice: strings as given; {"type": "function", "name"} -> {"type": "function", "function": {"name"}}.
json translate_tool_choice(const json& tc) {
  if (tc.is_string()) return tc;
  if (!tc.is_object()) type_error("tool_choice", "a string or an object", tc);
  const std::string type = required_string(tc, "type", "tool_choice.");
  if (type != "function")
    bad_request("tool_choice.type",
                "tool_choice type \"{}\" is not supported by this server (only \"auto\", \"none\", \"required\" and "
                "{{\"type\": \"function\", \"name\": ...}})",
                clip(type));
  return {{"type", "function"}, {"function", {{"name", required_string(tc, "name", "tool_choice.")}}}};
}

// text.format -> response_format.
json translate_text_format(const json& format) {
  check_object(format, "text.format");
  const std::string type = required_string(format, "type", "text.format.");
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema")
    bad_request("text.format.type",
                "field \"text.format.type\" must be \"text\", \"json_object\" or \"json_schema\", "
                "got \"{}\"",
                clip(type));
  json schema = json::object();
  for (const char* key : {"name", "description", "schema", "strict"}) {
    if (const json* v = get(format, key)) schema[key] = *v;
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

// ---- output side --------------------------------------------------------------------------------------------------


}  // namespace

ApiError ResponsesRequest::remap(const ApiError& error) const {
  const std::string& param = error.param();
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& f : fields) {
    const std::string& key = f.first;
    if (param.compare(0, key.size(), key) != 0) continue;
    if (param.size() > key.size() && param[key.size()] != '.' && param[key.size()] != '[') continue;
    if (!best || key.size() > best->first.size()) best = &f;
  }
  if (!best) return error;
  const std::string renamed = best->second + param.substr(best->first.size());
  std::string message = error.what();
  auto replace_all = [&message](const std::string& from, const std::string& to) {
    if (from.empty() || from == to) return;
    for (size_t pos = message.find(from); pos != std::string::npos; pos = message.find(from, pos + to.size()))
      message.replace(pos, from.size(), to);
  };
  replace_all(param, renamed);
  if (best->first != param) replace_all(best->first, best->second);
  return ApiError(error.status(), message, renamed);
}

ResponsesRequest translate_responses_request(const json& body, const RequestPolicy& policy) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object, got {}", describe(body));
  only(body, kResponsesFields, "", policy);
  ResponsesRequest r;
  json& chat = r.chat;
  json& echo = r.echo;

  if (get(body, "previous_response_id"))
    bad_request("previous_response_id",
                "previous_response_id is not supported: the server stores no responses; send the whole conversation "
                "in \"input\"");
  if (get(body, "conversation"))
    bad_request("conversation",
                "conversation is not supported: the server stores no conversations; send the whole "
                "conversation in \"input\"");
  if (get(body, "prompt")) bad_request("prompt", "prompt (stored prompt templates) is not supported by this server");
  check_type(body, "background", json::value_t::boolean, "a boolean");
  if (const json* v = get(body, "background"); v && v->get<bool>())
    bad_request("background", "background responses are not supported by this server");
  if (const json* v = get(body, "top_logprobs"); v && !(v->is_number_integer() && v->get<int64_t>() == 0))
    bad_request("top_logprobs", "top_logprobs is not supported on /v1/responses by this server");
  if (get(body, "max_tool_calls")) bad_request("max_tool_calls", "max_tool_calls is not supported by this server");
  if (auto t = string_of(body, "truncation", ""); t && *t != "disabled")
    bad_request("truncation",
                "truncation \"{}\" is not supported by this server (only \"disabled\": an input "
                "longer than the context is an error)",
                clip(*t));
  if (const json* include = get(body, "include")) {
    if (!include->is_array()) type_error("include", "an array of strings", *include);
    for (size_t i = 0; i < include->size(); ++i) {
      const json& v = (*include)[i];
      const std::string iw = fmt::format("include[{}]", i);
      if (!v.is_string()) type_error(iw, "a string", v);
      if (v == "message.output_text.logprobs")
        bad_request(iw, "include \"message.output_text.logprobs\" is not supported by this server");
    }
  }
  check_type(body, "store", json::value_t::boolean, "a boolean");  // true or false: nothing is stored either way
  check_type(body, "metadata", json::value_t::object, "an object");
  for (const char* key : {"service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier"})
    string_of(body, key, "");

  if (auto v = string_of(body, "model", "")) chat["model"] = *v;
  MessageBuilder messages;
  auto instructions = string_of(body, "instructions", "");
  if (instructions) messages.instructions(*instructions);
  const json* input = get(body, "input");
  if (!input) bad_request("input", "field \"input\" is required");
  messages.input(*input);
  chat["messages"] = std::move(messages.messages);
  r.fields = std::move(messages.fields);
  r.fields.emplace_back("messages", "input");

  check_type(body, "stream", json::value_t::boolean, "a boolean");
  r.stream = get(body, "stream") && body["stream"].get<bool>();
  if (r.stream) chat["stream"] = true;
  if (const json* so = get(body, "stream_options")) {
    check_object(*so, "stream_options");
    if (!r.stream) bad_request("stream_options", "stream_options can only be given when stream is true");
    only(*so, {"include_obfuscation"}, "stream_options.", policy);
    check_type(*so, "include_obfuscation", json::value_t::boolean, "a boolean", "stream_options.");
  }

  json tools = json::array();
  if (const json* t = get(body, "tools")) {
    chat["tools"] = translate_tools(*t, r);
    tools = *t;
  }
  json tool_choice = "auto";
  if (const json* tc = get(body, "tool_choice")) {
    chat["tool_choice"] = translate_tool_choice(*tc);
    tool_choice = *tc;
    r.fields.emplace_back("tool_choice.function", "tool_choice");
  }
  check_type(body, "parallel_tool_calls", json::value_t::boolean, "a boolean");
  const json* parallel = get(body, "parallel_tool_calls");
  if (parallel) chat["parallel_tool_calls"] = *parallel;

  if (const json* v = get(body, "max_output_tokens")) chat["max_tokens"] = *v;
  r.fields.emplace_back("max_tokens", "max_output_tokens");
  for (const char* key : {"temperature", "top_p"}) {
    check_type(body, key, json::value_t::number_float, "a number");
    if (const json* v = get(body, key)) chat[key] = *v;
  }

  json text = {{"format", {{"type", "text"}}}};
  if (const json* t = get(body, "text")) {
    check_object(*t, "text");
    only(*t, {"format", "verbosity"}, "text.", policy);
    string_of(*t, "verbosity", "text.");  // a hint to OpenAI's models; no effect here
    if (const json* format = get(*t, "format")) chat["response_format"] = translate_text_format(*format);
    text = *t;
    if (!get(text, "format")) text["format"] = {{"type", "text"}};
  }
  r.fields.emplace_back("response_format.json_schema", "text.format");
  r.fields.emplace_back("response_format", "text.format");

  json reasoning = nullptr;
  if (const json* re = get(body, "reasoning")) {
    check_object(*re, "reasoning");
    only(*re, {"effort", "summary", "generate_summary"}, "reasoning.", policy);
    if (auto effort = string_of(*re, "effort", "reasoning.")) chat["reasoning_effort"] = *effort;
    string_of(*re, "summary", "reasoning.");
    string_of(*re, "generate_summary", "reasoning.");
    reasoning = {{"effort", re->value("effort", json(nullptr))}, {"summary", re->value("summary", json(nullptr))}};
  }
  r.fields.emplace_back("reasoning_effort", "reasoning.effort");
  auto user = string_of(body, "user", "");
  if (user) chat["user"] = *user;

  echo["instructions"] = instructions ? json(*instructions) : json(nullptr);
  echo["max_output_tokens"] = body.value("max_output_tokens", json(nullptr));
  echo["parallel_tool_calls"] = parallel ? *parallel : json(true);
  echo["reasoning"] = reasoning;
  echo["text"] = text;
  echo["tool_choice"] = tool_choice;
  echo["tools"] = tools;
  echo["temperature"] = body.value("temperature", json(nullptr));
  echo["top_p"] = body.value("top_p", json(nullptr));
  echo["truncation"] = "disabled";
  echo["user"] = user ? json(*user) : json(nullptr);
  echo["metadata"] = get(body, "metadata") ? body["metadata"] : json::object();
  if (auto tier = string_of(body, "service_tier", "")) echo["service_tier"] = *tier;

  std::stable_sort(r.fields.begin(), r.fields.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return r;
}

// ------------------------------------------------------------------------------------------------------------------

ResponsesWriter::ResponsesWriter(json echo, std::string id, std::string model, int64_t created_at, bool stream)
    : echo_(std::move(echo)), id_(std::move(id)), model_(std::move(model)), created_at_(created_at), stream_(stream) {}

std::string ResponsesWriter::event(const char* type, json data) {
  if (!stream_) return {};
  json e = {{"type", type}};
  for (auto it = data.begin(); it != data.end(); ++it) e[it.key()] = std::move(it.value());
  e["sequence_number"] = sequence_++;
  return fmt::format("event: {}\n", type) + sse_event(dump_json(e));
}

std::string ResponsesWriter::start() {
  std::string out = event("response.created", {{"response", response()}});
  out += event("response.in_progress", {{"response", response()}});
  return out;
}

std::string ResponsesWriter::open(Kind kind) {
  std::string out = close("completed");
  json item;
  json part;
  if (kind == Kind::Reasoning) {
    item = {{"id", "rs_" + random_hex(32)},
            {"type", "reasoning"},
            {"summary", json::array()},
            {"content", json::array()},
            {"status", "in_progress"}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  } else {
    item = {{"id", "msg_" + random_hex(32)},
            {"type", "message"},
            {"role", "assistant"},
            {"status", "in_progress"},
            {"content", json::array()}};
    part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }
  output_.push_back(item);
  open_ = kind;
  text_.clear();
  const size_t index = output_.size() - 1;
  out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  out += event("response.content_part.added",
               {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  return out;
}

std::string ResponsesWriter::close(const char* status) {
  if (open_ == Kind::None) return {};
  json& item = output_.back();
  const size_t index = output_.size() - 1;
  const json id = item["id"];
  std::string out;
  json part;
  if (open_ == Kind::Reasoning) {
    part = {{"type", "reasoning_text"}, {"text", text_}};
    out += event("response.reasoning_text.done",
                 {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
  } else {
    part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}, {"logprobs", json::array()}};
    out += event(
        "response.output_text.done",
        {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
  }
  out += event("response.content_part.done",
               {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  item["content"] = json::array({part});
  item["status"] = status;
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Kind::None;
  text_.clear();
  return out;
}

std::string ResponsesWriter::add_call(const ToolCall& call) {
  json item = {{"id", "fc_" + random_hex(32)}, {"type", "function_call"}, {"status", "in_progress"}, {"arguments", ""},
               {"call_id", call.id},           {"name", call.name}};
  const size_t index = output_.size();
  std::string out = event("response.output_item.added", {{"output_index", index}, {"item", item}});
  out += event("response.function_call_arguments.delta",
               {{"item_id", item["id"]}, {"output_index", index}, {"delta", call.arguments}});
  out += event("response.function_call_arguments.done",
               {{"item_id", item["id"]}, {"output_index", index}, {"arguments", call.arguments}});
  item["arguments"] = call.arguments;
  item["status"] = "completed";
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  return out;
}

std::string ResponsesWriter::add(const std::string& reasoning, const std::string& content,
                                 const std::vector<ToolCall>& calls) {
  std::string out;
  if (!reasoning.empty()) {
    if (open_ != Kind::Reasoning) out += open(Kind::Reasoning);
    text_ += reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", output_.back()["id"]},
                                                   {"output_index", output_.size() - 1},
                                                   {"content_index", 0},
                                                   {"delta", reasoning}});
  }
  if (!content.empty()) {
    if (open_ != Kind::Message) out += open(Kind::Message);
    text_ += content;
    out += event("response.output_text.delta", {{"item_id", output_.back()["id"]},
                                                {"output_index", output_.size() - 1},
                                                {"content_index", 0},
                                                {"delta", content},
                                                {"logprobs", json::array()}});
  }
  for (const ToolCall& call : calls) {
    out += close("completed");
    out += add_call(call);
  }
  return out;
}

std::string ResponsesWriter::finish(const std::string& finish_reason, const ResponsesUsage& usage) {
  const bool incomplete = finish_reason == "length";
  std::string out = close(incomplete ? "incomplete" : "completed");
  const bool answered = std::any_of(output_.begin(), output_.end(), [](const json& item) {
    return item["type"] == "message" || item["type"] == "function_call";
  });
  if (!answered) {  // nothing but reasoning, or nothing at all: an empty message, so that the response has one
    out += open(Kind::Message);
    out += close(incomplete ? "incomplete" : "completed");
  }
  status_ = incomplete ? "incomplete" : "completed";
  if (incomplete) incomplete_details_ = {{"reason", "max_output_tokens"}};
  usage_ = {{"input_tokens", usage.input_tokens},
            {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}, {"cache_write_tokens", 0}}},
            {"output_tokens", usage.output_tokens},
            {"output_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}},
            {"total_tokens", usage.input_tokens + usage.output_tokens}};
  out += event(incomplete ? "response.incomplete" : "response.completed", {{"response", response()}});
  return out;
}

std::string ResponsesWriter::fail(const std::string& message) {
  if (open_ != Kind::None) {  // keep what was generated, without the item's done events
    json& item = output_.back();
    item["content"] = json::array({open_ == Kind::Reasoning ? json{{"type", "reasoning_text"}, {"text", text_}}
                                                            : json{{"type", "output_text"},
                                                                   {"text", text_},
                                                                   {"annotations", json::array()},
                                                                   {"logprobs", json::array()}}});
    item["status"] = "incomplete";
    open_ = Kind::None;
  }
  status_ = "failed";
  error_ = {{"code", "server_error"}, {"message", message}};
  return event("response.failed", {{"response", response()}});
}

json ResponsesWriter::response() const {
  auto echoed = [this](const char* key) { return echo_.value(key, json(nullptr)); };
  json r = {{"id", id_},
            {"object", "response"},
            {"created_at", created_at_},
            {"status", status_},
            {"background", false},
            {"error", error_},
            {"incomplete_details", incomplete_details_},
            {"instructions", echoed("instructions")},
            {"max_output_tokens", echoed("max_output_tokens")},
            {"model", model_},
            {"output", output_},
            {"parallel_tool_calls", echo_.value("parallel_tool_calls", json(true))},
            {"previous_response_id", nullptr},
            {"reasoning", echoed("reasoning")},
            {"store", false},
            {"temperature", echoed("temperature")},
            {"text", echo_.value("text", json{{"format", {{"type", "text"}}}})},
            {"tool_choice", echo_.value("tool_choice", json("auto"))},
            {"tools", echo_.value("tools", json::array())},
            {"top_p", echoed("top_p")},
            {"truncation", echo_.value("truncation", json("disabled"))},
            {"usage", usage_},
            {"user", echoed("user")},
            {"metadata", echo_.value("metadata", json::object())}};
  if (echo_.contains("service_tier")) r["service_tier"] = echo_["service_tier"];
  return r;
}

}  // namespace flashnext::server
