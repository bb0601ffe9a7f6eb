// The real CLI path: runs the built `flashnext` binary (generate and chat) on the tiny-b model (models/tiny-b-random,
// named with --model: the bundled default is the trained models/tiny-fortunes, tests/cli/tiny_fortunes_test) and checks
// the reference: the prompt ids flashnext renders and tokenizes from the fixture's messages equal P.input_ids and
// greedy decoding reproduces P.greedy_ids (tests/data/fixtures/tiny-b). Bad input exits with status 1 and a clear
// message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli_run.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "fixture.h"

namespace flashnext {
namespace {

namespace fs = std::filesystem;
using testing::cli_scratch;
using testing::CliRun;
using testing::run_cli;
using testing::slurp;
using json = nlohmann::ordered_json;

// The ids after `label` ("output ids: 1 2 3") in the --show-ids output.
std::vector<TokenId> ids_after(const std::string& err, const std::string& label) {
  const size_t at = err.find(label);
  if (at == std::string::npos) return {};
  std::istringstream line(err.substr(at + label.size(), err.find('\n', at) - at - label.size()));
  std::vector<TokenId> ids;
  for (TokenId id; line >> id;) ids.push_back(id);
  return ids;
}

// Whether this machine has an NVIDIA GPU the driver can see (its device node exists).
bool gpu_present() {
  return fs::exists("/dev/nvidia0");
}

// Whether the flashnext under test was built with the CUDA backend (tests/CMakeLists.txt defines it with it).
constexpr bool kCudaBuild =
#ifdef FLASHNEXT_TEST_CUDA_BUILD
    true;
#else
    false;
#endif

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = new Tokenizer(Tokenizer::load(test::kModelDir)); }
  static void TearDownTestSuite() {
    delete tok_;
    fs::remove_all(cli_scratch());
  }
  static Tokenizer* tok_;
};
Tokenizer* Cli::tok_ = nullptr;

