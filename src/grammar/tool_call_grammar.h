// Tool calls as a grammar (grammar.h): what `tool_choice: "required"` or a named function forces the model to write,
// in the model's tool-call format (both are what server/output_parsers.h's ToolCallParser reads back):
//   - ToolCallFormat::QwenXml, Qwen3.8's (Qwen3-Coder XML):
//       <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//   - ToolCallFormat::HermesJson, Qwen3's:
//       <tool_call>\n{"name": "NAME", "arguments": ARGUMENTS}\n</tool_call>
//     with ARGUMENTS JSON text valid against the tool's `parameters` (json_schema.h), additionalProperties false
//     unless the tool sets it ({} for a tool without parameters).
// Calls are separated by a newline. In the XML format:
// parameters come in the order of the tool's `parameters.properties`; the `required` ones must appear, the others
// may be left out; no other names are allowed (a tool without `properties` takes no parameters). VALUE is, as the
// parser converts it back:
//   - for a parameter of type "string" (or with no type; the first non-null type of a list counts, as in the
//     parser): raw text: one of the `enum` / `const` strings when given; else UTF-8 text of at most `maxLength`
//     code points without '<' when maxLength is given; else any UTF-8 text that does not contain "</" (so that
//     neither "</parameter>" nor "</tool_call>" can appear inside it);
//   - for any other parameter: JSON text matching its schema (json_schema.h, with the same supported keywords).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace flashnext::grammar {

/// How a model writes tool calls (see the top of this file).
enum class ToolCallFormat { QwenXml, HermesJson };

/// The grammar of forced tool calls over `tools` (an OpenAI `tools` array: {"type": "function", "function":
/// {"name", "parameters"?}}). `only`: the name of the one function to call (tool_choice naming a function: exactly one
/// call); nullopt: `tool_choice: "required"`: calls of any of the tools, separated by a newline: one or more when
/// `parallel`, exactly one otherwise (`parallel_tool_calls: false`).
/// Throws Error naming the tool and the schema keyword when a parameter schema is unsupported (json_schema.h),
/// when `only` names no tool, or when `tools` is empty.
std::shared_ptr<const Grammar> tool_call_grammar(const nlohmann::ordered_json& tools,
                                                 const std::optional<std::string>& only,
                                                 ToolCallFormat format = ToolCallFormat::QwenXml,
                                                 bool parallel = true, const JsonSchemaOptions& options = {});

}  // namespace flashnext::grammar
