// `flashnext perplexity` end to end on the tiny-a fixture: one window against the perplexity computed from the
// reference's own logits (tests/data/fixtures/tiny-a/reference.safetensors, transformers float32), windows against
// separate runs of each window, chunked prefill against whole windows, and its errors.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_run.h"
#include "loader/safetensors.h"

namespace {

using namespace flashnext;
using flashnext::testing::CliRun;
using flashnext::testing::quoted;
using flashnext::testing::run_cli_line;

std::string src(const std::string& rel) {
  return std::string(FLASHNEXT_SOURCE_DIR) + "/" + rel;
}

std::vector<int64_t> i64(const SafetensorsFile& f, const std::string& name) {
  const TensorView& v = f.tensors().at(name);
  std::vector<int64_t> out(size_t(v.numel()));
  std::memcpy(out.data(), v.data, out.size() * 8);
  return out;
}

nlohmann::json run_json(const std::string& args) {
  const CliRun r = run_cli_line(args + " --json");
  EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << r.out << " (" << e.what() << ")";
    return nlohmann::json::object();
  }
}

const std::string kModel = quoted(src("tests/data/fixtures/tiny-a/model"));

// One window over the whole 300-token prompt: exp(mean(logsumexp_i - logit_i[id_{i+1}])) of the reference's logits.
// Bound: 1e-6 relative (measured 3.5e-9 on 2026-12-05: the CPU backend computes the reference's float32 logits).
TEST(PerplexityCli, OneWindowEqualsTheReferencePerplexity) {
  const SafetensorsFile ref(src("tests/data/fixtures/tiny-a/reference.safetensors"));
  const auto ids = i64(ref, "long.input_ids");
  const TensorView& logits = ref.tensors().at("long.logits");
  const TensorView& lse = ref.tensors().at("long.logsumexp");
  const int64_t T = int64_t(ids.size()), V = logits.shape[1];
  const float* lg = reinterpret_cast<const float*>(logits.data);
  const float* ls = reinterpret_cast<const float*>(lse.data);
  double nll = 0;
  for (int64_t i = 0; i + 1 < T; ++i) nll += double(ls[i]) - double(lg[i * V + ids[size_t(i + 1)]]);
  const double want_mean = nll / double(T - 1);

  const nlohmann::json j =
      run_json(fmt::format("perplexity --model {} --ids {} --ctx 512", kModel, fmt::join(ids, ",")));
  ASSERT_TRUE(j.contains("perplexity"));
  EXPECT_EQ(j["scored_tokens"].get<int64_t>(), T - 1);
  EXPECT_EQ(j["windows"].get<int64_t>(), 1);
  std::printf("[ ppl      ] tiny-a long: flashnext %.6f, reference %.6f\n", j["perplexity"].get<double>(),
              std::exp(want_mean));
  EXPECT_NEAR(j["mean_nll"].get<double>(), want_mean, 1e-6);
  EXPECT_NEAR(j["perplexity"].get<double>() / std::exp(want_mean), 1.0, 1e-6);
}

