// The output side of one sequence: incremental detokenization and the stop rules (EOS ids, stop token ids, stop
// strings, max_tokens, the model's context length). It only sees sampled token ids, so the single-sequence
// Generator and a batching server share it.
//
// Semantics (vLLM, OpenAI API):
//   - a token in the model's EOS ids (unless `ignore_eos`) or in `stop_token_ids` ends the output with reason
//     "stop"; it is recorded in the output ids but its text is not emitted;
//   - special tokens are not emitted as text (skip_special_tokens, vLLM's default);
//   - a stop string ends the output with reason "stop"; the text before it is emitted, the stop string itself only
//     with `include_stop_str_in_output`; text that may still become a stop string is held back;
//   - after `max_tokens` output tokens, or when prompt + output reach the context length (`max_position_embeddings`),
//     the output ends with reason "length" and the held-back text is released.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generation_config.h"
#include "engine/sampling.h"
#include "engine/stop.h"
#include "tokenizer/tokenizer.h"

namespace flashnext {

/// Why a sequence ended (the OpenAI `finish_reason`).
enum class FinishReason { None, Stop, Length };

/// "stop", "length", or "" for None.
const char* finish_reason_name(FinishReason r);

/// What appending one token produced.
struct TokenDelta {
  TokenId token = -1;
  std::string text;  ///< newly emitted text (may be empty: incomplete character, held back, special token)
  FinishReason finish = FinishReason::None;
  bool finished() const { return finish != FinishReason::None; }
};

class OutputProcessor {
 public:
  /// `tokenizer` and `generation` must outlive this object. `prompt_tokens` and `context_length` (the model's
  /// max_position_embeddings) bound the output: prompt + output <= context_length. Throws Error when `params` is
  /// invalid (see validate()).
  OutputProcessor(const Tokenizer& tokenizer, const GenerationConfig& generation, const SamplingParams& params,
                  int64_t vocab_size, int64_t prompt_tokens, int64_t context_length);

  /// Appends a sampled token and applies the stop rules. Throws Error after the output has finished.
  TokenDelta append(TokenId token);

  bool finished() const { return finish_ != FinishReason::None; }
  FinishReason finish_reason() const { return finish_; }
  /// Output token ids so far, including a final EOS / stop token.
  const std::vector<TokenId>& token_ids() const { return ids_; }
  /// All text emitted so far.
  const std::string& text() const { return text_; }
  /// The stop string that ended the output, or "" when none did.
  const std::string& stop_string() const { return stop_string_; }
  /// The token id that ended the output (EOS or a stop token id), or -1 when none did.
  TokenId stop_token() const { return stop_token_; }

 private:
  // Feeds the decoder's remaining bytes through the stop matcher and releases what it holds.
  void end(TokenDelta& d, FinishReason reason);

  const GenerationConfig& generation_;
  SamplingParams params_;
  int64_t max_output_;  // min(max_tokens, context_length - prompt_tokens)
  IncrementalDecoder decoder_;
  StopStringMatcher stops_;
  std::vector<TokenId> ids_;
  std::string text_, stop_string_;
  TokenId stop_token_ = -1;
  FinishReason finish_ = FinishReason::None;
};

}  // namespace flashnext
