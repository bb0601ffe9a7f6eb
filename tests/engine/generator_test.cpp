// Generation on the bundled tiny-b model against the reference: prompts rendered and tokenized by flashnext from
// the fixture's messages equal P.input_ids, and greedy generation reproduces P.greedy_ids
// (tests/data/fixtures/tiny-b/reference.safetensors, made by transformers). Bad prompts get clear errors.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/loaded_model.h"
#include "engine/model_dir.h"
#include "fixture.h"
#include "loader/config.h"

namespace flashnext {
namespace {

using json = nlohmann::ordered_json;

class Generation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { m_ = new LoadedModel(LoadedModel::load(test::kModelDir)); }
  static void TearDownTestSuite() { delete m_; }
  static SamplingParams greedy(int64_t max_tokens) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
  }
  static LoadedModel* m_;
};
LoadedModel* Generation::m_ = nullptr;

TEST_F(Generation, ChatPromptsEqualTheReferenceInputIds) {
  for (const auto& cp : test::kChatPrompts) {
    SCOPED_TRACE(cp.name);
    const json& c = test::tokenizer_cases()["chat"][size_t(cp.chat_case)];
    ASSERT_TRUE(c["enable_thinking"].get<bool>());
    const auto ids = m_->chat_prompt(c["messages"], json{{"enable_thinking", true}});
    EXPECT_EQ(ids, test::reference_ids(std::string(cp.name) + ".input_ids"));
    // The template's default is thinking on: no variable gives the same prompt.
    EXPECT_EQ(m_->chat_prompt(c["messages"]), ids);
  }
  const json& code = test::tokenizer_cases()["encode"][test::kCodeEncodeCase];
  EXPECT_EQ(m_->raw_prompt(code["text"]), test::reference_ids("code.input_ids"));
}

TEST_F(Generation, GreedyReproducesTheReferenceTokens) {
  for (const char* name : {"chat0", "chat2", "code"}) {
    SCOPED_TRACE(name);
    const auto expect = test::reference_ids(std::string(name) + ".greedy_ids");
    Generator gen = generate(*m_->model, m_->tokenizer, m_->generation,
                             {test::reference_ids(std::string(name) + ".input_ids"), greedy(int64_t(expect.size()))});
    EXPECT_EQ(gen.output_ids(), expect);
    EXPECT_EQ(gen.finish_reason(), FinishReason::Length);
    EXPECT_EQ(gen.text(), m_->tokenizer.decode(expect, /*skip_special_tokens=*/true));
    EXPECT_EQ(gen.stats().output_tokens, int64_t(expect.size()));
    EXPECT_EQ(gen.stats().decode_steps, int64_t(expect.size()) - 1);
  }
}

TEST_F(Generation, StreamedPiecesConcatenateToTheText) {
  const auto prompt = test::reference_ids("chat2.input_ids");
  std::string streamed;
  Generator gen = generate(*m_->model, m_->tokenizer, m_->generation, {prompt, greedy(16)},
                           [&](std::string_view piece) { streamed += piece; });
  EXPECT_EQ(streamed, gen.text());
}

TEST_F(Generation, StopTokenEndsTheOutputAfterIt) {
  // Stopping on the 4th reference greedy token: the output is the first 4 tokens, the text that of the first 3.
  const auto expect = test::reference_ids("chat0.greedy_ids");
  auto p = greedy(16);
  p.stop_token_ids = {expect[3]};
  Generator gen = generate(*m_->model, m_->tokenizer, m_->generation, {test::reference_ids("chat0.input_ids"), p});
  EXPECT_EQ(gen.output_ids(), std::vector<TokenId>(expect.begin(), expect.begin() + 4));
  EXPECT_EQ(gen.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(gen.text(), m_->tokenizer.decode(std::vector<TokenId>(expect.begin(), expect.begin() + 3), true));
}

TEST_F(Generation, SameSeedSameOutput) {
  const auto prompt = test::reference_ids("chat0.input_ids");
  SamplingParams p;
  p.seed = 2024;
  p.max_tokens = 8;
  p.top_k = 50;
  Generator a = generate(*m_->model, m_->tokenizer, m_->generation, {prompt, p});
  Generator b = generate(*m_->model, m_->tokenizer, m_->generation, {prompt, p});
  EXPECT_EQ(a.output_ids(), b.output_ids());
}

TEST_F(Generation, BadPromptsGetClearErrors) {
  auto message = [&](std::vector<TokenId> prompt) {
    try {
      Generator gen(*m_->model, m_->tokenizer, m_->generation, {std::move(prompt), greedy(4)});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("the prompt is empty"), std::string::npos);
  EXPECT_NE(message({1, 151936}).find("prompt token id 151936 at position 1 is outside the model's vocabulary"),
            std::string::npos);
  EXPECT_NE(message({-1}).find("prompt token id -1 at position 0"), std::string::npos);
  // max_position_embeddings of tiny-b is 8192: a prompt of 8192 tokens leaves no room.
  EXPECT_NE(message(std::vector<TokenId>(8192, 9707)).find("max_position_embeddings"), std::string::npos);
  SamplingParams bad = greedy(4);
  bad.top_p = 0;
  EXPECT_THROW(Generator(*m_->model, m_->tokenizer, m_->generation, {{9707}, bad}), Error);
}

TEST(ModelDir, BundledModelIsFoundFromTheTestBinary) {
  // The test binary sits in <build>/tests/; the bundled model is found by walking up from it.
  const std::string dir = resolve_model_dir("");
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(dir) / "config.json"));
  EXPECT_EQ(std::filesystem::canonical(dir),
            std::filesystem::canonical(std::filesystem::path(FLASHNEXT_SOURCE_DIR) / kBundledModel));
  EXPECT_EQ(resolve_model_dir(dir), dir);
}

