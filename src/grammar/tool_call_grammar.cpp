#include "grammar/tool_call_grammar.h"

#include "core/error.h"

namespace flashnext::grammar {

namespace {

using json = nlohmann::ordered_json;
using Frag = GrammarBuilder::Frag;

// The one-byte code points of raw parameter text: any but NUL and '<'.
constexpr std::initializer_list<std::pair<uint8_t, uint8_t>> kNoLt = {{0x01, 0x3B}, {0x3D, 0x7F}};

// The parser's notion of a parameter's type (output_parsers.cpp param_type): "" when the schema does not say.
std::string param_type(const json& schema) {
  if (!schema.is_object() || !schema.contains("type")) return {};
  const json& t = schema["type"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& ty : t) {
      if (ty.is_string() && ty.get<std::string>() != "null") return ty.get<std::string>();
    }
  }
  return {};
}

class ToolCallCompiler {
 public:
  ToolCallCompiler(ToolCallFormat format, const JsonSchemaOptions& opt) : format_(format), opt_(opt) {}

  std::shared_ptr<const Grammar> compile(const json& tools, const std::optional<std::string>& only, bool parallel) {
    if (!tools.is_array() || tools.empty()) fail("tool_choice: there are no tools to call");
    std::vector<int32_t> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& fn = tools[i].value("function", json::object());
      const std::string name = fn.value("name", "");
      if (only && name != *only) continue;
      calls.push_back(format_ == ToolCallFormat::HermesJson ? hermes_call_rule(fn, name, i) : call_rule(fn, name, i));
    }
    if (calls.empty()) fail("tool_choice names the function \"{}\", which is not among the tools", *only);
    const int32_t root = b_.declare_rule("tool_calls");
    auto any_call = [&] {
      std::vector<Frag> alts;
      for (int32_t c : calls) alts.push_back(b_.call(c));
      return b_.alt(alts);
    };
    if (only || !parallel) {
      b_.define_rule(root, any_call());
    } else {
      b_.define_rule(root, b_.seq({any_call(), b_.star(b_.seq({b_.literal("\n"), any_call()}))}));
    }
    return std::make_shared<const Grammar>(b_.finish(root));
  }

 private:
  int32_t call_rule(const json& fn, const std::string& name, size_t index) {
    const std::string where = fmt::format("tools[{}] (\"{}\")", index, name);
    const int32_t rule = b_.declare_rule("call " + name);
    std::vector<Frag> parts{b_.literal("<tool_call>\n<function=" + name + ">\n")};
    const json& params = fn.value("parameters", json::object());
    if (params.is_object() && params.contains("properties")) {
      const json& props = params["properties"];
      if (!props.is_object()) fail("{}: parameters.properties must be an object", where);
      std::vector<std::string> required;
      if (params.contains("required") && params["required"].is_array()) {
        for (const json& r : params["required"]) {
          if (!r.is_string() || !props.contains(r.get<std::string>()))
            fail("{}: required parameter {} is not among parameters.properties", where, r.dump());
          required.push_back(r.get<std::string>());
        }
      }
      for (auto it = props.begin(); it != props.end(); ++it) {
        const std::string& key = it.key();
        Frag value;
        try {
          value = value_frag(params, it.value(), "/properties/" + json_pointer_token(key));
        } catch (const Error& e) {
          fail("{}: parameter \"{}\": {}", where, key, e.what());
        }
        Frag p = b_.seq({b_.literal("<parameter=" + key + ">\n"), value, b_.literal("\n</parameter>\n")});
        const bool req = std::find(required.begin(), required.end(), key) != required.end();
        parts.push_back(req ? p : b_.opt(p));
      }
    }
    parts.push_back(b_.literal("</function>\n</tool_call>"));
    b_.define_rule(rule, b_.seq(parts));
    return rule;
  }

