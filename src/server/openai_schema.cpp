#include "server/openai_schema.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/request.h"

namespace flashnext::server {

namespace {

constexpr size_t kDescribeChars = 60;  // text of a value quoted in an error message

// The JSON text of string `s`, cut to about `budget` bytes of its content.
std::string string_preview(const std::string& s, size_t budget) {
  return json(s.substr(0, std::min(s.size(), budget + 1))).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Appends the JSON text of `v` to `out` until `out` holds `budget` bytes: the cost is O(budget) whatever the size
// or depth of `v` (each level of recursion appends a byte first, so it recurses at most `budget` levels).
void preview(const json& v, std::string& out, size_t budget) {
  if (out.size() >= budget) return;
  switch (v.type()) {
    case json::value_t::array:
      out += '[';
      for (auto it = v.begin(); it != v.end() && out.size() < budget; ++it) {
        if (it != v.begin()) out += ',';
        preview(*it, out, budget);
      }
      out += ']';
      return;
    case json::value_t::object:
      out += '{';
      for (auto it = v.begin(); it != v.end() && out.size() < budget; ++it) {
        if (it != v.begin()) out += ',';
        out += string_preview(it.key(), budget - std::min(budget, out.size()));
        out += ':';
        preview(it.value(), out, budget);
      }
      out += '}';
      return;
    case json::value_t::string:
      out += string_preview(v.get_ref<const std::string&>(), budget - out.size());
      return;
    default:
      out += v.dump();  // a number, boolean or null: a few bytes
  }
}

// At most `max` bytes of `text` (a library message that may quote the request), marked when cut.
std::string excerpt(std::string text, size_t max = 200) {
  if (text.size() > max) text = text.substr(0, max - 3) + "...";
  return text;
}

// Parses `text` within `limits`; `what` names it in errors ("the request body", "field \"x\"") and `param` is the
// field reported. The callback runs as each value starts, so a document past the limits stops being read there.
json parse_limited(std::string_view text, const JsonLimits& limits, const std::string& what, const std::string& param) {
  size_t elements = 0;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json&) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // `depth` counts the open containers around this one.
        if (depth >= limits.max_depth)
          bad_request(param, "{} nests arrays and objects deeper than {} levels", what, limits.max_depth);
        [[fallthrough]];
      case json::parse_event_t::key:
      case json::parse_event_t::value:
        if (++elements > limits.max_elements)
          bad_request(param, "{} has more than {} JSON elements (values and keys)", what, limits.max_elements);
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::out_of_range& e) {  // 406: a number beyond the range of a double, such as 1e309
    std::string why = e.what();
    if (auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    bad_request(param, "{} has a number out of range: {}", what, excerpt(why));
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> keep the part after the tag; the
    // library quotes the last token read, which may be as long as the body.
    std::string why = e.what();
    if (auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    bad_request(param, "{} is not valid JSON: {}", what, excerpt(why));
  }
}

// Whether `v` is an integer number or a float with an integral value (whatever its magnitude).
bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d);
}

// Whether the integral number `v` is below `lo`.
bool is_below(const json& v, int64_t lo) {
  if (v.is_number_unsigned()) return lo > 0 && v.get<uint64_t>() < uint64_t(lo);  // the parser's 0, 1, ...
  if (v.is_number_integer()) return v.get<int64_t>() < lo;
  return v.get<double>() < double(lo);
}

// Typed access to the fields of one JSON object; `prefix` locates it in the request ("" or "messages[2].");
// `policy` (null: strict) decides what only() does with unknown fields.
class Fields {
 public:
  Fields(const json& obj, std::string prefix, const RequestPolicy* policy = nullptr)
      : obj_(obj), prefix_(std::move(prefix)), policy_(policy) {
    if (!obj.is_object())
      bad_request(prefix_.empty() ? "" : self(), "{} must be a JSON object, got {}",
                  prefix_.empty() ? "the request body" : self(), describe(obj));
  }

