// Sampling: request parameters and the per-request sampler (penalties, temperature, top-k, top-p, min-p, seeded
// draw). One Sampler per sequence; the server samples a batch by calling each sequence's Sampler on its logits row.
//
// Pipeline and semantics (those of Hugging Face `generate` / vLLM, which users know):
//   1. penalties on the raw logits:
//      - repetition (HF RepetitionPenaltyLogitsProcessor, CTRL paper): for every distinct token seen in prompt or
//        output, a logit l > 0 becomes l / r and l <= 0 becomes l * r;
//      - frequency and presence (OpenAI): l -= frequency * count + presence * [count > 0], where count is how often
//        the token occurs in the output so far (the prompt does not count);
//      then the logit bias (OpenAI `logit_bias`: l += bias[id]); then, while fewer than `min_tokens` tokens were
//      generated, the EOS ids (unless ignore_eos) and `stop_token_ids` get -inf (vLLM's min_tokens); then the
//      token constraint (structured output: a grammar's mask) sets every token it forbids to -inf.
//   2. temperature: l / T; T below 1e-5 means greedy decoding (argmax of the penalised logits, lowest id on ties,
//      no filtering, no random draw), as in vLLM.
//   3. top-k: keep the logits >= the k-th largest (ties with the k-th are kept, as torch.topk thresholding does).
//   4. top-p (nucleus): over the tokens left, in descending order, keep a token while the probability mass of the
//      tokens before it is < p (so the token that crosses p is kept; at least one token is always kept).
//   5. min-p: keep tokens whose probability is >= min_p * (largest probability).
//   6. draw from softmax of what is left by inverse CDF (over the survivors in an order fixed by the logits alone),
//      with a uniform double from a std::mt19937_64 seeded once per request: the same seed and logits give the same
//      tokens on every platform.
// Removed tokens get logit -inf. Logits are float32, one per vocabulary entry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flashnext {

/// A rule on which tokens may come next, with its own state (structured output: the server's grammar constraint,
/// server/constraint.h). One instance per sequence, used by that sequence's Sampler on the engine thread only:
/// mask() before each draw, then accept() with the token appended.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  /// A fresh copy in the initial state (SamplingParams holds a prototype; each Sampler clones its own).
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  /// Sets the logit of every token that may not come next to -inf (`logits`: [vocab]). Throws Error when no token
  /// may come next (the constraint can neither go on nor end).
  virtual void mask(std::span<float> logits) = 0;
  /// Records the token appended to the sequence. Throws Error when the constraint forbids it.
  virtual void accept(int32_t token) = 0;
};

/// Per-request generation parameters (the names and ranges of vLLM's SamplingParams / the OpenAI API).
struct SamplingParams {
  double temperature = 1.0;                 ///< >= 0; < 1e-5 means greedy
  int64_t top_k = 0;                        ///< 0 or -1: disabled; otherwise >= 1
  double top_p = 1.0;                       ///< in (0, 1]; 1 disables
  double min_p = 0.0;                       ///< in [0, 1]; 0 disables
  double repetition_penalty = 1.0;          ///< > 0; 1 disables
  double presence_penalty = 0.0;            ///< in [-2, 2]
  double frequency_penalty = 0.0;           ///< in [-2, 2]
  std::optional<uint64_t> seed;             ///< RNG seed; absent: seeded from std::random_device
  int64_t max_tokens = 256;  ///< >= 0: most tokens to generate (the context length may stop it earlier); 0: the
                             ///< prompt is only scored (prompt log-probabilities), nothing is generated
  int64_t min_tokens = 0;    ///< in [0, max_tokens]: EOS and stop_token_ids are masked until this many were generated
  std::vector<std::pair<int32_t, float>> logit_bias;  ///< (token id, bias in [-100, 100]) added to the logits
  /// Structured output: a prototype each Sampler clones (null: none). Requests with a constraint sample on the host.
  std::shared_ptr<const TokenConstraint> constraint;
  std::vector<std::string> stop;            ///< stop strings (non-empty), matched on the detokenized output
  std::vector<int64_t> stop_token_ids;      ///< extra stop tokens, besides the model's EOS ids
  bool ignore_eos = false;                  ///< keep generating after an EOS token (it is then emitted as text)
  bool include_stop_str_in_output = false;  ///< emit the matched stop string (vLLM default: no)