  // <tool_call>\n{"name": "NAME", "arguments": ARGUMENTS}\n</tool_call>
  int32_t hermes_call_rule(const json& fn, const std::string& name, size_t index) {
    const int32_t rule = b_.declare_rule("call " + name);
    // Only the declared parameters, as in the XML format (OpenAI's strict function calling): additionalProperties
    // false unless the tool says otherwise; no parameters: {}.
    json params = fn.contains("parameters") && fn["parameters"].is_object()
                      ? fn["parameters"]
                      : json{{"type", "object"}, {"properties", json::object()}};
    if (!params.contains("additionalProperties")) params["additionalProperties"] = false;
    int32_t args = -1;
    try {
      args = add_json_schema(b_, params, "", opt_);
    } catch (const Error& e) {
      fail("tools[{}] (\"{}\"): parameters: {}", index, name, e.what());
    }
    b_.define_rule(rule, b_.seq({b_.literal("<tool_call>\n{\"name\": " + json(name).dump() + ", \"arguments\": "),
                                 b_.call(args), b_.literal("}\n</tool_call>")}));
    return rule;
  }

  Frag value_frag(const json& root, const json& schema, const std::string& ptr) {
    const std::string type = param_type(schema);
    if (!type.empty() && type != "string") return b_.call(add_json_schema(b_, root, ptr, opt_));
    std::vector<std::string> choices;
    if (schema.is_object() && schema.contains("enum")) {
      if (!schema["enum"].is_array() || schema["enum"].empty()) fail("'enum' must be a non-empty array");
      for (const json& v : schema["enum"]) {
        if (!v.is_string()) fail("a string parameter's enum holds {}, not a string", v.dump());
        choices.push_back(v.get<std::string>());
      }
    } else if (schema.is_object() && schema.contains("const")) {
      if (!schema["const"].is_string()) fail("a string parameter's const is {}, not a string", schema["const"].dump());
      choices.push_back(schema["const"].get<std::string>());
    }
    if (!choices.empty()) {
      std::vector<Frag> alts;
      for (const std::string& c : choices) alts.push_back(b_.literal(c));
      return b_.alt(alts);
    }
    if (schema.is_object() && schema.contains("maxLength")) {
      const json& m = schema["maxLength"];
      if (!m.is_number_unsigned() || m.get<int64_t>() > opt_.max_repeat)
        fail("maxLength must be an integer in [0, {}]", opt_.max_repeat);
      int64_t lo = 0;
      if (schema.contains("minLength")) {
        if (!schema["minLength"].is_number_unsigned()) fail("minLength must be a non-negative integer");
        lo = schema["minLength"].get<int64_t>();
      }
      if (lo > m.get<int64_t>()) fail("minLength is larger than maxLength");
      return b_.repeat([&] { return b_.utf8_char(kNoLt); }, lo, m.get<int64_t>());
    }
    return b_.call(free_text_rule());
  }

  // UTF-8 text without "</": (a non-'<' char | '<' followed by a non-'/' non-'<' char)* '<'?  — every '<' is
  // followed by a character other than '/' (a run of '<' ends with such a character or the end of the text).
  int32_t free_text_rule() {
    if (free_text_ >= 0) return free_text_;
    free_text_ = b_.declare_rule("raw text");
    Frag lt_run = b_.seq({b_.literal("<"), b_.star(b_.literal("<"))});
    Frag after_lt = b_.utf8_char({{0x01, 0x2E}, {0x30, 0x3B}, {0x3D, 0x7F}});  // neither '/' nor '<'
    Frag unit = b_.alt({b_.utf8_char(kNoLt), b_.seq({lt_run, after_lt})});
    Frag tail_lt = b_.opt(b_.seq({b_.literal("<"), b_.star(b_.literal("<"))}));
    b_.define_rule(free_text_, b_.seq({b_.star(unit), tail_lt}));
    return free_text_;
  }

  ToolCallFormat format_;
  JsonSchemaOptions opt_;
  GrammarBuilder b_;
  int32_t free_text_ = -1;
};

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(const nlohmann::ordered_json& tools,
                                                 const std::optional<std::string>& only, ToolCallFormat format,
                                                 bool parallel, const JsonSchemaOptions& options) {
  return ToolCallCompiler(format, options).compile(tools, only, parallel);
}

}  // namespace flashnext::grammar
