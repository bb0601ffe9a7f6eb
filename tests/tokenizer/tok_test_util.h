// Shared helpers of the tokenizer tests: paths, the reference data written by tools/tokenizer_reference.py, and
// tokenizers loaded once per test binary.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"

namespace flashnext::test {

inline std::filesystem::path source_path(const std::string& rel) {
  return std::filesystem::path(FLASHNEXT_SOURCE_DIR) / rel;
}

inline nlohmann::json read_json(const std::string& rel) {
  std::ifstream in(source_path(rel));
  if (!in) throw std::runtime_error("cannot open " + rel);
  return nlohmann::json::parse(in);
}

/// tests/data/tokenizer/reference_cases.json (outputs of Hugging Face tokenizers).
inline const nlohmann::json& reference_cases() {
  static const nlohmann::json j = read_json("tests/data/tokenizer/reference_cases.json");
  return j;
}

/// A tokenizer loaded once: `rel` is a tokenizer.json or model folder relative to the source tree.
inline const Tokenizer& tokenizer_at(const std::string& rel) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[rel];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::load(source_path(rel)));
  return *slot;
}

/// The Qwen3 tokenizer bundled with the tiny-b model.
inline const Tokenizer& qwen3() {
  return tokenizer_at("models/tiny-b-random");
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace flashnext::test
