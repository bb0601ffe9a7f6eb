// Speculative decoding for one sequence (docs ENGINE.md "Speculative decoding"): a proposer drafts K tokens after
// the committed context, the target model verifies them in one forward over K+1 tokens, and the longest prefix of
// drafts that matches the target's own choices is accepted, plus the target's token after it (the bonus token, or
// the correction at the first mismatch). Proposers:
//   - ngram:K (prompt lookup, vLLM's `ngram` method): the last n tokens of the context (n = 3, 2, 1) matched against
//     the earlier context; the K tokens that followed the most recent match are the drafts;
//   - mtp:K: the checkpoint's MTP layer (Model::mtp_forward), chained K times from the trunk's pre-mixer state.
// The target's choice at each verified position comes from the caller (its sampler, which commits the token to its
// penalties / history), so greedy output equals decoding without speculation, and sampled output keeps the target's
// distribution: with point-mass drafts (both proposers draft greedily) "sample from the target, accept when it equals
// the draft" is exactly the rejection rule of vLLM's sampler (accept with probability p(d); after a rejection, the
// residual max(p - q, 0) normalised is p without d) and consumes one sample per emitted token, as plain decoding does.
//
// Rollback: the sequence's recurrent state (Model::snapshot_state: GDN conv + recurrent, PLE conv tails and n-gram
// history, lengths) is copied before the verify, and the verify keeps the inputs of that state (BatchItem::
// keep_inputs: the GDN conv inputs and gates, the PLE conv inputs of its rows); after a partial acceptance the state is
// put back and advanced over the accepted tokens by those layers' state ops alone (Model::replay_state), not by a
// second forward of the model (which a model over several nodes still does). QSA K/V and indexer keys past the
// committed length are left in place and overwritten when those positions are fed again.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/qwen4_exp/model.h"

namespace flashnext {

/// `--speculative METHOD:K`.
struct SpeculativeConfig {
  enum class Method { None, Ngram, Mtp, Custom };
  Method method = Method::None;
  int k = 0;  ///< drafts per step, 1..kMaxDrafts

  static constexpr int kMaxDrafts = 8;
  bool enabled() const { return method != Method::None; }
  /// "mtp:K" or "ngram:K" with K in 1..8; an empty string is None. Throws Error naming --speculative for an unknown
  /// proposer or a K outside 1..8.
  static SpeculativeConfig parse(std::string_view spec);
  /// "mtp:3", "ngram:4", "custom:2", "none".
  std::string str() const;
};

/// Prompt-lookup drafts (vLLM `NgramProposer`): for n = max_n down to min_n, the last n tokens of `context` are
/// searched for in context[0 .. size-1) (an earlier occurrence, the most recent one first); the first n with a
/// match gives the (up to) `k` tokens that followed it. Empty when nothing matches or k <= 0.
std::vector<int32_t> ngram_propose(std::span<const int32_t> context, int k, int max_n = 3, int min_n = 1);

/// Greedy MTP drafts chained from `out`, the MTP layer's output after its catch-up over the accepted positions (the
/// last row's logits give the first draft): up to `max_drafts` tokens (none when max_drafts <= 0), each fed back with
/// the MTP layer's own pre-mixer row of the step before; stops at max_position_embeddings. seq.mtp_length is put back
/// afterwards: the draft positions' MTP K/V are overwritten by the next catch-up. Used by SpeculativeDecoder and the
/// scheduler's ModelRunner.
std::vector<int32_t> chain_mtp_drafts(Model& model, SequenceState& seq, const Model::MtpOutput& out, int max_drafts);
/// chain_mtp_drafts for several sequences at once (the drafts of a server step): sequence i chains from outs[i] for
/// up to max_drafts[i] tokens; each draft position of all the sequences still drafting is one Model::mtp_forward_batch
/// step and one download of their logits rows. Each sequence's drafts equal chain_mtp_drafts on it alone (bit for
/// bit on the CPU backend). The three spans have one entry per sequence (Error otherwise).
std::vector<std::vector<int32_t>> chain_mtp_drafts_batch(Model& model, std::span<SequenceState* const> seqs,
                                                         std::span<const Model::MtpOutput> outs,
                                                         std::span<const int> max_drafts);

/// Acceptance figures of a run.
struct SpeculativeStats {
  int64_t steps = 0;     ///< verify steps (each one target forward over 1 + drafts tokens)
  int64_t drafted = 0;   ///< draft tokens proposed
  int64_t accepted = 0;  ///< draft tokens accepted
  int64_t emitted = 0;   ///< tokens produced by the steps (accepted + one bonus / correction each)
  int64_t rollbacks = 0;  ///< partial acceptances: the state from before the verify put back and advanced over the
                          ///< accepted tokens (Model::replay_state)
  int64_t refeeds = 0;    ///< rollbacks that fed the accepted tokens again instead (a model over several nodes)
  /// Tokens per verify step (emitted / steps): 1 + mean accepted drafts.
  double mean_accepted_length() const { return steps ? double(emitted) / double(steps) : 0.0; }
  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
};

/// The target's choice at one verified position: given the logits row (F32 [vocab], may be modified), returns the
/// token and commits it to the caller's history (the sampler's accept). Called in position order.
using ChooseToken = std::function<int32_t(std::span<float> logits)>;

/// A proposer of one's own (Method::Custom): up to `max_drafts` draft tokens after `context` (prompt + output, its
/// last token not fed yet); more are cut off.
using Proposer = std::function<std::vector<int32_t>(std::span<const int32_t> context, int max_drafts)>;

/// Speculative decoding of one sequence. Usage (what Generator does):
///   SpeculativeDecoder spec(model, config);
///   logits = spec.prefill(seq, prompt);  tok = choose(logits);           // first token
///   while (...) { for (tok : spec.step(seq, context_with_tok, choose)) emit(tok); }
/// The scheduler can adopt it per running sequence: propose() -> a verify item of 1 + K tokens in its batch
/// (LogitsMode::All, with the wide residual when the proposer is MTP) -> accept() -> commit(); see ENGINE.md.
class SpeculativeDecoder {
 public:
  /// `model` must outlive the decoder; Method::Mtp needs model.has_mtp() (Error naming --speculative otherwise).
  SpeculativeDecoder(Model& model, SpeculativeConfig config);
  /// With a proposer of one's own (tests, external draft models): Method::Custom with `k` drafts per step (1..8).
  SpeculativeDecoder(Model& model, int k, Proposer proposer);