  // The value of `key`, or nullptr when it is absent or null.
  const json* get(std::string_view key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<bool> boolean(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) type_error(key, "a boolean", *v);
    return v->get<bool>();
  }
  // An integer field in [lo, hi] (100.0 is accepted as an integer, as pydantic's lax mode does; 1.5 is not).
  // Out of range: "must be >= lo" / "must be <= hi" with the value as sent, never a wrapped one.
  std::optional<int64_t> integer(std::string_view key, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (auto i = integer_in(*v, lo, hi)) return i;
    if (!is_integral(*v)) type_error(key, "an integer", *v);
    if (hi != INT64_MAX && lo != INT64_MIN)
      bad_request(where(key), "{} must be in [{}, {}], got {}", where(key), lo, hi, v->dump());
    if (is_below(*v, lo)) bad_request(where(key), "{} must be >= {}, got {}", where(key), lo, v->dump());
    bad_request(where(key), "{} must be <= {}, got {}", where(key), hi, v->dump());
  }
  std::optional<double> number(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) type_error(key, "a number", *v);
    return v->get<double>();
  }
  std::optional<std::string> string(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) type_error(key, "a string", *v);
    return v->get<std::string>();
  }
  const json* object(std::string_view key) const {
    const json* v = get(key);
    if (v && !v->is_object()) type_error(key, "an object", *v);
    return v;
  }
  const json* array(std::string_view key) const {
    const json* v = get(key);
    if (v && !v->is_array()) type_error(key, "an array", *v);
    return v;
  }
  // Keys outside `known`: under a strict policy a 400 (as the OpenAI API answers an unrecognised argument: a
  // misspelt parameter is not silently ignored); else ignored, as vLLM does, and logged once per name.
  void only(const std::set<std::string_view>& known) const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (known.count(it.key())) continue;
      if (policy_ && !policy_->strict) {
        if (policy_->log) policy_->log->note(where(clip(it.key(), FieldLogger::kMaxNameBytes)), policy_->log_context);
        continue;
      }
      bad_request(where(clip(it.key())), "unknown field \"{}\"{}; this server does not support it",
                  where(clip(it.key())), prefix_.empty() ? " in the request" : "");
    }
  }
  const RequestPolicy* policy() const { return policy_; }
  std::string where(std::string_view key) const { return prefix_ + std::string(key); }

  [[noreturn]] void type_error(std::string_view key, const char* expected, const json& got) const {
    bad_request(where(key), "field \"{}\" must be {}, got {}", where(key), expected, describe(got));
  }

 private:
  std::string self() const { return prefix_.substr(0, prefix_.size() - 1); }  // "messages[2]" of "messages[2]."
  const json& obj_;
  std::string prefix_;
  const RequestPolicy* policy_;
};

// Fields shared by both generation endpoints (OpenAI + vLLM sampling extensions).
const std::set<std::string_view> kSamplingFields = {"model",
                                                    "stream",
                                                    "stream_options",
                                                    "max_tokens",
                                                    "temperature",
                                                    "top_p",
                                                    "top_k",
                                                    "min_p",
                                                    "n",
                                                    "stop",
                                                    "seed",
                                                    "presence_penalty",
                                                    "frequency_penalty",
                                                    "repetition_penalty",
                                                    "logit_bias",
                                                    "user",
                                                    "stop_token_ids",
                                                    "ignore_eos",
                                                    "include_stop_str_in_output",
                                                    "skip_special_tokens",
                                                    "echo",
                                                    "logprobs",
                                                    "return_tokens_as_token_ids",
                                                    "min_tokens",
                                                    "priority",
                                                    "prompt_logprobs",
                                                    "speculative",
                                                    "num_speculative_tokens"};

