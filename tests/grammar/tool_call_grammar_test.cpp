// The forced tool-call grammar (grammar/tool_call_grammar.h) against texts written by hand in Qwen3.8's format,
// accepting and rejecting, and its token mask against brute force over the real vocabulary.
#include "grammar/tool_call_grammar.h"

#include "core/error.h"
#include "grammar_test_util.h"

namespace flashnext::grammar {
namespace {

using json = nlohmann::ordered_json;
using test::full_match;

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                     "days": {"type": "integer", "minimum": 1}, "detail": {"type": ["boolean", "null"]},
                     "tag": {"type": "string", "maxLength": 3}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "now"}}
  ])");
}

std::string call(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s = "<tool_call>\n<function=" + name + ">\n";
  for (const auto& [k, v] : params) s += "<parameter=" + k + ">\n" + v + "\n</parameter>\n";
  return s + "</function>\n</tool_call>";
}

TEST(ToolCallGrammar, RequiredAcceptsCallsOfAnyToolWithValidParameters) {
  const auto g = tool_call_grammar(weather_tools(), std::nullopt);
  EXPECT_TRUE(full_match(g, call("get_weather", {{"city", "Paris <3 & a>b"}, {"days", "3"}})));
  EXPECT_TRUE(full_match(g, call("get_weather", {{"city", "Oslo"}, {"unit", "celsius"}, {"days", "10"},
                                                 {"detail", "null"}, {"tag", "abc"}})));
  EXPECT_TRUE(full_match(g, call("now", {})));
  EXPECT_TRUE(full_match(g, call("now", {}) + "\n" + call("get_weather", {{"city", "x\ny"}, {"days", "1"}})));
  EXPECT_TRUE(full_match(g, call("get_weather", {{"city", ""}, {"days", "1"}})));  // an empty raw string
  EXPECT_TRUE(full_match(g, call("get_weather", {{"city", "a<"}, {"days", "1"}})));  // '<' not followed by '/'
}

TEST(ToolCallGrammar, RejectsWhatTheParserWouldMisreadOrTheSchemaForbids) {
  const auto g = tool_call_grammar(weather_tools(), std::nullopt);
  EXPECT_FALSE(full_match(g, ""));                                                    // at least one call
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "Paris"}})));              // "days" is required
  EXPECT_FALSE(full_match(g, call("get_weather", {{"days", "3"}, {"city", "P"}})));  // declared order
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"days", "0x3"}})));
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"days", "-3"}})));  // minimum >= 0: no sign
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"unit", "kelvin"}, {"days", "3"}})));
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"days", "3"}, {"tag", "abcd"}})));  // maxLength
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "a</b"}, {"days", "3"}})));  // "</" in raw text
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"days", "3"}, {"x", "1"}})));  // unknown name
  EXPECT_FALSE(full_match(g, call("delete_all", {})));
  EXPECT_FALSE(full_match(g, "I will call it: " + call("now", {})));
}

TEST(ToolCallGrammar, ANamedFunctionIsCalledExactlyOnce) {
  const auto g = tool_call_grammar(weather_tools(), std::string("now"));
  EXPECT_TRUE(full_match(g, call("now", {})));
  EXPECT_FALSE(full_match(g, call("now", {}) + "\n" + call("now", {})));
  EXPECT_FALSE(full_match(g, call("get_weather", {{"city", "P"}, {"days", "3"}})));
}

TEST(ToolCallGrammar, ErrorsNameTheToolAndTheProblem) {
  auto message = [](const json& tools, std::optional<std::string> only) {
    try {
      tool_call_grammar(tools, only);
    } catch (const flashnext::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(weather_tools(), std::string("nope")).find("\"nope\", which is not among the tools"),
            std::string::npos);
  EXPECT_NE(message(json::array(), std::nullopt).find("no tools"), std::string::npos);
  const json bad = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"q": {"type": "string", "pattern": "a+"}, "n": {"type": "integer", "pattern": "1"}}}}}])");
  const std::string m = message(bad, std::nullopt);
  EXPECT_NE(m.find("tools[0] (\"f\"): parameter \"n\""), std::string::npos) << m;
  EXPECT_NE(m.find("pattern"), std::string::npos) << m;
  const json missing = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {}, "required": ["z"]}}}])");
  EXPECT_NE(message(missing, std::nullopt).find("required parameter \"z\""), std::string::npos);
}

TEST(ToolCallGrammar, TokenMaskMatchesBruteForceAlongACall) {
  const auto g = tool_call_grammar(weather_tools(), std::nullopt);
  TokenMasker masker(g, test::qwen3_vocab());
  GrammarMatcher m(g);
  const std::string text = call("get_weather", {{"city", "Rome"}, {"days", "12"}});
  // Positions: the start, inside the function name, inside the raw string, inside the integer, at the end.
  for (size_t cut : {size_t(0), size_t(20), text.find("Rome") + 2, text.find("12") + 1, text.size()}) {
    GrammarMatcher at(g);
    ASSERT_TRUE(at.accept_bytes(text.substr(0, cut))) << cut;
    EXPECT_GT(test::check_mask_brute_force(masker, at), 0u) << "cut " << cut;
  }
}

TEST(ToolCallGrammar, HermesJsonCallsHaveTheNameAndSchemaValidArguments) {
  const auto g = tool_call_grammar(weather_tools(), std::nullopt, ToolCallFormat::HermesJson);
  auto hermes = [](const std::string& name, const std::string& args) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
  };
  EXPECT_TRUE(full_match(g, hermes("get_weather", R"({"city": "Paris", "days": 3})")));
  EXPECT_TRUE(full_match(g, hermes("get_weather", R"({"city": "a</b", "unit": "celsius", "days": 1})")));
  EXPECT_TRUE(full_match(g, hermes("now", "{}")));
  EXPECT_TRUE(full_match(g, hermes("now", "{}") + "\n" + hermes("now", "{}")));
  EXPECT_FALSE(full_match(g, hermes("get_weather", R"({"city": "Paris"})")));  // days is required
  EXPECT_FALSE(full_match(g, hermes("now", R"({"x": 1})")));                   // no parameters
  EXPECT_FALSE(full_match(g, hermes("nope", "{}")));
  const auto named = tool_call_grammar(weather_tools(), std::string("now"), ToolCallFormat::HermesJson);
  EXPECT_TRUE(full_match(named, hermes("now", "{}")));
  EXPECT_FALSE(full_match(named, hermes("now", "{}") + "\n" + hermes("now", "{}")));
  const auto single = tool_call_grammar(weather_tools(), std::nullopt, ToolCallFormat::HermesJson, /*parallel=*/false);
  EXPECT_TRUE(full_match(single, hermes("now", "{}")));
  EXPECT_FALSE(full_match(single, hermes("now", "{}") + "\n" + hermes("now", "{}")));
}

}  // namespace
}  // namespace flashnext::grammar
