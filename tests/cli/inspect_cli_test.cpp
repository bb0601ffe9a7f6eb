// The `flashnext inspect` command as a user runs it: the built binary, its exit status and its messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "cli/cli_run.h"
#include "loader/st_writer.h"

using namespace flashnext::testing;
using ::testing::HasSubstr;
using json = nlohmann::json;

namespace {

const std::string kTinyA = source_path("tests/data/fixtures/tiny-a/model");
const std::string kRelease = source_path("models/release/config.json");

}  // namespace

TEST(InspectCli, TinyAJson) {
  CliRun r = run_flashnext("inspect " + quoted(kTinyA) + " --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["num_layers"], 8);
  EXPECT_EQ(j["qsa_layers"], json({3, 7}));
  EXPECT_EQ(j["ple_layers"], json({1, 4}));
  EXPECT_EQ(j["stored"]["params_match_config"], true);
}

TEST(InspectCli, ReleasedConfigText) {
  CliRun r = run_flashnext("inspect " + quoted(kRelease) + " --context 4096 --tp 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Memory plan (TP 2, context 4096 tokens"));
  EXPECT_THAT(r.out, HasSubstr("PLE on layer 1: 320,001,536 table rows"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("routed_experts +120,795,955,200"));
}

TEST(InspectCli, TruncatedShardFailsCleanly) {
  TempDir dir;
  fs::copy_file(kTinyA + "/config.json", dir.path / "config.json");
  write_file(dir.path / "model.safetensors", std::string("\x08\x00\x00\x00\x00", 5));
  CliRun r = run_flashnext("inspect " + quoted(dir.str()));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("flashnext: error: " + (dir.path / "model.safetensors").string() +
                               ": truncated safetensors file: 5 bytes"));
}

TEST(InspectCli, MisShapedTensorFailsCleanly) {
  TempDir dir;
  json cfg = read_json(kTinyA + "/config.json");
  write_json(dir.path / "config.json", cfg);
  auto tensors = read_checkpoint(kTinyA);
  tensors.at("lm_head.weight").shape = {512, 128};
  std::vector<RawTensor> v;
  for (auto& [k, t] : tensors) v.push_back(t);
  write_file(dir.path / "model.safetensors", safetensors_bytes(v));
  CliRun r = run_flashnext("inspect " + quoted(dir.str()) + " --json");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("tensor 'lm_head.weight' has shape [512, 128], expected [1024, 64]"));
}

TEST(InspectCli, BadConfigAndArguments) {
  TempDir dir;
  json cfg = read_json(kRelease);
  cfg["model_type"] = "mixtral";
  write_json(dir.path / "config.json", cfg);
  CliRun r = run_flashnext("inspect " + quoted((dir.path / "config.json").string()));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("unsupported architecture: model_type \"mixtral\""));

  r = run_flashnext("inspect /nonexistent/folder");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/folder: no such file or directory"));

  r = run_flashnext("inspect " + quoted(kRelease) + " --tp 0");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--tp must be >= 1, got 0"));

  r = run_flashnext("inspect " + quoted(kRelease) + " --context 0");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--context must be >= 1, got 0"));

  r = run_flashnext("inspect");  // missing MODEL argument: CLI11's usage error, non-zero
  EXPECT_NE(r.status, 0) << r.out;
}
