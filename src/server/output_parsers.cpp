#include "server/output_parsers.h"

#include <random>

#include "server/openai_schema.h"

namespace flashnext::server {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

// Length of the longest suffix of `text` that is a proper prefix of `tag` (text that may still become the tag).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t len = std::min(text.size(), tag.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string random_call_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

// JSON-schema type of parameter `param` of function `name` in `tools`; "" when the schema does not say.
std::string param_type(const json& tools, std::string_view name, std::string_view param) {
  if (!tools.is_array()) return {};
  for (const json& t : tools) {
    const json* fn = t.contains("function") ? &t["function"] : nullptr;
    if (!fn || !fn->is_object() || fn->value("name", "") != name) continue;
    auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return {};
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return {};
    auto p = props->find(param);
    if (p == props->end() || !p->is_object()) return {};
    auto type = p->find("type");
    if (type == p->end()) return {};
    if (type->is_string()) return type->get<std::string>();
    // ["string", "null"]: the first non-null type
    if (type->is_array()) {
      for (const json& ty : *type) {
        if (ty.is_string() && ty.get<std::string>() != "null") return ty.get<std::string>();
      }
    }
    return {};
  }
  return {};
}

std::optional<ToolCall> parse_xml(std::string_view body, const json& tools) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>",
                             kParam = "<parameter=", kParamEnd = "</parameter>";
  if (body.substr(0, kFn.size()) != kFn) return std::nullopt;
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  ToolCall call;
  call.name = std::string(trim(body.substr(kFn.size(), name_end - kFn.size())));
  if (call.name.empty()) return std::nullopt;
  const size_t fn_end = body.rfind(kFnEnd);
  if (fn_end == std::string_view::npos || fn_end < name_end || !trim(body.substr(fn_end + kFnEnd.size())).empty())
    return std::nullopt;
  std::string_view rest = body.substr(name_end + 1, fn_end - name_end - 1);
  json args = json::object();
  for (;;) {
    rest = trim(rest);
    if (rest.empty()) break;
    if (rest.substr(0, kParam.size()) != kParam) return std::nullopt;
    const size_t pname_end = rest.find('>');
    if (pname_end == std::string_view::npos) return std::nullopt;
    const std::string pname(trim(rest.substr(kParam.size(), pname_end - kParam.size())));
    const size_t vend = rest.find(kParamEnd, pname_end + 1);
    if (pname.empty() || vend == std::string_view::npos) return std::nullopt;
    std::string_view value = rest.substr(pname_end + 1, vend - pname_end - 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    const std::string type = param_type(tools, call.name, pname);
    if (type.empty() || type == "string") {
      args[pname] = std::string(value);
    } else {
      json v = parse_json_or_discard(value);
      args[pname] = v.is_discarded() ? json(std::string(value)) : std::move(v);
    }
    rest = rest.substr(vend + kParamEnd.size());
  }
  call.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return call;
}

std::optional<ToolCall> parse_hermes(std::string_view body) {
  json doc = parse_json_or_discard(body);
  if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
  auto name = doc.find("name");
  if (name == doc.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ToolCall call;
  call.name = name->get<std::string>();
  auto args = doc.find("arguments");
  if (args == doc.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    call.arguments = args->get<std::string>();
  } else {
    call.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return call;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::Reasoning : State::Start) {}

bool ReasoningParser::prompt_opens_reasoning(std::string_view prompt) {
  if (size_t turn = prompt.rfind("<|im_start|>"); turn != std::string_view::npos) prompt = prompt.substr(turn);
  const size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

ReasoningParser::Delta ReasoningParser::feed(std::string_view text) {
  held_.append(text);
  Delta d;
  for (;;) {
    switch (state_) {
      case State::Start:
        if (held_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
          held_.erase(0, kThinkOpen.size());
          state_ = State::Reasoning;
          continue;
        }
        if (held_.size() < kThinkOpen.size() && kThinkOpen.substr(0, held_.size()) == held_) return d;  // undecided
        state_ = State::Content;
        continue;
      case State::Reasoning: {
        const size_t pos = held_.find(kThinkClose);
        if (pos != std::string::npos) {
          d.reasoning.append(held_, 0, pos);
          held_.erase(0, pos + kThinkClose.size());
          state_ = State::Content;
          continue;
        }
        const size_t keep = partial_tag_suffix(held_, kThinkClose);
        d.reasoning.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return d;
      }
      case State::Content:
        d.content += held_;
        held_.clear();
        return d;
    }
  }
}

ReasoningParser::Delta ReasoningParser::finish() {
  Delta d;
  (state_ == State::Reasoning ? d.reasoning : d.content) = std::move(held_);
  held_.clear();
  return d;
}

// ---------------------------------------------------------------------------------------------------------------

ToolCallParser::ToolCallParser(json tools) : tools_(std::move(tools)) {}

std::optional<ToolCall> ToolCallParser::parse_block(std::string_view body, const json& tools) {
  body = trim(body);
  std::optional<ToolCall> call;
  if (body.substr(0, 10) == "<function=")
    call = parse_xml(body, tools);
  else if (!body.empty() && body.front() == '{')
    call = parse_hermes(body);
  if (call) call->id = random_call_id();
  return call;
}

void ToolCallParser::emit_content(std::string text, Delta& d) {
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end == 0) {  // whitespace only: decided by what comes next
    pending_ws_ += text;
    return;
  }
  d.content += pending_ws_;
  d.content.append(text, 0, end);
  pending_ws_ = text.substr(end);
}

ToolCallParser::Delta ToolCallParser::feed(std::string_view text) {
  held_.append(text);
  Delta d;
  for (;;) {
    if (!in_block_) {
      const size_t pos = held_.find(kCallOpen);
      if (pos == std::string::npos) {
        const size_t keep = partial_tag_suffix(held_, kCallOpen);
        emit_content(held_.substr(0, held_.size() - keep), d);
        held_.erase(0, held_.size() - keep);
        return d;
      }
      emit_content(held_.substr(0, pos), d);
      held_.erase(0, pos + kCallOpen.size());
      in_block_ = true;
    }
    const size_t end = held_.find(kCallClose);
    if (end == std::string::npos) return d;
    std::string body = held_.substr(0, end);
    held_.erase(0, end + kCallClose.size());
    in_block_ = false;
    if (auto call = parse_block(body, tools_)) {
      pending_ws_.clear();  // the whitespace before a call is layout, not content
      d.calls.push_back(std::move(*call));
      ++calls_;
    } else {
      emit_content(std::string(kCallOpen) + body + std::string(kCallClose), d);
    }
  }
}

ToolCallParser::Delta ToolCallParser::finish() {
  Delta d;
  std::string rest = in_block_ ? std::string(kCallOpen) + held_ : held_;
  held_.clear();
  in_block_ = false;
  emit_content(std::move(rest), d);
  if (calls_ == 0) d.content += pending_ws_;  // plain text that ends in whitespace keeps it
  pending_ws_.clear();
  return d;
}

}  // namespace flashnext::server
