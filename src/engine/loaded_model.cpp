#include "engine/loaded_model.h"

#include "core/error.h"

namespace flashnext {

LoadedModel LoadedModel::load(const std::string& dir, const ModelOptions& options, bool with_chat_template) {
  std::unique_ptr<Model> model = Model::load(dir, options);
  Tokenizer tokenizer = Tokenizer::load(dir);
  const ModelConfig& config = model->config();
  if (tokenizer.vocab_size() > config.vocab_size)
    fail(
        "{}: the tokenizer has ids up to {} but the model's vocab_size ({}) is {}: the tokenizer does not belong to "
        "this model",
        tokenizer.source(), tokenizer.vocab_size() - 1, config.source, config.vocab_size);
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