  /// Feeds the prompt (one forward) and returns its last logits row [vocab]; with MTP keeps the trunk's pre-mixer
  /// state for the first draft.
  std::vector<float> prefill(SequenceState& seq, std::span<const int32_t> prompt);

  /// One speculative step. `context` = prompt + output so far; its last token is the one not fed yet. Drafts up to
  /// K tokens (fewer near max_position_embeddings or when ngram finds less), verifies them, and returns the tokens
  /// `choose` produced: the accepted drafts and the bonus / correction token (1 .. K+1 tokens). The sequence then
  /// holds exactly context + the accepted drafts (the returned tokens minus the last, which is fed next step).
  std::vector<int32_t> step(SequenceState& seq, std::span<const int32_t> context, const ChooseToken& choose);

  /// The drafts for the next step after `context` (at most `max_drafts`); with MTP this runs the MTP layer (its
  /// catch-up over the last accepted positions, then the chained draft steps).
  std::vector<int32_t> propose(SequenceState& seq, std::span<const int32_t> context, int max_drafts);

  const SpeculativeStats& stats() const { return stats_; }
  /// The stats as if the last step had produced only its first `used` tokens (a stop condition cut it; the server
  /// counts the same way): emitted less the unused ones, accepted drafts only up to the last used token (a draft that
  /// ends the request counts as accepted).
  SpeculativeStats stats_using(size_t used) const;
  /// The drafts of the last step (valid from its propose on, e.g. inside `choose`).
  const std::vector<int32_t>& last_drafts() const { return drafts_; }
  const SpeculativeConfig& config() const { return config_; }

 private:
  Model& model_;
  SpeculativeConfig config_;
  SpeculativeStats stats_;
  Proposer custom_;
  std::vector<int32_t> drafts_;
  size_t last_out_ = 0, last_accepted_ = 0;  ///< tokens and accepted drafts of the last step
  // MTP: trunk pre-mixer rows not yet seen by the MTP layer (positions seq.mtp_length ..), and the tokens after
  // each of them but the last (whose successor is the context's last token, known at the next propose).
  Tensor mtp_hidden_;
  std::vector<int32_t> mtp_next_;
};

}  // namespace flashnext
