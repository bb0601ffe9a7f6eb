// Reasoning and tool-call parsers (server/output_parsers.h) on known text, whole and cut into pieces; SSE framing.
#include <gtest/gtest.h>

#include "server/output_parsers.h"
#include "server/sse.h"

namespace flashnext::server {
namespace {

using json = nlohmann::ordered_json;

struct Split {
  std::string reasoning, content;
};

// Runs the reasoning parser over `text` cut into pieces of `piece` bytes (0: whole).
Split reason(std::string_view text, bool starts_inside, size_t piece = 0) {
  ReasoningParser p(starts_inside);
  Split s;
  auto add = [&](const ReasoningParser::Delta& d) {
    s.reasoning += d.reasoning;
    s.content += d.content;
  };
  if (piece == 0) piece = std::max<size_t>(text.size(), 1);
  for (size_t i = 0; i < text.size(); i += piece) add(p.feed(text.substr(i, piece)));
  add(p.finish());
  return s;
}

TEST(ReasoningParser, SplitsThinkBlock) {
  for (size_t piece : {0, 1, 2, 3, 5}) {
    SCOPED_TRACE(piece);
    // Qwen3: the model writes <think> itself.
    Split s = reason("<think>\nLet me see.\n</think>\n\nThe answer is 4.", false, piece);
    EXPECT_EQ(s.reasoning, "\nLet me see.\n");
    EXPECT_EQ(s.content, "\n\nThe answer is 4.");
    // Qwen3.8: the generation prompt opened the block; the output only closes it.
    s = reason("Let me see.\n</think>\n\nFour.", true, piece);
    EXPECT_EQ(s.reasoning, "Let me see.\n");
    EXPECT_EQ(s.content, "\n\nFour.");
    // No thinking at all.
    s = reason("Just text with </think> inside", false, piece);
    EXPECT_EQ(s.reasoning, "");
    EXPECT_EQ(s.content, "Just text with </think> inside");
    // A thought cut short by max_tokens is all reasoning.
    s = reason("<think>still thinking </thi", false, piece);
    EXPECT_EQ(s.reasoning, "still thinking </thi");
    EXPECT_EQ(s.content, "");
    // Text that only starts like the tag is content.
    s = reason("<thx", false, piece);
    EXPECT_EQ(s.content, "<thx");
    s = reason("<th", false, piece);
    EXPECT_EQ(s.content, "<th");
  }
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(
      ReasoningParser::prompt_opens_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningParser::prompt_opens_reasoning(
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // enable_thinking=false
  EXPECT_FALSE(ReasoningParser::prompt_opens_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  // An unclosed <think> in an earlier turn does not count: only the last turn matters.
  EXPECT_FALSE(ReasoningParser::prompt_opens_reasoning("<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n"));
}

struct Calls {
  std::string content;
  std::vector<ToolCall> calls;
};

Calls tool_parse(std::string_view text, const json& tools, size_t piece = 0) {
  ToolCallParser p(tools);
  Calls c;
  auto add = [&](ToolCallParser::Delta d) {
    c.content += d.content;
    for (auto& x : d.calls) c.calls.push_back(std::move(x));
  };
  if (piece == 0) piece = std::max<size_t>(text.size(), 1);
  for (size_t i = 0; i < text.size(); i += piece) add(p.feed(text.substr(i, piece)));
  add(p.finish());
  return c;
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": ["string", "null"]},
    "options": {"type": "object"}, "hourly": {"type": "boolean"}}}}},
  {"type": "function", "function": {"name": "noop"}}
])");

TEST(ToolCallParser, QwenCoderXml) {
  // The format of ARTIFACTS.md section 4: string arguments raw, the others JSON.
  const std::string text =
      "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=options>\n{\"detail\": [1, 2]}\n</parameter>\n"
      "<parameter=hourly>\ntrue\n</parameter>\n<parameter=units>\n42\n</parameter>\n<parameter=note>\nline 1\nline 2\n"
      "</parameter>\n</function>\n</tool_call>";
  for (size_t piece : {0, 1, 4, 7}) {
    SCOPED_TRACE(piece);
    Calls c = tool_parse(text, kTools, piece);
    EXPECT_EQ(c.content, "Let me check.");  // the layout newlines before the call are dropped
    ASSERT_EQ(c.calls.size(), 1u);
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(c.calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(c.calls[0].id.size(), 29u);
    EXPECT_EQ(json::parse(c.calls[0].arguments),
              json::parse(R"({"city": "New York", "days": 3, "options": {"detail": [1, 2]}, "hourly": true,
                              "units": "42", "note": "line 1\nline 2"})"));
    // key order follows the text
    EXPECT_EQ(c.calls[0].arguments.substr(0, 9), "{\"city\":\"");
  }
}

TEST(ToolCallParser, SeveralCallsAndHermesJson) {
  const std::string text =
      "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  for (size_t piece : {0, 1, 3}) {
    Calls c = tool_parse(text, kTools, piece);
    EXPECT_EQ(c.content, "");
    ASSERT_EQ(c.calls.size(), 2u);
    EXPECT_EQ(c.calls[0].name, "noop");
    EXPECT_EQ(c.calls[0].arguments, "{}");
    EXPECT_EQ(c.calls[1].name, "get_weather");
    EXPECT_EQ(c.calls[1].arguments, "{\"city\":\"Oslo\"}");
    EXPECT_NE(c.calls[0].id, c.calls[1].id);
  }
}

