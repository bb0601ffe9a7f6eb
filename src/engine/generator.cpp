#include "engine/generator.h"

#include <chrono>

#include "core/error.h"

namespace flashnext {

void check_prompt(std::span<const TokenId> prompt, const ModelConfig& config) {
  if (prompt.empty()) fail("the prompt is empty: give at least one token");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size)
      fail("prompt token id {} at position {} is outside the model's vocabulary [0, {})", prompt[i], i,
           config.vocab_size);
  }
  if (int64_t(prompt.size()) >= config.max_position_embeddings)
    fail(
        "the prompt has {} tokens, but the model's context length (max_position_embeddings in {}) is {}; the prompt "
        "must be shorter than that to leave room for at least one generated token",
        prompt.size(), config.source, config.max_position_embeddings);
}

Generator::Generator(Model& model, const Tokenizer& tokenizer, const GenerationConfig& generation,
                     GenerationRequest request)
    : model_(model),
      request_((check_prompt(request.prompt, model.config()), std::move(request))),
      seq_(model.new_sequence()),
      sampler_(request_.params, model.config().vocab_size, request_.prompt),
      output_(tokenizer, generation, request_.params, model.config().vocab_size, int64_t(request_.prompt.size()),
              model.config().max_position_embeddings) {
  stats_.prompt_tokens = int64_t(request_.prompt.size());
  if (request_.speculative.enabled()) spec_ = std::make_unique<SpeculativeDecoder>(model_, request_.speculative);
}

TokenDelta Generator::step() {
  FN_CHECK(!finished(), "Generator::step called after the output finished ({})",
           finish_reason_name(output_.finish_reason()));
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const bool prefill = output_.token_ids().empty();
  if (spec_) {
    if (queued_at_ == queued_.size()) {
      queued_.clear();
      queued_at_ = 0;
      auto choose = [&](std::span<float> row) {
        const TokenId t = sampler_.sample(row);
        sampler_.accept(t);
        return t;
      };
      if (prefill) {
        context_ = request_.prompt;
        std::vector<float> logits = spec_->prefill(seq_, request_.prompt);
        queued_.push_back(choose(logits));
      } else {
        queued_ = spec_->step(seq_, context_, choose);
      }
      context_.insert(context_.end(), queued_.begin(), queued_.end());
    }
    const TokenId token = queued_[queued_at_++];
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    (prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
    if (!prefill) ++stats_.decode_steps;
    ++stats_.output_tokens;
    return output_.append(token);
  }
  std::vector<float> logits;
  if (prefill) {
    logits = model_.forward(seq_, request_.prompt, LogitsMode::Last);
  } else {
    const TokenId last = output_.token_ids().back();
    logits = model_.forward(seq_, std::span<const TokenId>(&last, 1), LogitsMode::Last);
  }
  const TokenId token = sampler_.sample(logits);
  sampler_.accept(token);
  const double dt = std::chrono::duration<double>(clock::now() - t0).count();
  (prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
  if (!prefill) ++stats_.decode_steps;
  ++stats_.output_tokens;
  return output_.append(token);
}

Generator generate(Model& model, const Tokenizer& tokenizer, const GenerationConfig& generation,
                   GenerationRequest request, const std::function<void(std::string_view)>& on_text) {
  Generator gen(model, tokenizer, generation, std::move(request));
  while (!gen.finished()) {
    TokenDelta d = gen.step();
    if (on_text && !d.text.empty()) on_text(d.text);
  }
  return gen;
}

}  // namespace flashnext