void parse_sampling(const Fields& f, ApiRequest& r, const SamplingParams& defaults, int64_t vocab_size) {
  r.sampling = defaults;
  SamplingParams& p = r.sampling;
  if (auto v = f.string("model")) r.model = *v;
  if (auto v = f.string("user")) r.user = *v;
  r.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.object("stream_options")) {
    if (!r.stream) bad_request("stream_options", "stream_options can only be given when stream is true");
    Fields o(*so, "stream_options.", f.policy());
    o.only({"include_usage", "continuous_usage_stats"});
    r.include_usage = o.boolean("include_usage").value_or(false);
    if (o.boolean("continuous_usage_stats").value_or(false))
      bad_request("stream_options.continuous_usage_stats", "stream_options.continuous_usage_stats is not supported");
  }
  if (auto v = f.integer("n", 1, kMaxChoices)) r.n = *v;
  if (const json* lb = f.object("logit_bias")) {
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 18 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id >= vocab_size)
        bad_request("logit_bias", "logit_bias key \"{}\" must be a token id in [0, {})", clip(key), vocab_size);
      if (!it.value().is_number() || !(it.value().get<double>() >= -100 && it.value().get<double>() <= 100))
        bad_request("logit_bias", "logit_bias[\"{}\"] must be a number in [-100, 100], got {}", key,
                    describe(it.value()));
      p.logit_bias.emplace_back(int32_t(id), it.value().get<float>());
    }
  }
  if (auto v = f.integer("min_tokens", 0)) p.min_tokens = *v;
  if (auto v = f.integer("priority")) r.priority = *v;
  r.speculative = f.boolean("speculative");
  r.num_speculative_tokens = f.integer("num_speculative_tokens", 0);
  if (r.speculative && r.num_speculative_tokens && *r.speculative != (*r.num_speculative_tokens > 0))
    bad_request("num_speculative_tokens", "num_speculative_tokens {} contradicts speculative: {}",
                *r.num_speculative_tokens, *r.speculative);
  if (auto v = f.integer("prompt_logprobs", 0, kMaxTopLogprobs)) r.prompt_logprobs = int(*v);
  if (auto v = f.boolean("skip_special_tokens"); v && !*v)
    bad_request("skip_special_tokens", "skip_special_tokens=false is not supported by this server");
  if (auto v = f.number("temperature")) p.temperature = *v;
  if (auto v = f.number("top_p")) p.top_p = *v;
  if (auto v = f.integer("top_k")) p.top_k = *v;
  if (auto v = f.number("min_p")) p.min_p = *v;
  if (auto v = f.number("presence_penalty")) p.presence_penalty = *v;
  if (auto v = f.number("frequency_penalty")) p.frequency_penalty = *v;
  if (auto v = f.number("repetition_penalty")) p.repetition_penalty = *v;
  if (auto v = f.integer("seed")) p.seed = uint64_t(*v);
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  r.tokens_as_ids = f.boolean("return_tokens_as_token_ids").value_or(false);
  if (const json* s = f.get("stop")) {
    p.stop.clear();
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) bad_request("stop", "stop[{}] must be a string, got {}", i, describe((*s)[i]));
        p.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      f.type_error("stop", "a string or an array of strings", *s);
    }
  }
  if (const json* ids = f.array("stop_token_ids")) {
    for (size_t i = 0; i < ids->size(); ++i) {
      const json& id = (*ids)[i];
      if (!id.is_number_integer())
        bad_request("stop_token_ids", "stop_token_ids[{}] must be an integer, got {}", i, describe(id));
      const auto v = integer_in(id, 0, vocab_size - 1);
      if (!v)
        bad_request("stop_token_ids",
                    "stop token id {} (stop_token_ids[{}]) is out of range [0, {}) of the model's vocabulary",
                    id.dump(), i, vocab_size);
      p.stop_token_ids.push_back(*v);
    }
  }
  // max_tokens 0 scores the prompt only: completions with echo (lm-eval-harness loglikelihood requests).
  const bool scoring = r.endpoint == Endpoint::Completion && f.boolean("echo").value_or(false);
  if (auto v = f.integer("max_tokens", scoring ? 0 : 1)) {
    p.max_tokens = *v;
    r.max_tokens_given = true;
  }
  if (auto v = f.integer("seed"); v && r.n > 1 && uint64_t(*v) > UINT64_MAX - uint64_t(r.n))
    bad_request("seed", "seed + n - 1 must fit in 64 bits (choice i is seeded with seed + i)");
}

// Runs the engine's range checks (engine/sampling.h validate) and reports a failure as a 400.
void validate_sampling(const ApiRequest& r, int64_t vocab_size) {
  try {
    validate(r.sampling, vocab_size);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("sampling: ", 0) == 0) msg = msg.substr(10);
    std::string param = msg.substr(0, msg.find(' '));  // the engine's messages start with the field name
    if (msg.rfind("stop token id", 0) == 0) param = "stop_token_ids";
    throw ApiError(400, msg, param);
  }
}

// Text of a message content: a string, null (""), or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_request(where, "field \"{}\" must be a string or an array of content parts, got {}", where, describe(content));
  std::string out;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string pw = fmt::format("{}[{}]", where, j);
    Fields part(content[j], pw + ".");
    auto type = part.string("type");
    if (!type) bad_request(pw + ".type", "field \"{}.type\" is required", pw);
    if (*type != "text")
      bad_request(pw + ".type", "content part type \"{}\" is not supported by this server (text only)", clip(*type));
    auto text = part.string("text");
    if (!text) bad_request(pw + ".text", "field \"{}.text\" is required", pw);
    if (j) out += "\n";
    out += *text;
  }
  return out;
}