TEST(ToolCallParser, UnparsableOrUnclosedBlocksStayContent) {
  for (size_t piece : {0, 1, 5}) {
    Calls c = tool_parse("A <tool_call>not a call</tool_call> B", kTools, piece);
    EXPECT_EQ(c.content, "A <tool_call>not a call</tool_call> B");
    EXPECT_TRUE(c.calls.empty());
    c = tool_parse("Text <tool_call>\n<function=noop>\n", kTools, piece);  // cut off by max_tokens
    EXPECT_EQ(c.content, "Text <tool_call>\n<function=noop>\n");
    c = tool_parse("plain text ending in a space ", kTools, piece);
    EXPECT_EQ(c.content, "plain text ending in a space ");
    c = tool_parse("x <tool_ca", kTools, piece);
    EXPECT_EQ(c.content, "x <tool_ca");
  }
  // Missing </function>, a parameter without its end tag, a JSON body without a name: not calls.
  EXPECT_FALSE(ToolCallParser::parse_block("<function=f>\n<parameter=a>\n1\n</parameter>\n", kTools));
  EXPECT_FALSE(ToolCallParser::parse_block("<function=f>\n<parameter=a>\n1\n</function>", kTools));
  EXPECT_FALSE(ToolCallParser::parse_block("{\"arguments\": {}}", kTools));
  EXPECT_FALSE(ToolCallParser::parse_block("{\"name\": \"f\"", kTools));
  // A function the request did not declare is still returned (its values stay strings), as vLLM does.
  auto c = ToolCallParser::parse_block("<function=other>\n<parameter=n>\n5\n</parameter>\n</function>", kTools);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->arguments, "{\"n\":\"5\"}");
  // Non-string values that are not JSON are kept as text; "null" is null.
  c = ToolCallParser::parse_block(
      "<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=options>\nnull\n</parameter>\n</"
      "function>",
      kTools);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->arguments, "{\"days\":\"three\",\"options\":null}");
  // JSON in the model's output nested past the request limit (64 levels) is not parsed: a Hermes block is then no
  // call, a parameter value stays text (walking a 100,000-level value would overflow the stack).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_FALSE(ToolCallParser::parse_block("{\"name\": \"f\", \"arguments\": {\"x\": " + deep + "}}", kTools));
  c = ToolCallParser::parse_block("<function=get_weather>\n<parameter=days>\n" + deep + "\n</parameter>\n</function>",
                                  kTools);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->arguments, "{\"days\":\"" + deep + "\"}");
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("a\nb\r\nc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

}  // namespace
}  // namespace flashnext::server

// The forced tool-call format follows what the chat template writes (server/structured_output.h).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/structured_output.h"

namespace flashnext::server {
namespace {

TEST(StructuredOutput, ToolCallFormatFollowsTheChatTemplate) {
  const std::filesystem::path root(FLASHNEXT_SOURCE_DIR);
  const auto qwen3 = chat::ChatTemplate::from_dir(root / "models/tiny-b-random");
  EXPECT_EQ(tool_call_format_of(&qwen3), grammar::ToolCallFormat::HermesJson);
  std::ifstream f(root / "tests/data/tokenizers/qwen3.8/chat_template.jinja");
  std::stringstream text;
  text << f.rdbuf();
  ASSERT_FALSE(text.str().empty());
  const chat::ChatTemplate qwen38(text.str(), "default");
  EXPECT_EQ(tool_call_format_of(&qwen38), grammar::ToolCallFormat::QwenXml);
  EXPECT_EQ(tool_call_format_of(nullptr), grammar::ToolCallFormat::QwenXml);
}

}  // namespace
}  // namespace flashnext::server
