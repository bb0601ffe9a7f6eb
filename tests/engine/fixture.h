// Shared access to the tiny-b fixture for the engine tests: the reference tensors
// (tests/data/fixtures/tiny-b/reference.safetensors), the tokenizer cases, and the bundled model.
#pragma once

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loader/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::test {

inline const std::string kModelDir = FLASHNEXT_SOURCE_DIR "/models/tiny-b-random";
inline const std::string kFixtureDir = FLASHNEXT_SOURCE_DIR "/tests/data/fixtures/tiny-b";

/// An int64 tensor of reference.safetensors (e.g. "chat0.greedy_ids") as token ids.
inline std::vector<TokenId> reference_ids(const std::string& key) {
  static SafetensorsFile file(kFixtureDir + "/reference.safetensors");
  auto it = file.tensors().find(key);
  if (it == file.tensors().end()) throw std::runtime_error("reference.safetensors has no " + key);
  const TensorView& t = it->second;
  if (t.dtype != DType::I64) throw std::runtime_error(key + " is not int64");
  std::vector<TokenId> out(size_t(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    std::memcpy(&v, t.data + 8 * i, 8);
    out[i] = TokenId(v);
  }
  return out;
}

/// tokenizer_cases.json.
inline const nlohmann::ordered_json& tokenizer_cases() {
  static const nlohmann::ordered_json doc = [] {
    std::ifstream in(kFixtureDir + "/tokenizer_cases.json");
    return nlohmann::ordered_json::parse(in);
  }();
  return doc;
}

/// The fixture prompts: name -> chat case index (tests/data/fixtures/README.md: chat0 = chat case 0, chat2 = chat
/// case 4).
struct ChatPrompt {
  const char* name;
  int chat_case;
};
inline constexpr ChatPrompt kChatPrompts[] = {{"chat0", 0}, {"chat2", 4}};
/// The `code` prompt is encode case 3, tokenized without a template.
inline constexpr int kCodeEncodeCase = 3;

}  // namespace flashnext::test