TEST_F(Cli, GenerateFromMessagesReproducesTheReference) {
  for (const auto& cp : test::kChatPrompts) {
    SCOPED_TRACE(cp.name);
    const fs::path file = cli_scratch() / (std::string(cp.name) + ".json");
    std::ofstream(file) << test::tokenizer_cases()["chat"][size_t(cp.chat_case)]["messages"].dump();
    const auto greedy = test::reference_ids(std::string(cp.name) + ".greedy_ids");
    CliRun r = run_cli({"generate", "--model", test::kModelDir, "--messages", file.string(), "--temperature", "0",
                        "--max-tokens", std::to_string(greedy.size()), "--show-ids"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(ids_after(r.err, "prompt ids: "), test::reference_ids(std::string(cp.name) + ".input_ids"));
    EXPECT_EQ(ids_after(r.err, "output ids: "), greedy);
    EXPECT_EQ(r.out, tok_->decode(greedy, /*skip_special_tokens=*/true));
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos);
    EXPECT_NE(r.err.find("finish: length"), std::string::npos);
  }
}

TEST_F(Cli, GeneratePromptUsesTheChatTemplateAndRawDoesNot) {
  // chat case 0 is one user message "What is 2+2?": --prompt with that text renders the chat0 prompt.
  const std::string question = test::tokenizer_cases()["chat"][0]["messages"][0]["content"];
  CliRun r = run_cli({"generate", "--model", test::kModelDir, "--prompt", question, "--temperature", "0",
                      "--max-tokens", "3", "--show-ids"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(ids_after(r.err, "prompt ids: "), test::reference_ids("chat0.input_ids"));
  auto greedy = test::reference_ids("chat0.greedy_ids");
  greedy.resize(3);
  EXPECT_EQ(ids_after(r.err, "output ids: "), greedy);

  const std::string code = test::tokenizer_cases()["encode"][test::kCodeEncodeCase]["text"];
  r = run_cli({"generate", "--model", test::kModelDir, "--prompt", code, "--raw", "--temperature", "0", "--max-tokens",
               "16", "--show-ids"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(ids_after(r.err, "prompt ids: "), test::reference_ids("code.input_ids"));
  EXPECT_EQ(ids_after(r.err, "output ids: "), test::reference_ids("code.greedy_ids"));
}

// --load-format dummy --hf-overrides: the greedy tokens of the dummy model the engine makes in process from the same
// folder, overrides and seed (0).
TEST_F(Cli, GenerateWithDummyWeights) {
  const std::string overrides = R"({"num_experts": 4, "num_experts_per_tok": 2})";
  CliRun r =
      run_cli({"generate", "--model", test::kModelDir, "--load-format", "dummy", "--hf-overrides", overrides,
               "--prompt", "Hello", "--raw", "--temperature", "0", "--max-tokens", "6", "--ignore-eos", "--show-ids"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flashnext: made dummy weights for"), std::string::npos) << r.err;
  LoadedModel m = LoadedModel::load(test::kModelDir, {}, false, WeightSource{true, json::parse(overrides), 0});
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 6;
  p.ignore_eos = true;
  Generator gen = generate(*m.model, m.tokenizer, m.generation, {m.raw_prompt("Hello"), p});
  EXPECT_EQ(ids_after(r.err, "output ids: "), gen.output_ids());
}

TEST_F(Cli, ChatAnswersEachLineThenExits) {
  // First turn = chat case 0's conversation, so its reply starts with chat0's greedy tokens.
  const std::string question = test::tokenizer_cases()["chat"][0]["messages"][0]["content"];
  CliRun r = run_cli({"chat", "--model", test::kModelDir, "--temperature", "0", "--max-tokens", "4"},
                     question + "\nAnd 3+3?\n/exit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  auto greedy = test::reference_ids("chat0.greedy_ids");
  greedy.resize(4);
  const std::string first = tok_->decode(greedy, true);
  EXPECT_EQ(r.out.substr(0, first.size()), first);
  size_t turns = 0;
  for (size_t at = 0; (at = r.err.find("tokens/s | decode", at)) != std::string::npos; ++at) ++turns;
  EXPECT_EQ(turns, 2u) << r.err;
}

TEST_F(Cli, BadInputFailsWithAClearMessage) {
  auto expect_error = [](const std::vector<std::string>& args, const std::string& text) {
    CliRun r = run_cli(args);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  };
  expect_error({"generate", "--model", test::kModelDir, "--prompt", ""}, "the prompt is empty");
  expect_error({"generate", "--model", test::kModelDir, "--max-tokens", "4"},
               "give exactly one of --prompt TEXT and --messages FILE.json");
  expect_error({"generate", "--model", test::kModelDir, "--messages", (cli_scratch() / "missing.json").string()},
               "cannot open");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--top-p", "0"}, "top_p must be in (0, 1]");
  expect_error({"generate", "--prompt", "hi", "--model", (cli_scratch() / "no-model").string()},
               "no-model: no such file or directory");
  // Checked before any weight is read (no "loaded" line): sampling options, --max-tokens (>= 1 as the server asks),
  // the messages file (the server's checks: roles, contents).
  const std::string wizard = (cli_scratch() / "wizard.json").string();
  std::ofstream(wizard) << R"([{"role": "wizard", "content": "hi"}])";
  for (const auto& [args, text] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--prompt", "hi", "--max-tokens", "0"}, "--max-tokens must be >= 1, got 0"},
           {{"--prompt", "hi", "--top-p", "1.5"}, "top_p must be in (0, 1], got 1.5"},
           {{"--prompt", "hi", "--temperature", "-1"}, "temperature must be a finite number >= 0"},
           {{"--messages", wizard}, "field \"messages[0].role\" must be one of system, developer, user"}}) {
    std::vector<std::string> full = {"generate", "--model", test::kModelDir};
    full.insert(full.end(), args.begin(), args.end());
    CliRun early = run_cli(full);
    EXPECT_EQ(early.status, 1) << early.err;
    EXPECT_NE(early.err.find(text), std::string::npos) << early.err;
    EXPECT_EQ(early.err.find("flashnext: loaded"), std::string::npos) << early.err;
  }
  std::string long_prompt;
  for (int i = 0; i < 9000; ++i) long_prompt += " a";  // > 8192 tokens (max_position_embeddings of tiny-b)
  expect_error({"generate", "--model", test::kModelDir, "--raw", "--prompt", long_prompt}, "max_position_embeddings");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--speculative", "mtp:9"},
               "--speculative mtp:9: K must be");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--speculative", "ngram:0"},
               "--speculative ngram:0: K must be");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--speculative", "eagle:2"},
               "unknown proposer 'eagle'");
  // tiny-b has no MTP layer: said before the trunk's weights load (no "loaded" line).
  CliRun r = run_cli({"generate", "--model", test::kModelDir, "--prompt", "hi", "--speculative", "mtp:2"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("--speculative mtp:2: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no mtp.* tensors"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("flashnext: loaded"), std::string::npos) << r.err;
  const std::string mtp_model = std::string(FLASHNEXT_SOURCE_DIR) + "/tests/data/fixtures/tiny-mtp/model";
  expect_error({"logits", "--model", mtp_model, "--ids", "1,2", "--out", (cli_scratch() / "x.npy").string(),
                "--speculative", "mtp:2"},
               "applies to --greedy N");
  // --hf-overrides: a JSON object of the config's fields, with --load-format dummy only (serve checks it before
  // loading too).
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--hf-overrides", "{\"num_experts\": 4}"},
               "--hf-overrides applies to --load-format dummy only");
  expect_error({"serve", "--model", test::kModelDir, "--port", "0", "--load-format", "dummy", "--hf-overrides", "4"},
               "--hf-overrides must be a JSON object of config fields, got '4'");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--load-format", "dummy", "--hf-overrides",
                "{\"num_expert\": 4}"},
               "'num_expert' is not a field of");
  expect_error({"generate", "--model", test::kModelDir, "--prompt", "hi", "--load-format", "dummy", "--hf-overrides",
                "{\"num_experts\": 4,}"},
               "--hf-overrides is not valid JSON");
  auto expect_parse_error = [](const std::vector<std::string>& args, const std::string& text) {
    CliRun r = run_cli(args);
    EXPECT_NE(r.status, 0) << r.err;  // CLI11's exit codes
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  };
  expect_parse_error({"serve", "--model", test::kModelDir, "--port", "0", "--max-num-seqs", "0"},
                     "--max-num-seqs: must be > 0, got 0");
  expect_parse_error({"generate", "--prompt", "hi", "--threads", "-2"}, "--threads: must be >= 0, got -2");
  expect_parse_error({"generate", "--prompt", "hi", "--load-format", "pt"}, "--load-format: pt not in {auto,dummy}");
  expect_error({"serve", "--model", test::kModelDir, "--port", "0", "--no-enable-prefix-caching",
                "--prefix-cache-snapshots", "8"},
               "--prefix-cache-snapshots needs prefix caching, which --no-enable-prefix-caching turned off");
  expect_parse_error({"serve", "--model", test::kModelDir, "--port", "0", "--enable-prefix-caching",
                      "--prefix-cache-snapshot-interval", "0"},
                     "--prefix-cache-snapshot-interval: Value 0 not in range 1 to 1048576");
  // The snapshots come out of the KV budget: 64 of 10,000 B do not fit in 600,000 B.
  expect_error({"serve", "--model", test::kModelDir, "--port", "0", "--enable-prefix-caching",
                "--prefix-cache-snapshots", "64", "--kv-cache-memory-bytes", "600000"},
               "--prefix-cache-snapshots");
  // serve --speculative: parsed as generate parses it; the missing MTP layer is said before the weights load.
  expect_error({"serve", "--model", test::kModelDir, "--port", "0", "--speculative", "ngram:9"},
               "--speculative ngram:9: K must be");
  expect_error({"serve", "--model", test::kModelDir, "--port", "0", "--speculative", "eagle:2"},
               "unknown proposer 'eagle'");
  CliRun s = run_cli({"serve", "--model", test::kModelDir, "--port", "0", "--speculative", "mtp:2"});
  EXPECT_EQ(s.status, 1) << s.err;
  EXPECT_NE(s.err.find("--speculative mtp:2: "), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("no mtp.* tensors"), std::string::npos) << s.err;
  EXPECT_EQ(s.err.find("listening on"), std::string::npos) << s.err;
}

// --version names the build (git describe of the source tree, build type, CUDA architectures), as vllm --version
// and llama.cpp's --version do.
TEST_F(Cli, VersionNamesTheBuild) {
  CliRun r = run_cli({"--version"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("flashnext ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" build, "), std::string::npos) << r.out;
}

// --speculative: generate reproduces the reference's greedy ids with ngram drafts and prints acceptance figures;
// logits --greedy gives the same ids with and without MTP / ngram drafts.
TEST_F(Cli, SpeculativeDecodingKeepsTheGreedyOutput) {
  const auto greedy = test::reference_ids("code.greedy_ids");
  const std::string code = test::tokenizer_cases()["encode"][test::kCodeEncodeCase]["text"];
  CliRun r = run_cli({"generate", "--model", test::kModelDir, "--prompt", code, "--raw", "--temperature", "0",
                      "--max-tokens", std::to_string(greedy.size()), "--show-ids", "--speculative", "ngram:4"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(ids_after(r.err, "output ids: "), greedy);
  EXPECT_NE(r.err.find("speculative ngram:4: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mean accepted length"), std::string::npos) << r.err;

  const std::string mtp_model = std::string(FLASHNEXT_SOURCE_DIR) + "/tests/data/fixtures/tiny-mtp/model";
  const std::string out = (cli_scratch() / "mtp.npy").string();
  auto greedy_line = [](const std::string& text) {
    const size_t at = text.find("greedy: ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  CliRun plain =
      run_cli({"logits", "--model", mtp_model, "--ids", "5,17,300,42,5,17,300", "--out", out, "--greedy", "24"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_FALSE(greedy_line(plain.out).empty()) << plain.out;
  for (const char* spec : {"mtp:3", "ngram:5"}) {
    SCOPED_TRACE(spec);
    CliRun sp = run_cli({"logits", "--model", mtp_model, "--ids", "5,17,300,42,5,17,300", "--out", out, "--greedy",
                         "24", "--speculative", spec});
    ASSERT_EQ(sp.status, 0) << sp.err;
    EXPECT_EQ(greedy_line(sp.out), greedy_line(plain.out));
    EXPECT_NE(sp.err.find(std::string("speculative ") + spec + ": "), std::string::npos) << sp.err;
  }
}

// --device cuda: what it must do depends on the build and on the machine. Without the CUDA backend, and in a CUDA
// build on a machine without a GPU, generate and serve fail with a clear error before anything listens; with a GPU,
// generate reproduces the reference's greedy ids (the CUDA backend's default fp16x2 precision is reference-exact on
// tiny-b, docs/BENCHMARKS.md) and serve refuses a KV budget that leaves nothing (so it exits instead of serving).
TEST_F(Cli, DeviceCudaFollowsTheBuildAndTheMachine) {
  const std::string question = test::tokenizer_cases()["chat"][0]["messages"][0]["content"];
  CliRun gen = run_cli({"generate", "--model", test::kModelDir, "--prompt", question, "--device", "cuda",
                        "--temperature", "0", "--max-tokens", "3", "--show-ids"});
  CliRun serve = run_cli(
      {"serve", "--model", test::kModelDir, "--device", "cuda", "--port", "0", "--gpu-memory-utilization", "0.0001"});
  SCOPED_TRACE(std::string("CUDA build: ") + (kCudaBuild ? "yes" : "no") + ", GPU: " + (gpu_present() ? "yes" : "no"));
  if (!kCudaBuild) {
    EXPECT_EQ(gen.status, 1) << gen.err;
    EXPECT_NE(gen.err.find("the CUDA backend is not available in this build"), std::string::npos) << gen.err;
    EXPECT_EQ(serve.status, 1) << serve.err;
    EXPECT_NE(serve.err.find("the CUDA backend is not available in this build"), std::string::npos) << serve.err;
  } else if (!gpu_present()) {
    EXPECT_EQ(gen.status, 1) << gen.err;
    EXPECT_NE(gen.err.find("no CUDA device found"), std::string::npos) << gen.err;
    EXPECT_EQ(serve.status, 1) << serve.err;
    EXPECT_NE(serve.err.find("no CUDA device found"), std::string::npos) << serve.err;
  } else {
    ASSERT_EQ(gen.status, 0) << gen.err;
    auto greedy = test::reference_ids("chat0.greedy_ids");
    greedy.resize(3);
    EXPECT_EQ(ids_after(gen.err, "output ids: "), greedy);
    EXPECT_EQ(serve.status, 1) << serve.err;
    EXPECT_NE(serve.err.find("nothing is left for the KV cache"), std::string::npos) << serve.err;
  }
  EXPECT_EQ((serve.out + serve.err).find("listening on"), std::string::npos) << serve.err;
}

}  // namespace
}  // namespace flashnext
