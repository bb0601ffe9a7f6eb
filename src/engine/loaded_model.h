// Everything generation needs from a model folder, loaded once: the model, its tokenizer, its chat template and
// its generation defaults. Used by `flashnext generate`, `flashnext chat` (and the server).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generation_config.h"
#include "model/qwen4_exp/model.h"
#include "tokenizer/tokenizer.h"

namespace flashnext {

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Model> model;
  Tokenizer tokenizer;
  GenerationConfig generation;
  std::optional<chat::ChatTemplate> chat_template;  ///< absent when not loaded (load(..., false))

  /// Loads config.json + weights, tokenizer.json, generation_config.json and (with `with_chat_template`) the chat
  /// template of `dir`. Throws Error naming the file on any problem, and when the tokenizer can produce ids the
  /// model has no embedding row for (tokenizer vocabulary larger than `vocab_size`).
  static LoadedModel load(const std::string& dir, const ModelOptions& options = {}, bool with_chat_template = true);

  /// Prompt ids of a conversation: `messages` (an OpenAI-style JSON array) rendered by the chat template with the
  /// generation prompt added, `extra_vars` (e.g. {"enable_thinking": false}) and `tools` (null or a JSON array of
  /// tool definitions), then tokenized with special-token
  /// text parsed (as transformers' apply_chat_template(tokenize=True) does, no BOS added). Throws Error when no chat
  /// template was loaded, and the template's own errors.
  std::vector<TokenId> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& extra_vars = nullptr,
                                   const nlohmann::ordered_json& tools = nullptr) const;
  /// Prompt ids of raw text (no template; special-token text such as "<|im_start|>" becomes its id).
  std::vector<TokenId> raw_prompt(const std::string& text) const;
};

}  // namespace flashnext