json normalize_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) bad_request(where, "field \"{}\" must be an array, got {}", where, describe(calls));
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string cw = fmt::format("{}[{}]", where, k);
    Fields c(calls[k], cw + ".");
    if (auto t = c.string("type"); t && *t != "function")
      bad_request(cw + ".type", "field \"{}.type\" must be \"function\", got \"{}\"", cw, clip(*t));
    const json* fn = c.object("function");
    if (!fn) bad_request(cw + ".function", "field \"{}.function\" is required", cw);
    Fields f(*fn, cw + ".function.");
    auto name = f.string("name");
    if (!name) bad_request(cw + ".function.name", "field \"{}.function.name\" is required", cw);
    json args = json::object();
    if (const json* a = f.get("arguments")) {
      if (a->is_string()) {
        const std::string& text = a->get_ref<const std::string&>();
        if (!text.empty()) {
          const std::string field = cw + ".function.arguments";
          args = parse_limited(text, JsonLimits{}, fmt::format("field \"{}\" (a JSON object text)", field), field);
        }
      } else {
        args = *a;
      }
      if (!args.is_object())
        bad_request(cw + ".function.arguments", "field \"{}.function.arguments\" must be a JSON object, got {}", cw,
                    describe(args));
    }
    json call;
    if (auto id = c.string("id")) call["id"] = *id;
    call["type"] = "function";
    call["function"] = {{"name", *name}, {"arguments", std::move(args)}};
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

bool FieldLogger::note(std::string_view field, std::string_view context) {
  const std::string name = clip(field, kMaxNameBytes);
  std::lock_guard lock(mutex_);
  if (full_ || seen_.count(name)) return false;
  if (seen_.size() >= kMaxNames) {
    full_ = true;
    spdlog::warn("{}{}ignoring unknown request fields: {} names logged, no more will be", context,
                 context.empty() ? "" : ": ", kMaxNames);
    return false;
  }
  seen_.insert(name);
  order_.push_back(name);
  spdlog::warn("{}{}ignoring unknown request field {} (logged once)", context, context.empty() ? "" : ": ",
               json(name).dump(-1, ' ', false, json::error_handler_t::replace));
  return true;
}

std::vector<std::string> FieldLogger::logged() const {
  std::lock_guard lock(mutex_);
  return order_;
}

json parse_body(std::string_view body, const JsonLimits& limits) {
  json doc = parse_limited(body, limits, "the request body", "");
  if (!doc.is_object()) bad_request("", "the request body must be a JSON object, got {}", describe(doc));
  return doc;
}

json parse_json_or_discard(std::string_view text, const JsonLimits& limits) {
  try {
    return parse_limited(text, limits, "JSON text", "");
  } catch (const ApiError&) {
    return json(json::value_t::discarded);
  }
}

std::string describe(const json& v) {
  std::string text;
  preview(v, text, kDescribeChars + 1);
  if (text.size() > kDescribeChars) text = text.substr(0, kDescribeChars - 3) + "...";
  return fmt::format("{} {}", v.type_name(), text);
}

std::optional<int64_t> integer_in(const json& v, int64_t lo, int64_t hi) {
  int64_t i = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return std::nullopt;
    i = int64_t(u);
  } else if (v.is_number_integer()) {
    i = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)) return std::nullopt;
    i = int64_t(d);
  } else {
    return std::nullopt;
  }
  if (i < lo || i > hi) return std::nullopt;
  return i;
}

