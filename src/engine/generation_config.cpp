#include "engine/generation_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace flashnext {

using json = nlohmann::json;

SamplingParams GenerationConfig::default_sampling() const {
  SamplingParams p;
  if (temperature) p.temperature = *temperature;
  if (top_k) p.top_k = *top_k;
  if (top_p) p.top_p = *top_p;
  if (min_p) p.min_p = *min_p;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  if (max_new_tokens) p.max_tokens = *max_new_tokens;
  return p;
}

bool GenerationConfig::is_eos(int64_t id) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end();
}

GenerationConfig parse_generation_config(const json& doc, const std::string& source, const ModelConfig& config) {
  GenerationConfig g;
  g.source = source;
  auto add_eos = [&](int64_t id, const std::string& where) {
    if (id < 0 || id >= config.vocab_size)
      fail("{}: eos_token_id {} is outside the vocabulary [0, {})", where, id, config.vocab_size);
    if (!g.is_eos(id)) g.eos_token_ids.push_back(id);
  };
  for (int64_t id : config.eos_token_ids) add_eos(id, config.source);
  if (doc.is_null()) return g;
  if (!doc.is_object()) fail("{}: expected a JSON object, got {}", source, doc.type_name());

  auto find = [&](const char* key) -> const json* {
    auto it = doc.find(key);
    return it == doc.end() || it->is_null() ? nullptr : &*it;
  };
  if (auto* e = find("eos_token_id")) {
    if (e->is_number_integer()) {
      add_eos(e->get<int64_t>(), source);
    } else if (e->is_array()) {
      for (auto& v : *e) {
        if (!v.is_number_integer())
          fail("{}: eos_token_id must be an integer or a list of integers, got {}", source, e->dump());
        add_eos(v.get<int64_t>(), source);
      }
    } else {
      fail("{}: eos_token_id must be an integer or a list of integers, got {}", source, e->dump());
    }
  }
  auto number = [&](const char* key, std::optional<double>& out) {
    if (auto* v = find(key)) {
      if (!v->is_number()) fail("{}: field \"{}\" must be a number, got {}", source, key, v->dump());
      out = v->get<double>();
    }
  };
  auto integer = [&](const char* key, std::optional<int64_t>& out) {
    if (auto* v = find(key)) {
      if (!v->is_number_integer()) fail("{}: field \"{}\" must be an integer, got {}", source, key, v->dump());
      out = v->get<int64_t>();
    }
  };
  number("temperature", g.temperature);
  number("top_p", g.top_p);
  number("min_p", g.min_p);
  number("repetition_penalty", g.repetition_penalty);
  integer("top_k", g.top_k);
  integer("max_new_tokens", g.max_new_tokens);
  try {
    validate(g.default_sampling(), config.vocab_size);
  } catch (const Error& e) {
    fail("{}: invalid sampling default: {}", source, e.what());
  }
  return g;
}

GenerationConfig load_generation_config(const std::string& model_dir, const ModelConfig& config) {
  const auto path = std::filesystem::path(model_dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return parse_generation_config(json(), "", config);
  std::ifstream in(path);
  if (!in) fail("{}: cannot open file", path.string());
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  return parse_generation_config(doc, path.string(), config);
}

}  // namespace flashnext
