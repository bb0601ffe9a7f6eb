// qwen4_exp (Qwen3.8-Flash-Next) language model: loading and the incremental forward.
//
// Usage:
//   auto model = flashnext::Model::load("models/tiny-b-random");
//   flashnext::SequenceState seq = model->new_sequence();
//   std::vector<float> logits = model->forward(seq, prompt_ids);           // [T * vocab], one row per prompt token
//   int next = argmax(last row); model->forward(seq, {&next, 1}, ...);     // decode: one token at a time
//
// A SequenceState holds everything the model remembers about one sequence (QSA K/V and raw indexer keys, GDN conv
// tails and recurrent states, PLE token history and conv tails, the number of tokens seen). Feeding a prompt in
// chunks of any size, then single tokens, gives the same logits as one forward over everything (up to float
// rounding). The math is the reference's (transformers `models/qwen4_exp`, docs MODEL.md); every computation goes
// through the ops interface (ops/ops.h), so the same model code runs on every backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loader/config.h"
#include "model/qwen4_exp/state.h"
#include "ops/ops.h"

namespace flashnext {

struct ModelWeights;

/// Options of Model::load.
struct ModelOptions {
  /// Backend to run on; null: the float32 CPU backend with `threads` threads.
  std::shared_ptr<Ops> ops;
  /// CPU threads when `ops` is null; 0: hardware concurrency.
  int threads = 0;
};

/// Which logits forward() returns.
enum class LogitsMode {
  All,   ///< one row per input token: [T, vocab]
  Last,  ///< only the last token's row: [1, vocab] (what decoding needs; skips T-1 lm_head rows)
};

/// Called during forward with the wide residual stream: index 0 is the embedding repeated into the hc streams
/// [T, S*H], index i (1 <= i < L) the stream after layer i-1, index L the output of the final hyper-connection
/// mixer [T, H] (input of lm_head); the same numbering as the reference's `output_hidden_states`. The tensor is on
/// the backend's device: use Model::download to read it.
using HiddenHook = std::function<void(int index, const Tensor& hidden)>;

class Model {
 public:
  /// Loads config.json and the safetensors weights of the model folder `dir` (qwen4_exp or qwen4_exp_text).
  /// Throws Error naming the file/tensor when the config is invalid or a tensor is missing or mis-shaped.
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  Ops& ops() const { return *ops_; }

  /// A fresh, empty sequence (position 0, zero states, PLE history = boundary token).
  SequenceState new_sequence() const;
  /// A deep copy of `seq` (prefix reuse, speculative branches).
  SequenceState clone_sequence(const SequenceState& seq) const;

  /// Feeds `ids` (the next tokens of the sequence) through the model, updating `seq`, and returns the next-token
  /// logits as a device tensor F32 [T, vocab] (LogitsMode::All) or [1, vocab] (Last).
  /// Throws Error (leaving `seq` unchanged) for an empty `ids`, a token id outside [0, vocab_size), or when the
  /// sequence would exceed max_position_embeddings.
  Tensor forward_tensor(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode = LogitsMode::All,
                        const HiddenHook& hook = {});
  /// forward_tensor, with the logits copied to the host: row-major [rows * vocab].
  std::vector<float> forward(SequenceState& seq, std::span<const int32_t> ids, LogitsMode mode = LogitsMode::All,
                             const HiddenHook& hook = {});

  /// Copies a float32 device tensor to a host vector.
  std::vector<float> download(const Tensor& t) const;

 private:
  Model() = default;
  void check_ids(const SequenceState& seq, std::span<const int32_t> ids) const;

  ModelConfig config_;
  std::shared_ptr<Ops> ops_;
  std::unique_ptr<ModelWeights> weights_;
};

}  // namespace flashnext