TEST(ModelDir, AGivenFolderMustHoldAConfig) {
  auto message = [](const std::string& path) {
    try {
      resolve_model_dir(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string missing = "/nonexistent/flashnext-model";
  EXPECT_NE(message(missing).find("--model " + missing + ": no such file or directory"), std::string::npos)
      << message(missing);
  const std::filesystem::path empty = std::filesystem::path(::testing::TempDir()) / "flashnext-model-dir-test";
  std::filesystem::create_directories(empty);
  EXPECT_NE(message(empty.string()).find("has no config.json"), std::string::npos) << message(empty.string());
  const std::filesystem::path file = empty / "weights.bin";
  std::ofstream(file) << "x";
  EXPECT_NE(message(file.string()).find("not a folder"), std::string::npos) << message(file.string());
  std::filesystem::remove_all(empty);
}

// --load-format dummy: the folder's tokenizer and config (with --hf-overrides merged into it) and the weights of
// Model::random with the given seed: the logits of a prompt equal those of that model made directly, bit for bit
// (both on the CPU backend), and another seed's differ; overrides change the geometry; misuse is an Error.
TEST(DummyWeights, AreModelRandomOfTheConfigWithItsOverrides) {
  const nlohmann::json overrides = {{"num_experts", 4}, {"num_experts_per_tok", 2}};
  LoadedModel m = LoadedModel::load(test::kModelDir, {}, false, WeightSource{true, overrides, 7});
  const ModelConfig want = config_with_overrides(test::kModelDir, overrides);
  EXPECT_EQ(m.model->config().num_experts, 4);
  EXPECT_EQ(m.model->config().num_experts_per_tok, 2);
  EXPECT_NE(load_config(test::kModelDir).num_experts, 4);  // the override changed something
  const std::vector<int32_t> prompt = m.raw_prompt("Hello there");
  ASSERT_FALSE(prompt.empty());
  const auto logits = [&](Model& model) {
    SequenceState seq = model.new_sequence();
    return model.forward(seq, prompt, LogitsMode::Last);
  };
  std::unique_ptr<Model> direct = Model::random(want, {}, 7);
  EXPECT_EQ(logits(*m.model), logits(*direct));
  std::unique_ptr<Model> other_seed = Model::random(want, {}, 8);
  EXPECT_NE(logits(*m.model), logits(*other_seed));
  LoadedModel plain = LoadedModel::load(test::kModelDir, {}, false, WeightSource{true, nullptr, 7});
  EXPECT_EQ(plain.model->config().num_experts, load_config(test::kModelDir).num_experts);

  auto message = [](const WeightSource& w) {
    try {
      LoadedModel::load(test::kModelDir, {}, false, w);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(WeightSource{false, overrides, 0}).find("--hf-overrides applies to --load-format dummy only"),
            std::string::npos);
  const std::string typo = message(WeightSource{true, {{"num_expertz", 4}}, 0});
  EXPECT_NE(typo.find("'num_expertz' is not a field of"), std::string::npos) << typo;
  EXPECT_NE(message(WeightSource{true, nlohmann::json::array({1}), 0}).find("must be a JSON object"),
            std::string::npos);
  const std::string bad = message(WeightSource{true, {{"num_experts_per_tok", 64}}, 0});
  EXPECT_NE(bad.find("num_experts_per_tok"), std::string::npos) << bad;  // the config's own check, naming the field
  // The text config's fields under "text_config" (vLLM's form for a multimodal config) are the same overrides.
  const nlohmann::json nested = {{"text_config", overrides}};
  EXPECT_EQ(config_with_overrides(test::kModelDir, nested).num_experts, 4);
  // A folder without a tokenizer fails before any weight is made.
  const std::filesystem::path bare = std::filesystem::path(::testing::TempDir()) / "flashnext-dummy-no-tokenizer";
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(std::filesystem::path(test::kModelDir) / "config.json", bare / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  try {
    LoadedModel::load(bare.string(), {}, false, WeightSource{true, nullptr, 0});
    ADD_FAILURE() << "a folder without tokenizer.json loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(bare);
}

}  // namespace
}  // namespace flashnext
