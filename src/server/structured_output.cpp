#include "server/structured_output.h"

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar/tool_call_grammar.h"
#include "server/api_error.h"

namespace flashnext::server {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

GrammarConstraint::GrammarConstraint(std::shared_ptr<grammar::TokenMasker> masker, std::optional<int32_t> reasoning_end)
    : masker_(std::move(masker)),
      matcher_(masker_->grammar_ptr()),
      reasoning_end_(reasoning_end),
      in_reasoning_(reasoning_end.has_value()),
      mask_(masker_->vocab().words()) {}

std::unique_ptr<TokenConstraint> GrammarConstraint::clone() const {
  return std::make_unique<GrammarConstraint>(masker_, reasoning_end_);
}

void GrammarConstraint::mask(std::span<float> logits) {
  if (in_reasoning_) return;
  masker_->fill_mask(matcher_, mask_);
  grammar::apply_token_mask(logits, mask_);
  for (float l : logits) {
    if (l > kNegInf) return;
  }
  fail("structured output: no token of the vocabulary can continue the grammar here");
}

void GrammarConstraint::accept(int32_t token) {
  if (in_reasoning_) {
    if (token == *reasoning_end_) in_reasoning_ = false;
    return;
  }
  if (!masker_->accept_token(matcher_, token))
    fail("structured output: token {} does not continue the grammar", token);
}

grammar::ToolCallFormat tool_call_format_of(const chat::ChatTemplate* chat_template) {
  if (!chat_template) return grammar::ToolCallFormat::QwenXml;
  using json = nlohmann::ordered_json;
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "probe", "parameters": {
      "type": "object", "properties": {"x": {"type": "integer"}}}}}])");
  const json messages = json::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}]}])");
  try {
    const std::string text = chat_template->render(messages, tools, /*add_generation_prompt=*/false);
    const size_t call = text.rfind("<tool_call>");
    if (call != std::string::npos && text.find("{\"name\"", call) != std::string::npos &&
        text.find("<function=", call) == std::string::npos)
      return grammar::ToolCallFormat::HermesJson;
  } catch (const std::exception&) {
  }
  return grammar::ToolCallFormat::QwenXml;
}

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer, std::vector<int64_t> eos_ids, int64_t vocab_rows,
                                   grammar::ToolCallFormat tool_format)
    : tokenizer_(tokenizer), vocab_rows_(vocab_rows), tool_format_(tool_format) {
  for (int64_t id : eos_ids) eos_ids_.push_back(int32_t(id));
  think_end_ = tokenizer_.token_to_id("</think>");
}

std::shared_ptr<grammar::TokenMasker> StructuredOutput::masker(
    const std::string& key, const std::function<std::shared_ptr<const grammar::Grammar>()>& compile) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first == key) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().second;
      }
    }
    if (!vocab_)
      vocab_ = grammar::TokenVocabulary::from_tokenizer(tokenizer_, eos_ids_, int32_t(vocab_rows_));
  }
  auto m = std::make_shared<grammar::TokenMasker>(compile(), vocab_);  // compiled outside the lock
  std::lock_guard lock(mutex_);
  cache_.emplace_front(key, m);
  if (cache_.size() > kCacheSize) cache_.pop_back();
  return m;
}

std::shared_ptr<const TokenConstraint> StructuredOutput::constraint_for(const ApiRequest& r, bool starts_in_reasoning) {
  std::shared_ptr<grammar::TokenMasker> m;
  try {
    if (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) {
      const std::optional<std::string> only =
          r.tool_choice == ToolChoice::Named ? std::optional<std::string>(r.forced_tool) : std::nullopt;
      const bool parallel = r.parallel_tool_calls;
      m = masker(fmt::format("tools:{}:{}:{}", only ? *only : std::string(), parallel, r.tools.dump()),
                 [&] { return grammar::tool_call_grammar(r.tools, only, tool_format_, parallel); });
    } else if (r.response_format == ResponseFormat::JsonObject) {
      m = masker("json_object", [] { return grammar::json_object_grammar(); });
    } else if (r.response_format == ResponseFormat::JsonSchema) {
      m = masker("schema:" + r.json_schema.dump(), [&] { return grammar::compile_json_schema(r.json_schema); });
    } else {
      return nullptr;
    }
  } catch (const Error& e) {
    const bool tools = r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named;
    throw ApiError(400, clip(e.what(), 300), tools ? "tools" : "response_format.json_schema.schema");
  }
  const std::optional<int32_t> end = starts_in_reasoning ? think_end_ : std::nullopt;
  return std::make_shared<GrammarConstraint>(std::move(m), end);
}

}  // namespace flashnext::server