// --ctx 100 over 300 tokens: three windows, each on a fresh sequence, so the total NLL is the sum of three runs over
// the windows alone; --chunk 7 within a window gives the same figure within float32 chunking differences.
TEST(PerplexityCli, WindowsAreIndependentRunsAndChunkingKeepsTheFigure) {
  const SafetensorsFile ref(src("tests/data/fixtures/tiny-a/reference.safetensors"));
  const auto ids = i64(ref, "long.input_ids");
  ASSERT_EQ(ids.size(), 300u);
  const nlohmann::json all =
      run_json(fmt::format("perplexity --model {} --ids {} --ctx 100", kModel, fmt::join(ids, ",")));
  ASSERT_TRUE(all.contains("mean_nll"));
  EXPECT_EQ(all["windows"].get<int64_t>(), 3);
  EXPECT_EQ(all["scored_tokens"].get<int64_t>(), 297);
  double total = 0;
  for (size_t w0 = 0; w0 < ids.size(); w0 += 100) {
    const std::vector<int64_t> part(ids.begin() + long(w0), ids.begin() + long(w0 + 100));
    const nlohmann::json j = run_json(fmt::format("perplexity --model {} --ids {}", kModel, fmt::join(part, ",")));
    ASSERT_TRUE(j.contains("mean_nll"));
    total += j["mean_nll"].get<double>() * j["scored_tokens"].get<double>();
  }
  EXPECT_NEAR(all["mean_nll"].get<double>() * 297.0, total, 1e-9 * std::fabs(total));
  const nlohmann::json chunked =
      run_json(fmt::format("perplexity --model {} --ids {} --ctx 100 --chunk 7", kModel, fmt::join(ids, ",")));
  ASSERT_TRUE(chunked.contains("mean_nll"));
  EXPECT_NEAR(chunked["mean_nll"].get<double>(), all["mean_nll"].get<double>(), 1e-5);
  const nlohmann::json first =
      run_json(fmt::format("perplexity --model {} --ids {} --ctx 100 --max-tokens 100", kModel, fmt::join(ids, ",")));
  ASSERT_TRUE(first.contains("scored_tokens"));
  EXPECT_EQ(first["scored_tokens"].get<int64_t>(), 99);
  // A last window of one token scores nothing and is no window: 201 tokens in windows of 100 are two.
  const nlohmann::json tail =
      run_json(fmt::format("perplexity --model {} --ids {} --ctx 100 --max-tokens 201", kModel, fmt::join(ids, ",")));
  ASSERT_TRUE(tail.contains("scored_tokens"));
  EXPECT_EQ(tail["scored_tokens"].get<int64_t>(), 198);
  EXPECT_EQ(tail["windows"].get<int64_t>(), 2);
  // Whole windows (--chunk 0) and chunks longer than a window give the default's figure.
  for (const char* chunk : {"0", "1000"}) {
    const nlohmann::json j = run_json(
        fmt::format("perplexity --model {} --ids {} --ctx 100 --chunk {}", kModel, fmt::join(ids, ","), chunk));
    ASSERT_TRUE(j.contains("mean_nll"));
    EXPECT_NEAR(j["mean_nll"].get<double>(), all["mean_nll"].get<double>(), 1e-5) << "--chunk " << chunk;
  }
}

TEST(PerplexityCli, BadInputIsNamed) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"perplexity --model " + kModel, "exactly one of --file"},
      {"perplexity --model " + kModel + " --ids 1,2 --file /nonexistent", "exactly one of --file"},
      {"perplexity --model " + kModel + " --file /nonexistent/text.txt",
       "--file /nonexistent/text.txt: not a readable file"},
      {"perplexity --model " + kModel + " --ids 1,2,3 --ctx 1", "--ctx must be >= 2"},
      {"perplexity --model " + kModel + " --ids 1,2,x", "--ids: 'x' is not a token id"},
      {"perplexity --model " + kModel + " --ids 1,5000",
       "token id 5000 at index 1 is outside the vocabulary [0, 1024)"},
      {"perplexity --model " + kModel + " --ids 7", "needs at least 2 tokens, got 1"},
      {"perplexity --model " + kModel + " --ids 7,8,9 --max-tokens 1", "got 1 (after --max-tokens)"},
      {"perplexity --model " + kModel + " --ids 7,8,9 --max-tokens -2", "--max-tokens must be >= 0"},
      {"perplexity --model " + kModel + " --ids 1,2,", "--ids: '' is not a token id"},
      {"perplexity --model " + kModel + " --ctx 5000 --ids " +
           fmt::format("{}", fmt::join(std::vector<int>(4100, 1), ",")),
       "--ctx 5000: a window of 4100 tokens passes the model's max_position_embeddings = 4096"},
      {"perplexity --model " + kModel + " --file /tmp", "--file /tmp: not a readable file"},
      {"perplexity --model " + kModel + " --ids 1,2 --chunk -1", "--chunk must be >= 1"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli_line(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
  }
}

}  // namespace
