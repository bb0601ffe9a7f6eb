#include "engine/loaded_model.h"

#include "core/error.h"
#include "loader/config.h"

namespace flashnext {

ModelConfig config_with_overrides(const std::string& dir, const nlohmann::json& overrides) {
  if (overrides.is_null()) return load_config(dir);
  FN_CHECK(overrides.is_object(), "--hf-overrides must be a JSON object of config fields, got {}", overrides.dump());
  const std::string path = config_path(dir);
  nlohmann::json doc = read_config_json(path);
  FN_CHECK(doc.is_object(), "{}: not a JSON object", path);
  const bool nested = doc.contains("text_config") && doc["text_config"].is_object();
  nlohmann::json& text = nested ? doc["text_config"] : doc;
  // Flat keys, or (as vLLM's --hf-overrides for a multimodal config) the text config's keys under "text_config".
  nlohmann::json flat = overrides;
  if (nested && overrides.contains("text_config")) {
    FN_CHECK(overrides.size() == 1 && overrides["text_config"].is_object(),
             "--hf-overrides: \"text_config\" must be an object and the only key, got {}", overrides.dump());
    flat = overrides["text_config"];
  }
  for (const auto& [key, value] : flat.items()) {
    FN_CHECK(text.contains(key), "--hf-overrides: '{}' is not a field of {}{}", key, path,
             nested ? "'s text_config (the fields the model reads; give them flat or under \"text_config\")" : "");
    text[key] = value;
  }
  return parse_config(doc, fmt::format("{} with --hf-overrides {}", path, overrides.dump()));
}

LoadedModel LoadedModel::load(const std::string& dir, const ModelOptions& options, bool with_chat_template,
                              const WeightSource& weights) {
  FN_CHECK(weights.dummy || weights.hf_overrides.is_null(),
           "--hf-overrides applies to --load-format dummy only: a checkpoint's tensors fix its config ({})", dir);
  // The tokenizer and the config first: a folder without a tokenizer, or with one that does not fit the config,
  // fails before any weight is read or made.
  Tokenizer tokenizer = Tokenizer::load(dir);
  const ModelConfig config = config_with_overrides(dir, weights.hf_overrides);
  if (tokenizer.vocab_size() > config.vocab_size)
    fail(
        "{}: the tokenizer has ids up to {} but the model's vocab_size ({}) is {}: the tokenizer does not belong to "
        "this model",
        tokenizer.source(), tokenizer.vocab_size() - 1, config.source, config.vocab_size);
  std::unique_ptr<Model> model =
      weights.dummy ? Model::random(config, options, weights.seed) : Model::load(dir, options);
  GenerationConfig generation = load_generation_config(dir, config);
  std::optional<chat::ChatTemplate> chat_template;
  if (with_chat_template) chat_template = chat::ChatTemplate::from_dir(dir);
  return LoadedModel{dir, std::move(model), std::move(tokenizer), std::move(generation), std::move(chat_template)};
}

std::vector<TokenId> LoadedModel::chat_prompt(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& extra_vars,
                                              const nlohmann::ordered_json& tools) const {
  FN_CHECK(chat_template.has_value(), "{}: the chat template was not loaded", dir);
  if (!messages.is_array() || messages.empty())
    fail("messages must be a non-empty JSON array of {{\"role\": ..., \"content\": ...}} objects, got {}",
         messages.is_array() ? "an empty array" : messages.type_name());
  return tokenizer.encode(chat_template->render(messages, tools, /*add_generation_prompt=*/true, extra_vars),
                          /*parse_special=*/true);
}

std::vector<TokenId> LoadedModel::raw_prompt(const std::string& text) const {
  return tokenizer.encode(text, /*parse_special=*/true);
}

}  // namespace flashnext
