// generation_config.json handling: expected values come from the files in models/ and from the vLLM rules in
// engine/generation_config.h.
#include "engine/generation_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace flashnext {
namespace {

using json = nlohmann::json;

ModelConfig cfg(std::vector<int64_t> eos, int64_t vocab = 248320) {
  ModelConfig c;
  c.source = "config.json";
  c.vocab_size = vocab;
  c.eos_token_ids = std::move(eos);
  return c;
}

TEST(GenerationConfig, BundledTinyModel) {
  const std::string dir = FLASHNEXT_SOURCE_DIR "/models/tiny-b-random";
  auto g = load_generation_config(dir, load_config(dir));
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645}));  // <|im_end|> in both files
  EXPECT_FALSE(g.temperature.has_value());
  auto p = g.default_sampling();
  EXPECT_EQ(p.temperature, 1.0);
  EXPECT_EQ(p.top_k, 0);
}

TEST(GenerationConfig, EosIsTheUnionOfListAndConfig) {
  // The release: config eos 248044, generation_config [248046, 248044].
  auto g = parse_generation_config(json::parse(R"({"eos_token_id": [248046, 248044]})"), "gc.json", cfg({248044}));
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{248044, 248046}));
  EXPECT_TRUE(g.is_eos(248046));
  EXPECT_FALSE(g.is_eos(248045));
  g = parse_generation_config(json::parse(R"({"eos_token_id": 7})"), "gc.json", cfg({248044}));
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{248044, 7}));
  g = parse_generation_config(json(), "", cfg({5}));
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{5}));
}

TEST(GenerationConfig, SamplingDefaultsOnlyFromPresentKeys) {
  auto g = parse_generation_config(
      json::parse(R"({"temperature": 0.6, "top_k": 20, "top_p": 0.95, "do_sample": true})"), "gc.json", cfg({1}));
  auto p = g.default_sampling();
  EXPECT_EQ(p.temperature, 0.6);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.top_p, 0.95);
  EXPECT_EQ(p.min_p, 0.0);
  EXPECT_EQ(p.repetition_penalty, 1.0);
}

TEST(GenerationConfig, BadValuesNameTheFileAndField) {
  auto msg = [](const char* text, int64_t vocab = 248320) {
    try {
      parse_generation_config(json::parse(text), "gc.json", cfg({1}, vocab));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(R"({"eos_token_id": 300000})").find("gc.json: eos_token_id 300000"), std::string::npos);
  EXPECT_NE(msg(R"({"eos_token_id": "x"})").find("eos_token_id must be"), std::string::npos);
  EXPECT_NE(msg(R"({"eos_token_id": [1, "x"]})").find("eos_token_id must be"), std::string::npos);
  EXPECT_NE(msg(R"({"temperature": "hot"})").find("\"temperature\""), std::string::npos);
  EXPECT_NE(msg(R"({"top_p": 0})").find("gc.json: invalid sampling default"), std::string::npos);
  EXPECT_NE(msg(R"([1, 2])").find("gc.json: expected a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace flashnext
