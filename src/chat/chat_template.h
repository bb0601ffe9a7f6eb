// The model's chat template: turns an OpenAI-style conversation into the prompt text the model was trained on,
// exactly as transformers' `tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., **vars)`
// renders it (Jinja2 engine in chat/jinja.h).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja.h"

namespace flashnext::chat {

/// A loaded chat template plus the special-token strings transformers exposes to it.
///
/// Rendering context (as in transformers 5 `apply_chat_template`): `messages`, `tools` (None when absent),
/// `documents` (None), `add_generation_prompt`, the special tokens of tokenizer_config.json that are set
/// (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`,
/// `additional_special_tokens`), then the caller's extra variables (`enable_thinking`, `reasoning_effort`,
/// `preserve_thinking`, ...), which override the special tokens.
class ChatTemplate {
 public:
  /// Loads the template of a Hugging Face tokenizer folder, with transformers' precedence: `chat_template.jinja`
  /// when present, else `chat_template` of `tokenizer_config.json` (a string, or a list of {"name", "template"}
  /// of which "default" is used, and "tool_use" when tools are given and it exists); templates in
  /// `additional_chat_templates/NAME.jinja` are added by name. Special tokens come from tokenizer_config.json
  /// (a string or an AddedToken object's "content"). Throws Error if no template is found, a file is unreadable
  /// or the template does not parse (jinja::TemplateError naming the file and line).
  static ChatTemplate from_dir(const std::filesystem::path& dir);

  /// A template from source text. `special_tokens` is a tokenizer_config.json-like object from which the special
  /// tokens are taken (may be null). Throws jinja::TemplateError on a syntax error.
  ChatTemplate(std::string_view source, std::string name, const nlohmann::ordered_json& special_tokens = nullptr);

  /// Renders the prompt.
  /// `messages`: JSON array of message objects ({"role", "content", "reasoning_content", "tool_calls", ...});
  /// `tools`: null or a JSON array of tool definitions; `extra_vars`: null or an object of template variables.
  /// Object key order is kept (tojson prints keys in input order). Throws Error for malformed arguments and
  /// jinja::TemplateError for template errors: `message()` of an error the template raises with
  /// `raise_exception(msg)` is exactly msg (e.g. "No user query found in messages.").
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                     bool add_generation_prompt = true, const nlohmann::ordered_json& extra_vars = nullptr) const;

  /// bos_token / eos_token of tokenizer_config.json, when set.
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  /// Names of the templates (a single-template model has just "default").
  std::vector<std::string> template_names() const;

 private:
  ChatTemplate() = default;
  void set_special_tokens(const nlohmann::ordered_json& config);
  const jinja::Template& pick(bool have_tools) const;

  std::vector<std::pair<std::string, std::shared_ptr<const jinja::Template>>> templates_;
  std::vector<std::pair<std::string, jinja::Value>> special_tokens_;
  std::optional<std::string> bos_token_, eos_token_;
};

}  // namespace flashnext::chat
