// `flashnext tokenize`, `flashnext detokenize` and `flashnext chat-template` end to end, against the transformers
// tokenizer's own output recorded in tests/data/fixtures/tiny-b/tokenizer_cases.json (encode cases: text -> ids ->
// decoded text; chat cases: messages -> rendered prompt -> ids) for the bundled model's Qwen3 tokenizer. Bad input
// exits with a clear message.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"

namespace {

namespace fs = std::filesystem;
using namespace flashnext::testing;
using json = nlohmann::ordered_json;

const std::string kModel = std::string(FLASHNEXT_SOURCE_DIR) + "/models/tiny-b-random";

const json& cases() {
  static const json doc = [] {
    std::ifstream in(std::string(FLASHNEXT_SOURCE_DIR) + "/tests/data/fixtures/tiny-b/tokenizer_cases.json");
    return json::parse(in);
  }();
  return doc;
}

std::string ids_line(const json& ids) {
  return fmt::format("{}\n", fmt::join(ids.get<std::vector<int>>(), " "));
}

TEST(TokenizeCli, EncodeCasesGiveTheReferenceIds) {
  ASSERT_GE(cases()["encode"].size(), 10u);
  int i = 0;
  for (const auto& c : cases()["encode"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(c["text"].dump());
    // Alternately from --text and from --file (the file keeps every byte, newlines included).
    CliRun r;
    if (i++ % 2 == 0) {
      r = run_cli({"tokenize", "--tokenizer", kModel, "--text", text});
    } else {
      const fs::path f = cli_scratch() / "text.txt";
      std::ofstream(f, std::ios::binary) << text;
      r = run_cli({"tokenize", "--tokenizer", kModel, "--file", f.string()});
    }
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, ids_line(c["ids"]));
  }
}

TEST(TokenizeCli, JsonOutputListsIdsAndTokens) {
  const auto& c = cases()["encode"][1];  // "The quick brown fox jumps over the lazy dog."
  const CliRun r = run_cli({"tokenize", "--tokenizer", kModel, "--text", c["text"], "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["ids"], c["ids"]);
  ASSERT_EQ(j["tokens"].size(), c["ids"].size());
  EXPECT_EQ(j["tokens"][1], "\u0120quick");  // byte-level BPE: the space before "quick" is U+0120
}

TEST(DetokenizeCli, ReferenceIdsGiveTheReferenceText) {
  for (const auto& c : cases()["encode"]) {
    SCOPED_TRACE(c["text"].dump());
    const std::string ids = fmt::format("{}", fmt::join(c["ids"].get<std::vector<int>>(), " "));
    const CliRun r = run_cli({"detokenize", "--tokenizer", kModel, "--ids", ids});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, c["decoded"].get<std::string>() + "\n");
  }
  // A JSON list of ids from a file, and --json output.
  const auto& c = cases()["encode"][0];
  const fs::path f = cli_scratch() / "ids.json";
  std::ofstream(f) << c["ids"].dump();
  const CliRun r = run_cli({"detokenize", "--tokenizer", kModel, "--file", f.string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["text"], c["decoded"]);
}

TEST(ChatTemplateCli, ChatCasesRenderTheReferencePrompt) {
  ASSERT_GE(cases()["chat"].size(), 4u);
  for (const auto& c : cases()["chat"]) {
    SCOPED_TRACE(c["messages"].dump());
    const fs::path f = cli_scratch() / "messages.json";
    std::ofstream(f) << c["messages"].dump();
    std::vector<std::string> args = {
        "chat-template",
        "--tokenizer",
        kModel,
        "--messages",
        f.string(),
        "--var",
        std::string("enable_thinking=") + (c["enable_thinking"].get<bool>() ? "true" : "false")};
    if (!c["add_generation_prompt"].get<bool>()) args.push_back("--no-generation-prompt");
    const CliRun r = run_cli(args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, c["rendered"].get<std::string>());
    // ... and that prompt tokenizes to the reference ids.
    const fs::path p = cli_scratch() / "rendered.txt";
    std::ofstream(p, std::ios::binary) << r.out;
    const CliRun t = run_cli({"tokenize", "--tokenizer", kModel, "--file", p.string()});
    ASSERT_EQ(t.status, 0) << t.err;
    EXPECT_EQ(t.out, ids_line(c["ids"]));
  }
}

TEST(TokenizeCli, BadInputFailsWithAMessage) {
  auto expect_error = [](const std::vector<std::string>& args, const std::string& text) {
    const CliRun r = run_cli(args);
    EXPECT_NE(r.status, 0) << fmt::format("{}", fmt::join(args, " "));
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  };
  expect_error({"tokenize", "--tokenizer", kModel}, "give --text or --file");
  expect_error({"tokenize", "--tokenizer", kModel, "--file", (cli_scratch() / "missing.txt").string()}, "cannot open");
  expect_error({"detokenize", "--tokenizer", kModel, "--ids", "1 999999"}, "ids: 999999 is not a token of");
  expect_error({"detokenize", "--tokenizer", kModel, "--ids", "1 x"}, "ids: `x` is not an integer");
  expect_error({"detokenize", "--tokenizer", kModel, "--ids", "[1, \"a\"]"}, "ids: expected integers");
  expect_error({"chat-template", "--tokenizer", kModel, "--messages", (cli_scratch() / "missing.json").string()},
               "chat-template: cannot open --messages file");
  const fs::path bad = cli_scratch() / "bad.json";
  std::ofstream(bad) << "[{\"role\": ";
  expect_error({"chat-template", "--tokenizer", kModel, "--messages", bad.string()}, "is not valid JSON");
  const fs::path good = cli_scratch() / "good.json";
  std::ofstream(good) << cases()["chat"][0]["messages"].dump();
  expect_error({"chat-template", "--tokenizer", kModel, "--messages", good.string(), "--var", "novalue"},
               "--var expects k=v, got 'novalue'");
}

}  // namespace
