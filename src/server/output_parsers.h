// Parsers of the generated text of a chat completion, streaming or not (the same code runs on the whole text or on
// pieces of it; the concatenation of the deltas does not depend on how the text is cut):
//   - ReasoningParser: the model's `<think>...</think>` block becomes `reasoning_content` (vLLM's `qwen3`
//     reasoning parser);
//   - ToolCallParser: `<tool_call>...</tool_call>` blocks become OpenAI `tool_calls`. Two bodies are understood:
//     Qwen3-Coder XML (Qwen3.8's template, vLLM's `qwen3_coder` parser)
//         <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//     and Hermes JSON (Qwen3's template, vLLM's `hermes` parser)
//         <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashnext::server {

/// Splits generated text into reasoning and content.
///
/// When the prompt ends inside an open `<think>` block (Qwen3.8's generation prompt `<|im_start|>assistant\n<think>\n`)
/// the output starts as reasoning; otherwise it is reasoning only when it starts with `<think>` (Qwen3, where the
/// model writes the tag). Reasoning ends at `</think>`; the tags themselves are dropped, all other text is kept
/// as generated. Output that never closes its think block is all reasoning (a truncated thought).
class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);

  /// True when the rendered `prompt` leaves a `<think>` block open: in the text after the last `<|im_start|>`
  /// (the whole prompt when there is none), the last `<think>` comes after the last `</think>`.
  static bool prompt_opens_reasoning(std::string_view prompt);

  struct Delta {
    std::string reasoning, content;
  };
  /// Feeds the next piece of generated text; returns what is now certain. A possible partial tag at the end is held.
  Delta feed(std::string_view text);
  /// Ends the text: returns what was held.
  Delta finish();

 private:
  enum class State { Start, Reasoning, Content };
  State state_;
  std::string held_;
};

/// One parsed tool call.
struct ToolCall {
  std::string id;         ///< "call_" + 24 random characters
  std::string name;       ///< the function name
  std::string arguments;  ///< JSON text of an object
};

/// Extracts tool calls from the content text (after reasoning was split off).
///
/// Text outside tool-call blocks is content. Whitespace-only content next to a tool call (the "\n\n" the templates
/// put before a call) is dropped. A block that does not parse, or is not closed when the text ends, is kept as
/// content, tags included, so nothing the model wrote is lost.
class ToolCallParser {
 public:
  /// `tools`: the request's tool definitions (null or an array); their JSON-schema parameter types decide how XML
  /// parameter values are converted (see parse_block).
  explicit ToolCallParser(nlohmann::ordered_json tools);

  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Delta feed(std::string_view text);
  Delta finish();
  /// Tool calls returned so far.
  int calls() const { return calls_; }

  /// Parses the text between `<tool_call>` and `</tool_call>`; nullopt when it is neither valid Qwen3-Coder XML
  /// (a `<function=NAME>` block closed by `</function>`) nor a Hermes JSON object with a string "name".
  /// XML parameter values lose one leading and one trailing newline; a parameter whose schema type is "string"
  /// (or that the schema does not list) stays raw text; other values are read as JSON ("null" -> null) and kept
  /// as a string when they are not valid JSON.
  static std::optional<ToolCall> parse_block(std::string_view body, const nlohmann::ordered_json& tools);

 private:
  void emit_content(std::string text, Delta& d);
  nlohmann::ordered_json tools_;
  std::string held_;  // unprocessed text (a partial tag, or an open block's body)
  bool in_block_ = false;
  std::string pending_ws_;  // whitespace-only content not yet emitted
  int calls_ = 0;
};

}  // namespace flashnext::server