json normalize_messages(const json& messages) {
  if (!messages.is_array()) bad_request("messages", "field \"messages\" must be an array, got {}", describe(messages));
  if (messages.empty()) bad_request("messages", "field \"messages\" must not be empty");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string mw = fmt::format("messages[{}]", i);
    Fields m(messages[i], mw + ".");
    auto role = m.string("role");
    if (!role) bad_request(mw + ".role", "field \"{}.role\" is required", mw);
    if (!roles.count(*role))
      bad_request(mw + ".role", "field \"{}.role\" must be one of system, developer, user, assistant, tool; got \"{}\"",
                  mw, clip(*role));
    json msg;
    // OpenAI's "developer" role is its newer name for "system"; Qwen templates know only "system" (the released
    // Qwen3.8 template raises "Unexpected message role", Qwen3's drops the message).
    msg["role"] = *role == "developer" ? std::string("system") : *role;
    const json* content = m.get("content");
    const json* tool_calls = m.get("tool_calls");
    if (!content && !(*role == "assistant"))
      bad_request(mw + ".content", "field \"{}.content\" is required for a {} message", mw, *role);
    msg["content"] = content ? content_text(*content, mw + ".content") : std::string();
    if (auto name = m.string("name")) msg["name"] = *name;
    if (*role == "assistant") {
      auto reasoning = m.string("reasoning_content");
      if (!reasoning) reasoning = m.string("reasoning");
      if (reasoning) msg["reasoning_content"] = *reasoning;
      if (tool_calls) msg["tool_calls"] = normalize_tool_calls(*tool_calls, mw + ".tool_calls");
    } else if (tool_calls) {
      bad_request(mw + ".tool_calls", "field \"{}.tool_calls\" is only allowed in assistant messages", mw);
    }
    if (*role == "tool") {
      if (auto id = m.string("tool_call_id")) msg["tool_call_id"] = *id;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

void check_tools(const json& tools) {
  if (!tools.is_array()) bad_request("tools", "field \"tools\" must be an array, got {}", describe(tools));
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string tw = fmt::format("tools[{}]", i);
    Fields t(tools[i], tw + ".");
    auto type = t.string("type");
    if (!type || *type != "function") bad_request(tw + ".type", "field \"{}.type\" must be \"function\"", tw);
    const json* fn = t.object("function");
    if (!fn) bad_request(tw + ".function", "field \"{}.function\" is required", tw);
    Fields f(*fn, tw + ".function.");
    auto name = f.string("name");
    if (!name || name->empty())
      bad_request(tw + ".function.name", "field \"{}.function.name\" must be a non-empty string", tw);
    f.string("description");
    f.object("parameters");
    f.boolean("strict");
  }
}

namespace {
// chat_template_kwargs (object) and a top-level reasoning_effort (string) become template variables.
json template_vars_of(const Fields& f) {
  json vars = json::object();
  if (const json* kw = f.object("chat_template_kwargs")) vars = *kw;
  if (auto effort = f.string("reasoning_effort"); effort && !vars.contains("reasoning_effort"))
    vars["reasoning_effort"] = *effort;
  return vars;
}
}  // namespace

ApiRequest parse_chat_request(const json& body, const SamplingParams& defaults, int64_t vocab_size,
                              const RequestPolicy& policy) {
  Fields f(body, "", &policy);
  std::set<std::string_view> known = kSamplingFields;
  known.insert({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                "response_format", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                "reasoning_effort", "metadata", "store", "service_tier"});
  f.only(known);
  ApiRequest r;
  r.endpoint = Endpoint::Chat;
  parse_sampling(f, r, defaults, vocab_size);
  if (auto v = f.integer("max_completion_tokens", 1)) {
    r.sampling.max_tokens = *v;
    r.max_tokens_given = true;
  }
  const bool logprobs = f.boolean("logprobs").value_or(false);
  if (auto v = f.integer("top_logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad_request("top_logprobs", "top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, *v);
    if (!logprobs && *v > 0) bad_request("top_logprobs", "top_logprobs requires logprobs to be true");
    r.top_logprobs = int(*v);
  }
  if (logprobs)
    r.top_logprobs = std::max(r.top_logprobs, 0);
  else
    r.top_logprobs = -1;
  r.echo = f.boolean("echo").value_or(false);
  if (const json* rf = f.object("response_format")) {
    Fields rff(*rf, "response_format.", f.policy());
    rff.only({"type", "json_schema"});
    const std::string type = rff.string("type").value_or("");
    if (type == "text") {
      r.response_format = ResponseFormat::Text;
    } else if (type == "json_object") {
      r.response_format = ResponseFormat::JsonObject;
    } else if (type == "json_schema") {
      const json* js = rff.object("json_schema");
      if (!js) bad_request("response_format.json_schema", "field \"response_format.json_schema\" is required");
      Fields jf(*js, "response_format.json_schema.", f.policy());
      jf.only({"name", "description", "schema", "strict"});
      jf.string("name");
      jf.string("description");
      jf.boolean("strict");  // the output always follows the schema here
      const json* schema = jf.get("schema");
      if (!schema) bad_request("response_format.json_schema.schema", "field \"response_format.json_schema.schema\" is required");
      if (!schema->is_object() && !schema->is_boolean())
        jf.type_error("schema", "an object (a JSON Schema)", *schema);
      r.response_format = ResponseFormat::JsonSchema;
      r.json_schema = *schema;
    } else {
      bad_request("response_format.type",
                  "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                  rf->contains("type") ? describe((*rf)["type"]) : std::string("nothing"));
    }
  }
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  f.boolean("store");
  f.object("metadata");
  f.string("service_tier");

  const json* messages = f.get("messages");
  if (!messages) bad_request("messages", "field \"messages\" is required");
  r.messages = normalize_messages(*messages);
  if (const json* tools = f.get("tools")) {
    check_tools(*tools);
    if (!tools->empty()) r.tools = *tools;
  }
  r.tool_choice = r.tools.is_null() ? ToolChoice::None : ToolChoice::Auto;
  if (const json* tc = f.get("tool_choice"); tc && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string choice = tc->get<std::string>();
      if (choice == "none")
        r.tool_choice = ToolChoice::None;
      else if (choice == "auto")
        r.tool_choice = r.tools.is_null() ? ToolChoice::None : ToolChoice::Auto;
      else if (choice == "required")
        r.tool_choice = ToolChoice::Required;
      else
        bad_request("tool_choice",
                    "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": "
                    "{{\"name\": ...}}}}, got \"{}\"",
                    clip(choice));
    } else if (tc->is_object()) {
      Fields t(*tc, "tool_choice.", f.policy());
      t.only({"type", "function"});
      if (t.string("type").value_or("") != "function")
        bad_request("tool_choice.type", "field \"tool_choice.type\" must be \"function\"");
      const json* fn = t.object("function");
      if (!fn) bad_request("tool_choice.function", "field \"tool_choice.function\" is required");
      Fields tf(*fn, "tool_choice.function.", f.policy());
      tf.only({"name"});
      auto name = tf.string("name");
      if (!name) bad_request("tool_choice.function.name", "field \"tool_choice.function.name\" is required");
      r.tool_choice = ToolChoice::Named;
      r.forced_tool = *name;
    } else {
      f.type_error("tool_choice", "a string or an object", *tc);
    }
    if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) && r.tools.is_null())
      bad_request("tool_choice", "tool_choice {} needs tools", describe(*tc));
    if (r.tool_choice == ToolChoice::Named) {
      bool found = false;
      for (const json& tool : r.tools) found = found || tool["function"]["name"] == r.forced_tool;
      if (!found)
        bad_request("tool_choice.function.name", "tool_choice names the function \"{}\", which is not among the tools",
                    clip(r.forced_tool));
    }
  }
  const bool forced = r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named;
  if (forced && r.response_format != ResponseFormat::Text)
    bad_request("response_format", "response_format cannot be combined with a forced tool_choice");
  r.parse_tool_calls = r.tool_choice != ToolChoice::None;
  r.template_vars = template_vars_of(f);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.continue_final_message = f.boolean("continue_final_message").value_or(false);
  if (r.continue_final_message && r.add_generation_prompt)
    bad_request("continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true; set add_generation_prompt "
                "to false");
  if (r.continue_final_message && r.messages.back()["role"] != "assistant")
    bad_request("continue_final_message", "continue_final_message needs the last message to be an assistant message");
  validate_sampling(r, vocab_size);
  return r;
}

