#include "engine/output.h"

#include <algorithm>

#include "core/error.h"

namespace flashnext {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    default:
      return "";
  }
}

OutputProcessor::OutputProcessor(const Tokenizer& tokenizer, const GenerationConfig& generation,
                                 const SamplingParams& params, int64_t vocab_size, int64_t prompt_tokens,
                                 int64_t context_length)
    : generation_(generation),
      params_(params),
      max_output_(std::min(params.max_tokens, context_length - prompt_tokens)),
      decoder_(tokenizer, /*skip_special_tokens=*/true),
      stops_(params.stop, params.include_stop_str_in_output) {
  validate(params_, vocab_size);
  FN_CHECK(max_output_ >= 1 || (params.max_tokens == 0 && prompt_tokens <= context_length),
           "the prompt has {} tokens but the context length (max_position_embeddings) is {}: no room "
           "to generate",
           prompt_tokens, context_length);
}

void OutputProcessor::end(TokenDelta& d, FinishReason reason) {
  auto r = stops_.feed(decoder_.finish());
  d.text += r.text;
  if (r.stopped) {
    stop_string_ = stops_.stops()[size_t(r.matched)];
    reason = FinishReason::Stop;
  } else {
    d.text += stops_.flush();
  }
  d.finish = finish_ = reason;
}

TokenDelta OutputProcessor::append(TokenId token) {
  FN_CHECK(!finished(), "OutputProcessor::append after the output finished ({})", finish_reason_name(finish_));
  TokenDelta d;
  d.token = token;
  ids_.push_back(token);
  const bool stop_id =
      std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) != params_.stop_token_ids.end();
  if (stop_id || (!params_.ignore_eos && generation_.is_eos(token))) {
    stop_token_ = token;
    end(d, FinishReason::Stop);
  } else {
    auto r = stops_.feed(decoder_.push(token));
    d.text = std::move(r.text);
    if (r.stopped) {
      stop_string_ = stops_.stops()[size_t(r.matched)];
      d.finish = finish_ = FinishReason::Stop;
    } else if (int64_t(ids_.size()) >= max_output_) {
      end(d, FinishReason::Length);
    }
  }
  text_ += d.text;
  return d;
}

}  // namespace flashnext
