// Chat templates against prompts rendered by transformers (apply_chat_template):
//  * tests/data/fixtures/tiny-b/tokenizer_cases.json "chat": the Qwen3 template of models/tiny-b-random;
//  * tests/data/tokenizers/qwen3.8/render_cases.json: the released Qwen3.8-Flash-Next template, including the
//    errors it raises;
// plus loading rules (chat_template.jinja vs tokenizer_config.json, named templates) and error reporting.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using json = nlohmann::ordered_json;
using flashnext::Error;
using flashnext::chat::ChatTemplate;
using flashnext::chat::jinja::TemplateError;
namespace fs = std::filesystem;

const std::string kSource = FLASHNEXT_SOURCE_DIR;

json load_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// A fresh, empty temporary folder for a test.
fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("fn_chat_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

TEST(ChatTemplateTinyB, MatchesTransformersChatCases) {
  const json cases = load_json(kSource + "/tests/data/fixtures/tiny-b/tokenizer_cases.json");
  const ChatTemplate ct = ChatTemplate::from_dir(kSource + "/models/tiny-b-random");
  ASSERT_EQ(ct.eos_token(), "<|im_end|>");
  EXPECT_FALSE(ct.bos_token().has_value());  // "bos_token": null in tokenizer_config.json
  ASSERT_EQ(cases["chat"].size(), 6u);
  for (size_t i = 0; i < cases["chat"].size(); ++i) {
    const json& c = cases["chat"][i];
    SCOPED_TRACE("chat case " + std::to_string(i));
    json vars = {{"enable_thinking", c["enable_thinking"]}};
    EXPECT_EQ(ct.render(c["messages"], nullptr, c["add_generation_prompt"].get<bool>(), vars),
              c["rendered"].get<std::string>());
  }
}

class Qwen38Case : public ::testing::TestWithParam<size_t> {
 public:
  static const json& cases() {
    static const json c = load_json(kSource + "/tests/data/tokenizers/qwen3.8/render_cases.json")["cases"];
    return c;
  }
  static const ChatTemplate& tmpl() {
    static const ChatTemplate ct = ChatTemplate::from_dir(kSource + "/tests/data/tokenizers/qwen3.8");
    return ct;
  }
};

TEST_P(Qwen38Case, MatchesTransformers) {
  const json& c = cases()[GetParam()];
  SCOPED_TRACE(c.dump());
  if (c.contains("rendered")) {
    EXPECT_EQ(tmpl().render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["vars"]),
              c["rendered"].get<std::string>());
    return;
  }
  const std::string expected = c["error"].get<std::string>();
  try {
    tmpl().render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["vars"]);
    ADD_FAILURE() << "expected the template to raise: " << expected;
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), expected);
    EXPECT_TRUE(e.raised_by_template());
    EXPECT_GT(e.line(), 0);
    const std::string what = e.what();
    EXPECT_NE(what.find("chat_template.jinja line "), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(RenderCases, Qwen38Case, ::testing::Range<size_t>(0, Qwen38Case::cases().size()));

// Cases beyond render_cases.json whose expected text follows from reading the template (ARTIFACTS.md §4).
TEST(ChatTemplateQwen38, ToolCallsAndToolResponses) {
  const ChatTemplate& ct = Qwen38Case::tmpl();
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "  need tool  ",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                     "arguments": {"city": "Oslo", "days": 2, "opts": {"unit": "c"}}}},
                    {"function": {"name": "now", "arguments": {}}}]},
    {"role": "tool", "content": "-3C"},
    {"role": "tool", "content": " 10:00 "}
  ])");
  const json vars = {{"enable_thinking", false}};
  const std::string expected =
      "<|im_start|>user\nWeather?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nneed tool\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
      "<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call>"
      "\n<tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n-3C\n</tool_response>\n<tool_response>\n10:00\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(ct.render(messages, nullptr, true, vars), expected);
}

TEST(ChatTemplateQwen38, ErrorsRaisedByTemplate) {
  const ChatTemplate& ct = Qwen38Case::tmpl();
  auto message_of = [&](const json& messages, const json& vars) -> std::string {
    try {
      ct.render(messages, nullptr, true, vars);
    } catch (const TemplateError& e) {
      return e.message();
    }
    return "(no error)";
  };
  EXPECT_EQ(message_of(json::array(), nullptr), "No messages provided.");
  EXPECT_EQ(
      message_of(json::parse(R"([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])"), nullptr),
      "System message must be at the beginning.");
  EXPECT_EQ(
      message_of(json::parse(R"([{"role": "developer", "content": "a"}, {"role": "user", "content": "b"}])"), nullptr),
      "Unexpected message role.");
  EXPECT_EQ(message_of(json::parse(R"([{"role": "user", "content": "x"}])"), {{"reasoning_effort", "max"}}),
            "Unexpected reasoning effort max. Supported types are xhigh (default), medium, and low.");
  // With thinking disabled the effort is not checked.
  EXPECT_EQ(message_of(json::parse(R"([{"role": "user", "content": "x"}])"),
                       {{"reasoning_effort", "max"}, {"enable_thinking", false}}),
            "(no error)");
  EXPECT_EQ(message_of(json::parse(R"([{"role": "user", "content": 5}])"), nullptr), "Unexpected content type.");
}