ApiRequest parse_completion_request(const json& body, const SamplingParams& defaults, int64_t vocab_size,
                                    const RequestPolicy& policy) {
  Fields f(body, "", &policy);
  std::set<std::string_view> known = kSamplingFields;
  known.insert({"prompt", "suffix", "best_of"});
  f.only(known);
  ApiRequest r;
  r.endpoint = Endpoint::Completion;
  SamplingParams d = defaults;
  d.max_tokens = 16;  // OpenAI / vLLM default for completions
  parse_sampling(f, r, d, vocab_size);
  r.max_tokens_given = true;
  if (auto v = f.integer("logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad_request("logprobs", "logprobs must be in [0, {}], got {}", kMaxTopLogprobs, *v);
    r.top_logprobs = int(*v);
  }
  r.echo = f.boolean("echo").value_or(false);
  if (r.echo && r.top_logprobs >= 0) r.prompt_logprobs = std::max(r.prompt_logprobs, r.top_logprobs);
  if (auto v = f.integer("best_of"); v && *v != 1 && *v != r.n)
    bad_request("best_of", "best_of must equal n (no best-of selection on this server), got {}", *v);
  if (f.string("suffix")) bad_request("suffix", "suffix is not supported by this server");

  const json* prompt = f.get("prompt");
  if (!prompt) bad_request("prompt", "field \"prompt\" is required");
  auto ids_of = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& v = arr[i];
      if (!v.is_number_integer()) bad_request("prompt", "prompt token {} must be an integer, got {}", i, describe(v));
      const auto id = integer_in(v, 0, vocab_size - 1);
      if (!id)
        bad_request("prompt", "prompt token id {} at position {} is outside the vocabulary [0, {})", v.dump(), i,
                    vocab_size);
      ids.push_back(int32_t(*id));
    }
    return ids;
  };
  auto text_prompt = [&](const json& v) {
    CompletionPrompt p;
    p.text = v.get<std::string>();
    if (p.text->empty()) bad_request("prompt", "the prompt is empty");
    return p;
  };
  auto id_prompt = [&](const json& v) {
    CompletionPrompt p;
    p.ids = ids_of(v);
    if (p.ids.empty()) bad_request("prompt", "the prompt is empty");
    return p;
  };
  if (prompt->is_string()) {
    r.prompts.push_back(text_prompt(*prompt));
  } else if (prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    // A batch: strings or arrays of token ids.
    if (int64_t(prompt->size()) > kMaxChoices)
      bad_request("prompt", "at most {} prompts per request, got {}", kMaxChoices, prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& v = (*prompt)[i];
      if (v.is_string())
        r.prompts.push_back(text_prompt(v));
      else if (v.is_array())
        r.prompts.push_back(id_prompt(v));
      else
        bad_request("prompt", "prompt[{}] must be a string or an array of token ids, got {}", i, describe(v));
    }
  } else if (prompt->is_array()) {
    r.prompts.push_back(id_prompt(*prompt));
  } else {
    f.type_error("prompt", "a string, an array of token ids, or an array of either", *prompt);
  }
  if (int64_t(r.prompts.size()) * r.n > kMaxChoices)
    bad_request("n", "{} prompts with n = {} make {} choices, more than {}", r.prompts.size(), r.n,
                int64_t(r.prompts.size()) * r.n, kMaxChoices);
  validate_sampling(r, vocab_size);
  return r;
}

