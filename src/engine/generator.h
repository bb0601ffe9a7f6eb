// Single-sequence generation: prefill the prompt, then decode one token per step, sampling with the request's
// parameters and applying the stop rules, streaming text as it is decoded. Built from the pieces a batching
// server reuses: Sampler (engine/sampling.h) and OutputProcessor (engine/output.h).
//
//   Generator gen(model, tokenizer, generation_config, {prompt_ids, params});
//   while (!gen.finished()) { TokenDelta d = gen.step(); fputs(d.text.c_str(), stdout); }
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation_config.h"
#include "engine/output.h"
#include "engine/sampling.h"
#include "engine/speculative.h"
#include "model/qwen4_exp/model.h"
#include "tokenizer/tokenizer.h"

namespace flashnext {

/// One generation request: the prompt as token ids and the sampling / stop parameters.
struct GenerationRequest {
  std::vector<TokenId> prompt;
  SamplingParams params;
  /// Speculative decoding (engine/speculative.h); Method::None: one token per forward.
  SpeculativeConfig speculative{};
};

/// Token counts and wall times of one generation. Prefill = the forward over the prompt plus sampling the first
/// output token; decode = every later step (one forward over the previous token plus sampling).
struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;  ///< sampled tokens, including a final EOS / stop token
  int64_t decode_steps = 0;   ///< output_tokens - 1 once anything was generated
  double prefill_seconds = 0, decode_seconds = 0;
  double prompt_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_steps / decode_seconds : 0; }
};

/// Checks a prompt against a model before any work: non-empty, every id in [0, vocab_size), and shorter than the
/// context length (max_position_embeddings) so that at least one token can be generated. Throws Error saying which
/// rule failed (and where).
void check_prompt(std::span<const TokenId> prompt, const ModelConfig& config);

class Generator {
 public:
  /// Validates the request (check_prompt, validate(params)) and prepares a fresh sequence; no forward runs yet.
  /// `model`, `tokenizer` and `generation` must outlive the Generator.
  Generator(Model& model, const Tokenizer& tokenizer, const GenerationConfig& generation, GenerationRequest request);

  /// Runs one step: the prefill on the first call, one decode step afterwards; samples one token and returns what
  /// it produced. With speculative decoding a verify step yields several tokens: they are returned one per call
  /// (the calls after the verify run no forward). Throws Error when called after the output finished.
  TokenDelta step();
  /// Acceptance figures of speculative decoding (zeros without it).
  /// Drafted, accepted and emitted tokens of the verify steps, counted up to the last token returned (the tokens a
  /// stop condition cut off the last step do not count, as in the server's metrics).
  SpeculativeStats speculative_stats() const { return spec_ ? spec_->stats_using(queued_at_) : SpeculativeStats{}; }

  bool finished() const { return output_.finished(); }
  FinishReason finish_reason() const { return output_.finish_reason(); }
  const std::vector<TokenId>& prompt() const { return request_.prompt; }
  /// Output token ids so far (including a final EOS / stop token).
  const std::vector<TokenId>& output_ids() const { return output_.token_ids(); }
  /// Text emitted so far.
  const std::string& text() const { return output_.text(); }
  const OutputProcessor& output() const { return output_; }
  const GenerationStats& stats() const { return stats_; }

 private:
  Model& model_;
  GenerationRequest request_;
  SequenceState seq_;
  Sampler sampler_;
  OutputProcessor output_;
  GenerationStats stats_;
  std::unique_ptr<SpeculativeDecoder> spec_;
  std::vector<TokenId> context_;  ///< prompt + sampled tokens (the proposers' context)
  std::vector<TokenId> queued_;   ///< tokens of the last verify step not yet returned by step()
  size_t queued_at_ = 0;
};

/// Runs `request` to the end, calling `on_text` with every non-empty piece of text as soon as it is final.
/// Returns the finished generator (its ids, text, finish reason and stats).
Generator generate(Model& model, const Tokenizer& tokenizer, const GenerationConfig& generation,
                   GenerationRequest request, const std::function<void(std::string_view)>& on_text = {});

}  // namespace flashnext