  /// True when decoding is greedy (temperature below 1e-5).
  bool greedy() const { return temperature < 1e-5; }
};

/// Checks every field against the ranges above; throws Error naming the field, its value and the allowed range.
/// `vocab_size` bounds `stop_token_ids` and the ids of `logit_bias`.
void validate(const SamplingParams& p, int64_t vocab_size);

// ---- The pipeline steps, exposed so they can be tested and reused on a batch row. All work in place. ----

/// HF repetition penalty over `tokens` (distinct ids, all in range): l > 0 -> l / penalty, else l * penalty.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> tokens, double penalty);
/// OpenAI penalties: logits[id] -= frequency * count + presence for each (id, count) with count > 0.
void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> ids, std::span<const int32_t> counts,
                              double presence, double frequency);
/// logits /= temperature (temperature > 0).
void apply_temperature(std::span<float> logits, double temperature);
/// Keeps the logits >= the k-th largest; the rest become -inf. k <= 0 or k >= size: no change.
void apply_top_k(std::span<float> logits, int64_t k);
/// Nucleus filter as described above; p >= 1: no change.
void apply_top_p(std::span<float> logits, double p);
/// Min-p filter: removes tokens with probability < min_p * max probability; min_p <= 0: no change.
void apply_min_p(std::span<float> logits, double min_p);
/// Index of the largest logit, the lowest index on ties. Throws Error on an empty span or when all are NaN/-inf.
int32_t argmax(std::span<const float> logits);
/// A uniform double in [0, 1) from the top 53 bits of one draw (portable, unlike std::uniform_real_distribution).
double uniform01(std::mt19937_64& rng);
/// Draws an id from softmax(logits) (computed in double) by inverse CDF over ids in increasing order.
/// (Sampler::sample filters and draws on the survivors only; this is the same draw on a full row.)
/// Throws Error when no logit is finite (nothing can be drawn).
int32_t sample_from_logits(std::span<const float> logits, std::mt19937_64& rng);

/// The sampler of one sequence: holds its parameters, its RNG and the token history the penalties need.
class Sampler {
 public:
  /// `prompt` ids count for the repetition penalty; `eos_ids` are the model's EOS ids that min_tokens masks.
  /// Validates `params` (see validate()), the prompt ids and the EOS ids; clones params.constraint.
  Sampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt,
          std::span<const int64_t> eos_ids = {});

  /// Runs the pipeline on `logits` (size vocab_size) and returns the chosen token. On return `logits` holds the
  /// penalised logits (step 1; temperature and filters work on a copy). Throws Error on a NaN logit or a wrong size.
  /// Does not record the token: call accept() with the token actually appended to the sequence.
  int32_t sample(std::span<float> logits);
  /// Records an output token (for the penalties, min_tokens and the constraint). Throws Error when it is out of
  /// range or the constraint forbids it.
  void accept(int32_t token);
  /// Output tokens accepted so far.
  int64_t num_output() const { return num_output_; }

  const SamplingParams& params() const { return params_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  void note_seen(int32_t token);

  SamplingParams params_;
  int64_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_mask_;      // [vocab]: seen in prompt or output
  std::vector<int32_t> seen_;           // distinct ids seen, in first-seen order
  std::vector<int32_t> output_counts_;  // [vocab]: occurrences in the output (allocated lazily when needed)
  std::vector<int32_t> output_ids_;     // distinct ids with output_counts_ > 0
  std::vector<int32_t> counts_buf_;     // scratch: counts aligned with output_ids_
  std::vector<int32_t> min_tokens_ids_;  // masked while num_output_ < min_tokens: EOS (unless ignore_eos) + stop ids
  std::unique_ptr<TokenConstraint> constraint_;
  int64_t num_output_ = 0;
};

}  // namespace flashnext