// OpenAI clients send tool-call arguments as a JSON string; the released template iterates `arguments|items`, so
// transformers fails exactly like this (QwenLM/Qwen3#1894). Callers must pass arguments as an object.
TEST(ChatTemplateQwen38, StringToolArgumentsFailLikeTransformers) {
  const json messages = json::parse(R"([{"role": "user", "content": "Look up Paris"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "lookup", "arguments": "{\"city\": \"Paris\"}"}}]}])");
  try {
    Qwen38Case::tmpl().render(messages);
    ADD_FAILURE() << "expected an error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), "Can only get item pairs from a mapping.");
    EXPECT_FALSE(e.raised_by_template());
  }
}

TEST(ChatTemplateQwen38, MultimodalContentParts) {
  const ChatTemplate& ct = Qwen38Case::tmpl();
  const json messages = json::parse(R"([{"role": "user", "content": [
      {"type": "image", "image": "x.png"}, {"type": "text", "text": "What is this?"}, {"type": "video"}]}])");
  EXPECT_EQ(ct.render(messages, nullptr, false, {{"enable_thinking", false}, {"add_vision_id", true}}),
            "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>What is this?"
            "Video 1: <|vision_start|><|video_pad|><|vision_end|><|im_end|>\n");
}

TEST(ChatTemplateLoad, PrefersChatTemplateJinjaOverConfig) {
  fs::path dir = temp_dir("prefer");
  write(dir / "tokenizer_config.json",
        R"({"chat_template": "config", "eos_token": {"content": "</s>"}, "bos_token": "<s>"})");
  write(dir / "chat_template.jinja", "file {{ bos_token }}{{ eos_token }}\n");
  const ChatTemplate ct = ChatTemplate::from_dir(dir);
  EXPECT_EQ(ct.render(json::array()), "file <s></s>");
  EXPECT_EQ(ct.bos_token(), "<s>");
  EXPECT_EQ(ct.eos_token(), "</s>");
  fs::remove_all(dir);
}

TEST(ChatTemplateLoad, NamedTemplatesPickDefaultOrToolUse) {
  fs::path dir = temp_dir("named");
  write(dir / "tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D{{ messages|length }}"},
                              {"name": "tool_use", "template": "T{{ tools|length }}"}]})");
  const ChatTemplate ct = ChatTemplate::from_dir(dir);
  EXPECT_EQ(ct.template_names(), (std::vector<std::string>{"default", "tool_use"}));
  EXPECT_EQ(ct.render(json::array({{{"role", "user"}, {"content", "x"}}})), "D1");
  EXPECT_EQ(ct.render(json::array(), json::array({{{"type", "function"}}})), "T1");
  fs::remove_all(dir);
}

TEST(ChatTemplateLoad, ClearErrors) {
  fs::path dir = temp_dir("errors");
  EXPECT_THROW(ChatTemplate::from_dir(dir), Error);  // no template at all
  write(dir / "tokenizer_config.json", R"({"chat_template": [{"name": "other", "template": "x"}]})");
  try {
    ChatTemplate::from_dir(dir);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none named \"default\""), std::string::npos) << e.what();
  }
  write(dir / "chat_template.jinja", "line one\n{% if x %}\nnever closed\n");
  try {
    ChatTemplate::from_dir(dir);
    ADD_FAILURE() << "expected a syntax error";
  } catch (const TemplateError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("chat_template.jinja line "), std::string::npos) << what;
    EXPECT_NE(what.find("'endif'"), std::string::npos) << what;
  }
  write(dir / "chat_template.jinja", "ok\n\n{{ messages[0].content.upper() }}");
  const ChatTemplate ct = ChatTemplate::from_dir(dir);
  try {
    ct.render(json::array({{{"role", "user"}}}));
    ADD_FAILURE() << "expected an undefined error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.message(), "'dict object' has no attribute 'content'");
  }
  EXPECT_THROW(ct.render(json::object()), Error);                 // messages must be an array
  EXPECT_THROW(ct.render(json::array({1, 2})), Error);            // of objects
  EXPECT_THROW(ct.render(json::array(), json::object()), Error);  // tools must be an array
  EXPECT_THROW(ct.render(json::array(), nullptr, true, {{"messages", 1}}), Error);
  fs::remove_all(dir);
}

TEST(ChatTemplateRender, KeepsObjectKeyOrderInToJson) {
  const ChatTemplate ct("{% for t in tools %}{{ t|tojson }}\n{% endfor %}", "inline");
  const json tools = json::parse(R"([{"z": 1, "a": {"y": [true, null], "b": "é\"\n"}}])");
  EXPECT_EQ(ct.render(json::array(), tools), "{\"z\": 1, \"a\": {\"y\": [true, null], \"b\": \"é\\\"\\n\"}}\n");
}

}  // namespace
