// `flashnext inspect`: architecture, per-layer plan, parameter counts, stored bytes and memory plan of a model
// folder or a bare config.json, as one JSON object (keys documented in docs/INSPECT.md) and as text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace flashnext {

struct InspectOptions {
  int64_t context = 0;   ///< tokens of the sequence the memory total is computed for; 0: max_position_embeddings
  int64_t tp = 1;        ///< tensor-parallel degree (>= 1)
  int64_t kv_bytes = 2;  ///< bytes per KV-cache / indexer-key element (fp16/bf16)
};

/// Inspects `path`: a model folder (config.json + safetensors, fully validated through WeightManifest::build) or a
/// config.json file (counts from the config alone). Throws Error naming the file and the problem on bad input, or
/// for context < 0 or tp < 1.
nlohmann::json inspect_model(const std::string& path, const InspectOptions& options = {});

/// The report of inspect_model as text for a terminal.
std::string format_inspect(const nlohmann::json& report);

}  // namespace flashnext
