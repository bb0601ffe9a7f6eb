// The model's generation defaults: EOS ids and sampling defaults, from `generation_config.json` and config.json.
//
// Follows vLLM (`--generation-config auto`): EOS = the union of generation_config.json `eos_token_id` (an int or a
// list) and config.json's eos ids; sampling defaults are taken only from keys present in generation_config.json
// (`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `max_new_tokens`), everything else keeps the
// SamplingParams defaults. Like vLLM, `do_sample` is ignored (temperature decides greedy vs sampling).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampling.h"
#include "loader/config.h"

namespace flashnext {

struct GenerationConfig {
  std::string source;                  ///< the generation_config.json read, or "" when the folder has none
  std::vector<int64_t> eos_token_ids;  ///< union, config.json's first, no duplicates
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;

  /// SamplingParams with the defaults above applied.
  SamplingParams default_sampling() const;
  /// True when `id` is one of the EOS ids.
  bool is_eos(int64_t id) const;
};

/// Reads `model_dir`/generation_config.json when present and merges it with `config` (its eos ids). Throws Error
/// naming the file and field on malformed JSON, a wrongly typed value or an EOS id outside [0, vocab_size).
GenerationConfig load_generation_config(const std::string& model_dir, const ModelConfig& config);

/// The same from an already-parsed document (`source` names it in errors); `doc` may be null (no file).
GenerationConfig parse_generation_config(const nlohmann::json& doc, const std::string& source,
                                         const ModelConfig& config);

}  // namespace flashnext
