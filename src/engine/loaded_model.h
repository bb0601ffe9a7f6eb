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

/// Where LoadedModel::load takes the weights from (vLLM's --load-format and --hf-overrides): the folder's checkpoint,
/// or (dummy) pseudo-random weights of the folder's config made on the device (Model::random with `seed`), for
/// profiling and serving benchmarks at a geometry without its checkpoint, with the config's fields overridden by the
/// JSON object `hf_overrides` (merged into text_config where the config has one; each key must be a field there).
struct WeightSource {
  bool dummy = false;
  nlohmann::json hf_overrides;  ///< null or an object; with a checkpoint, only null
  uint64_t seed = 0;
};

/// The config of `dir` with `overrides` (a JSON object, or null: none) merged into its text config. Throws Error
/// naming the file, or the key that is not a field of the config, or the override that is not an object.
ModelConfig config_with_overrides(const std::string& dir, const nlohmann::json& overrides);

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Model> model;
  Tokenizer tokenizer;
  GenerationConfig generation;
  std::optional<chat::ChatTemplate> chat_template;  ///< absent when not loaded (load(..., false))

  /// Loads config.json + weights (or makes them: `weights`), tokenizer.json, generation_config.json and (with
  /// `with_chat_template`) the chat template of `dir`. Throws Error naming the file on any problem, when the tokenizer
  /// can produce ids the model has no embedding row for (tokenizer vocabulary larger than `vocab_size`), and for
  /// overrides of a checkpoint's config.
  static LoadedModel load(const std::string& dir, const ModelOptions& options = {}, bool with_chat_template = true,
                          const WeightSource& weights = {});

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