TokenizeRequest parse_tokenize_request(const json& body, const RequestPolicy& policy) {
  Fields f(body, "", &policy);
  f.only({"model", "prompt", "messages", "tools", "chat_template_kwargs", "add_generation_prompt", "add_special_tokens",
          "return_token_strs", "reasoning_effort"});
  TokenizeRequest r;
  if (auto v = f.string("model")) r.model = *v;
  r.prompt = f.string("prompt");
  const json* messages = f.get("messages");
  if (r.prompt.has_value() == (messages != nullptr))
    bad_request("prompt", "give exactly one of \"prompt\" (text) and \"messages\" (a chat)");
  if (messages) r.messages = normalize_messages(*messages);
  if (const json* tools = f.get("tools")) {
    check_tools(*tools);
    if (!tools->empty()) r.tools = *tools;
  }
  r.template_vars = template_vars_of(f);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  f.boolean("add_special_tokens");  // Qwen tokenizers add no BOS/EOS either way
  r.return_token_strs = f.boolean("return_token_strs").value_or(false);
  return r;
}

DetokenizeRequest parse_detokenize_request(const json& body, int64_t vocab_size, const RequestPolicy& policy) {
  Fields f(body, "", &policy);
  f.only({"model", "tokens"});
  DetokenizeRequest r;
  if (auto v = f.string("model")) r.model = *v;
  const json* tokens = f.array("tokens");
  if (!tokens) bad_request("tokens", "field \"tokens\" is required");
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& v = (*tokens)[i];
    if (!v.is_number_integer()) bad_request("tokens", "tokens[{}] must be an integer, got {}", i, describe(v));
    const auto id = integer_in(v, 0, vocab_size - 1);
    if (!id) bad_request("tokens", "tokens[{}] = {} is outside the vocabulary [0, {})", i, v.dump(), vocab_size);
    r.tokens.push_back(int32_t(*id));
  }
  return r;
}

}  // namespace flashnext::server
