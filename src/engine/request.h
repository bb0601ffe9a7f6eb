// Requests of the serving engine: what a client asked for (prompt token ids, sampling parameters, log-probabilities)
// and the channel over which the scheduler hands the generated tokens back to the client's thread.
//
// Threads: the scheduler (engine thread) is the only producer of a RequestStream; one client thread (an HTTP
// handler) is its only consumer. The client thread may cancel at any time (client gone, stop string matched); the
// scheduler sees the flag at its next step, frees the request's memory and finishes the stream with Abort.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampling.h"

namespace flashnext {

using Clock = std::chrono::steady_clock;

/// Log-probabilities of one generated token under the model's raw next-token distribution (log_softmax of the
/// logits before penalties, temperature and filtering: vLLM's default `raw_logprobs`).
struct TokenLogprobs {
  float logprob = 0;  ///< log p(chosen token)
  std::vector<std::pair<int32_t, float>>
      top;  ///< the `top_logprobs` most likely (id, log p), descending, lower id first on ties
};

/// Why the scheduler ended a request. (Text-level reasons such as a stop string are decided by the client thread's
/// OutputProcessor, engine/output.h, which then cancels the request.)
enum class EndReason {
  None,    ///< still running
  Stop,    ///< an EOS token (unless ignore_eos) or a stop token id
  Length,  ///< max_tokens reached, or the sequence reached max_model_len
  Abort,   ///< cancelled by the client thread
  Error,   ///< the engine failed on this request (message in RequestStream::Update::error)
};

/// "stop", "length", "abort", "error" (None: "").
const char* end_reason_name(EndReason r);

/// Producer/consumer channel of one request (see the threading note at the top of this file).
class RequestStream {
 public:
  /// What arrived since the consumer's previous wait().
  struct Update {
    /// Log-probabilities of prompt tokens 1, 2, ... (the first has none) when the request asked for them
    /// (Request::prompt_logprobs), in order, arriving before the first output token.
    std::vector<TokenLogprobs> prompt_logprobs;
    std::vector<int32_t> tokens;           ///< new output tokens, in order
    std::vector<TokenLogprobs> logprobs;   ///< one per token when logprobs were requested, else empty
    std::vector<Clock::time_point> times;  ///< when each token was produced
    EndReason finish = EndReason::None;    ///< != None: the request ended and nothing more will arrive
    std::optional<int32_t> stop_token;     ///< the EOS / stop token id that ended it (finish == Stop)
    std::string error;                     ///< finish == Error: what went wrong
    /// When the scheduler first admitted the request to the running batch: set in the one update that follows that
    /// admission (not again after a preemption). Arrival to this is the request's queue time.
    std::optional<Clock::time_point> scheduled;
    /// With `scheduled`: prompt tokens found in the prefix cache at that admission (not prefilled; vLLM's
    /// usage.prompt_tokens_details.cached_tokens). 0 otherwise.
    int64_t cached_tokens = 0;
  };

  // ---- producer (scheduler) ----
  /// Appends one generated token (with its log-probabilities when requested).
  void push_token(int32_t token, std::optional<TokenLogprobs> logprobs, Clock::time_point when);
  /// Appends log-probabilities of the next prompt tokens (see Update::prompt_logprobs).
  void push_prompt_logprobs(std::vector<TokenLogprobs> logprobs);
  /// Records that the request was admitted to the running batch at `when`, `cached_tokens` of its prompt found in
  /// the prefix cache; only the first call counts.
  void mark_scheduled(Clock::time_point when, int64_t cached_tokens = 0);
  /// Ends the stream. Later calls are ignored (the first reason wins).
  void finish(EndReason reason, std::optional<int32_t> stop_token = {}, std::string error = {});

  // ---- consumer (client thread) ----
  /// Waits up to `timeout` for new tokens or the end and returns them (empty when the time ran out).
  Update wait(std::chrono::milliseconds timeout);
  /// Asks the scheduler to drop the request (idempotent). The stream still ends with a finish event.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  bool finished() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  Update pending_;
  bool finished_ = false;
  bool scheduled_ = false;
  std::atomic<bool> cancelled_{false};
};

/// One generation request as the scheduler receives it.
struct Request {
  std::string id;                      ///< unique, for logs and errors
  std::vector<int32_t> prompt;         ///< prompt token ids, non-empty, each in [0, vocab)
  SamplingParams sampling;             ///< validated by the Scheduler at submit
  int top_logprobs = -1;               ///< -1: no log-probabilities; 0..20: the chosen token's plus this many top ones
  /// -1: none; 0..20: log-probabilities of every prompt token after the first (vLLM's prompt_logprobs; echo with
  /// logprobs), with this many top alternatives. Such a request samples on the host and is prefilled in chunks of
  /// at most kPromptLogprobsChunk tokens (the logits of a whole chunk are brought to the host).
  int prompt_logprobs = -1;
  /// Scheduling priority under SchedulingPolicy::Priority: lower values are admitted first (vLLM's convention);
  /// must be 0 under FCFS.
  int64_t priority = 0;
  /// Speculative decoding of this request (the server's --speculative): -1 the server's setting; 0 off (opt-out);
  /// 1..K at most this many drafts per step (K: the server's). Above 0 without speculation, or above K: Error at
  /// submit.
  int speculative_tokens = -1;
  std::vector<int64_t> eos_token_ids;  ///< the model's EOS ids (ignored with sampling.ignore_eos)
  Clock::time_point arrival = Clock::now();
  std::shared_ptr<RequestStream> stream = std::make_shared<RequestStream>();
};

/// The most log-probabilities a request may ask for (OpenAI's limit, vLLM's default max_logprobs).
inline constexpr int kMaxTopLogprobs = 20;
/// The longest prefill chunk of a request with prompt log-probabilities (its logits rows come to the host: 256 rows
/// of a 248,320-entry vocabulary are 254 MB).
inline constexpr int64_t kPromptLogprobsChunk = 256;

/// log_softmax of `logits` (double accumulation) evaluated at `token`, plus the `top` most likely entries
/// (descending, lower id first on ties). Non-finite logits count as -inf. Throws Error when no logit is finite.
TokenLogprobs compute_logprobs(std::span<const float> logits, int32_t token, int top);

}  // namespace flashnext
