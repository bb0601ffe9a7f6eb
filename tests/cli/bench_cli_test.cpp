// `flashnext bench` on the CPU at a reduced geometry (the released widths, 4 layers, 16 experts, vocab 4096, a
// 100K-row PLE table): every JSON field is there and consistent, and bad flags fail before anything is allocated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_run.h"
#include "cli/load_progress.h"

using namespace flashnext::testing;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

namespace {

const std::string kSmall =
    "bench --device cpu --threads 2 --layers 4 --experts 16 --vocab 4096 --ple-rows 100000 --repeat 1 --chunk 8 "
    "--decode-context 6 --decode-skip 2 --batch-context 5 --batch-steps 3";

}  // namespace

TEST(BenchCli, CpuSmallGeometryJson) {
  CliRun r = run_flashnext(kSmall + " --prompts 6,11 --decode-tokens 5 --batches 1,3 --profile --json",
                           /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  for (const char* key : {"build", "device", "model", "build_times_s", "memory", "ceilings", "settings", "prefill",
                          "decode", "batch_decode", "v100_projection", "sanity"})
    EXPECT_TRUE(j.contains(key)) << key;
  const std::string commit = j["build"]["commit"];
  EXPECT_TRUE(commit == "unknown" || commit.size() == 40) << commit;
  EXPECT_THAT(j["device"]["backend"].get<std::string>(), HasSubstr("cpu"));
  // The geometry asked for: the released layer_types cut to 4 (3 GDN + 1 QSA), PLE on layer index 1 kept.
  const json& m = j["model"];
  EXPECT_EQ(m["source"], "random");
  EXPECT_EQ(m["layers"], 4);
  EXPECT_EQ(m["gdn_layers"], 3);
  EXPECT_EQ(m["qsa_layers"], 1);
  EXPECT_EQ(m["hidden_size"], 2560);
  EXPECT_EQ(m["experts"], 16);
  EXPECT_EQ(m["experts_per_token"], 10);
  EXPECT_EQ(m["vocab"], 4096);
  EXPECT_EQ(m["routed_experts"], "F32");  // the CPU oracle stores float32 experts
  // 16 primes >= 100000/16 summed and padded to 128 rows, 160 FP8 bytes each: just above 100,000 rows.
  const int64_t ple = m["ple_bytes"];
  EXPECT_GE(ple, 100000 * 160);
  EXPECT_LT(ple, 101000 * 160);
  EXPECT_GE(j["build_times_s"]["total"].get<double>(), j["build_times_s"]["weights"].get<double>());
  EXPECT_TRUE(j["ceilings"].is_null());  // no roofline for the CPU
  EXPECT_GT(j["memory"]["host_peak_rss_bytes"].get<int64_t>(), ple);

  ASSERT_EQ(j["prefill"].size(), 2u);
  for (const json& p : j["prefill"]) {
    const double P = p["prompt_tokens"], ttft = p["ttft_s"];
    EXPECT_TRUE(P == 6 || P == 11);
    EXPECT_NEAR(p["tokens_per_s"].get<double>(), P / ttft, 1e-9 * P / ttft);
    EXPECT_GT(p["flops"].get<double>(), 2.0 * 4e8 * P);  // at least the dense products, ~0.9 GFLOP per token
    EXPECT_TRUE(p["ratio_to_compute_ceiling"].is_null());
    EXPECT_EQ(p["runs_s"].size(), 1u);
  }
  // The profiled prefill has every phase of the forward.
  const json& prof = j["prefill"][1]["profile_ms"];
  for (const char* phase : {"ple", "embedding", "hc", "gdn_proj", "gdn_rule", "qsa_proj", "qsa_indexer",
                            "qsa_attention", "moe_router", "moe_routed", "moe_shared", "lm_head", "sampling"})
    EXPECT_TRUE(prof.contains(phase)) << phase;

  const json& d = j["decode"];
  EXPECT_EQ(d["context_tokens"], 6);
  EXPECT_EQ(d["timed_tokens"], "3-5");
  EXPECT_GT(d["tokens_per_s"].get<double>(), 0);
  // The host's share of a step: positive and, step by step, at most the step (so the medians too).
  EXPECT_GT(d["host_issue_ms_median"].get<double>(), 0);
  EXPECT_LE(d["host_issue_ms_median"].get<double>(), d["step_ms_median"].get<double>());
  EXPECT_NEAR(d["bytes_per_step"].get<double>(),
              d["weight_bytes_per_step"].get<double>() + d["cache_bytes_per_step"].get<double>(), 1.0);
  // One token reads 10 of the 16 experts per layer: 4 layers x 10 x 3 x 640 x 2560 float32 weights, plus dense ones.
  EXPECT_GT(d["weight_bytes_per_step"].get<double>(), 4.0 * 10 * 3 * 640 * 2560 * 4);
  // The PLE layer gathers 16 rows of 160 bytes for the token.
  EXPECT_DOUBLE_EQ(d["host_bytes_per_step"].get<double>(), 16.0 * 160);
  EXPECT_TRUE(d.contains("profile_ms_per_step"));
  // Launch counts are CUDA's (CUPTI): present and null on the CPU.
  for (const char* k : {"launches_per_step", "memcpys_per_step", "memsets_per_step"}) {
    EXPECT_TRUE(d.contains(k)) << k;
    EXPECT_TRUE(d[k].is_null()) << k;
  }

  ASSERT_EQ(j["batch_decode"].size(), 2u);
  for (const json& b : j["batch_decode"]) {
    const double B = b["batch"];
    EXPECT_EQ(b["steps_timed"], 1);  // 3 steps, 2 of them warm-up (the profiled one is a fourth)
    EXPECT_NEAR(b["tokens_per_s"].get<double>(), B / (b["step_ms_median"].get<double>() / 1e3), 1e-6 * B);
    // Distinct experts hit by B tokens of top-10 of 16 under uniform routing: 16 (1 - (6/16)^B).
    EXPECT_NEAR(b["experts_hit_per_layer_uniform"].get<double>(), 16 * (1 - std::pow(6.0 / 16, B)), 1e-9);
    // What the router picked (the bytes count it): each token's 10 distinct experts, at most all 16.
    const double hit = b["experts_hit_per_layer"].get<double>();
    EXPECT_GE(hit, 10.0);
    EXPECT_LE(hit, std::min(16.0, 10.0 * B));
  }
  EXPECT_TRUE(j["v100_projection"].is_null());  // needs a measured GPU ratio
}

// `bench --tp 2` on the CPU: the random-weight model made by two ranks (threads of one process, the CPU
// communicator), measured through the same phases.
TEST(BenchCli, CpuTensorParallelJson) {
  CliRun r = run_flashnext(kSmall + " --tp 2 --prompts 6 --decode-tokens 5 --batches 3 --json", /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["device"]["tp"], 2);
  EXPECT_EQ(j["device"]["tp_communicator"], "cpu threads");
  EXPECT_GT(j["decode"]["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["sanity"]["warmup_logit_rms"].get<double>(), 0);
  ASSERT_EQ(j["batch_decode"].size(), 1u);
}

// On the CPU the flags not given take the small CPU defaults (the GPU ones would run for hours), said on stderr and
// listed in the JSON's settings; a flag given keeps its value.
// bench --speculative mtp:2 (a random MTP layer) at forced acceptance 0.5 and 1: per rate the accepted drafts
// j = round(f K), 1 + j emitted per step, tokens/s = emitted / step time, a rollback only when drafts are rejected,
// the phases within the step, every rate once per rollback mode given (replay, then refeed); an acceptance outside
// [0, 1] or an unknown rollback mode is refused.
TEST(BenchCli, SpeculativeAtForcedAcceptance) {
  CliRun r = run_flashnext(kSmall +
                               " --prompts none --batches none --decode-tokens 0 --speculative mtp:2 "
                               "--acceptance 0.5,1 --spec-steps 5 --spec-rollback replay,refeed --json",
                           /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  const json& s = j["speculative"];
  EXPECT_EQ(s["method"], "mtp:2");
  EXPECT_EQ(s["context_tokens"], 6);
  ASSERT_EQ(s["runs"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const json& run = s["runs"][i];
    EXPECT_EQ(run["rollback"], i < 2 ? "replay" : "refeed");
    const int accepted = run["accepted_per_step"];
    EXPECT_EQ(accepted, int(i % 2) + 1);  // round(0.5 * 2), round(1 * 2)
    EXPECT_EQ(run["emitted_per_step"], accepted + 1);
    const double step = run["step_ms_median"];
    EXPECT_GT(step, 0);
    EXPECT_NEAR(run["tokens_per_s"].get<double>(), 1e3 * (accepted + 1) / step, 1e-6 * (accepted + 1) / step * 1e3);
    EXPECT_GT(run["verify_ms_median"].get<double>(), 0);
    EXPECT_GT(run["draft_ms_median"].get<double>(), 0);
    EXPECT_GT(run["mtp_catchup_ms_median"].get<double>(), 0);
    if (accepted == 2) {
      EXPECT_EQ(run["rollback_ms_median"].get<double>(), 0);
    } else {
      EXPECT_GT(run["rollback_ms_median"].get<double>(), 0);
    }
  }
  // --profile: one more, untimed step per rate whose verify is a whole forward (every layer family's phases) and
  // whose rollback, where drafts were rejected, replays only the GDN and PLE state ops.
  r = run_flashnext(kSmall +
                        " --prompts none --batches none --decode-tokens 0 --speculative mtp:2 --acceptance 0.5,1 "
                        "--spec-steps 5 --profile --json",
                    /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const json p = json::parse(r.out)["speculative"];
  ASSERT_EQ(p["runs"].size(), 2u);
  for (const json& run : p["runs"]) {
    const json& verify = run["verify_profile_ms"];
    for (const char* phase : {"embedding", "gdn_proj", "gdn_rule", "qsa_attention", "moe_routed", "hc", "lm_head"})
      EXPECT_GT(verify.value(phase, -1.0), 0) << phase;
    const json& rollback = run["rollback_profile_ms"];
    if (run["accepted_per_step"] == 2) {
      EXPECT_TRUE(rollback.is_null());
    } else {
      ASSERT_TRUE(rollback.is_object());
      EXPECT_GT(rollback.value("gdn_rule", -1.0), 0);
      EXPECT_GT(rollback.value("ple", -1.0), 0);
      EXPECT_FALSE(rollback.contains("moe_routed"));
      EXPECT_FALSE(rollback.contains("lm_head"));
    }
  }
  r = run_flashnext(kSmall + " --speculative mtp:2 --acceptance 1.5");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out + r.err, HasSubstr("--acceptance: every rate must be in [0, 1]"));
  r = run_flashnext(kSmall + " --speculative mtp:2 --spec-rollback undo");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out + r.err, HasSubstr("--spec-rollback: expected replay or refeed, got 'undo'"));
}

TEST(BenchCli, CpuDefaultsAreSmall) {
  CliRun r = run_flashnext(
      "bench --device cpu --threads 2 --layers 4 --experts 16 --vocab 4096 --ple-rows 100000 --prompts none "
      "--batches none --decode-tokens 0 --chunk 8 --json",
      /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("bench: --device cpu: small defaults --decode-context 128"));
  EXPECT_THAT(r.err, Not(HasSubstr("--chunk 256")));
  const json j = json::parse(r.out);
  EXPECT_EQ(j["settings"]["decode_context"], 128);
  EXPECT_EQ(j["settings"]["batch_context"], 64);
  EXPECT_EQ(j["settings"]["batch_steps"], 6);
  EXPECT_EQ(j["settings"]["repeat"], 1);
  EXPECT_EQ(j["settings"]["chunk"], 8);  // given
}

TEST(BenchCli, TableOutput) {
  CliRun r = run_flashnext(kSmall + " --batches none --prompts 4 --decode-tokens 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("prefill      4:"));
}

// --prefill-chunks: every prompt length once per chunk size, the size in each JSON entry and table row.
TEST(BenchCli, PrefillChunkSizes) {
  CliRun r = run_flashnext(kSmall + " --batches none --prompts 6 --decode-tokens 0 --prefill-chunks 2,6 --json",
                           /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["prefill"].size(), 2u);
  EXPECT_EQ(j["prefill"][0]["chunk"], 2);
  EXPECT_EQ(j["prefill"][1]["chunk"], 6);
  for (const json& p : j["prefill"]) EXPECT_EQ(p["prompt_tokens"], 6);
  r = run_flashnext(kSmall + " --batches none --prompts 6 --decode-tokens 0 --prefill-chunks 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("prefill      6 (chunks of 3):"));
  r = run_flashnext("bench --device cpu --prefill-chunks 8,0");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--prefill-chunks: every chunk size must be >= 1, got 0"));
}

TEST(BenchCli, BadFlagsFailBeforeAllocating) {
  CliRun r = run_flashnext("bench --device cpu --layers 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--layers must be >= 1, got 0"));
  r = run_flashnext("bench --device cpu --experts 4 --experts-per-token 8");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("8 experts per token"));
  r = run_flashnext("bench --device cpu --layers 64");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--layers 64"));
  // The released table needs 51 GB; --ple-rows 10^12 asks for 160 TB: refused before the weights are made.
  r = run_flashnext("bench --device cpu --layers 4 --ple-rows 1000000000000");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--ple-rows: the PLE table needs"));
  r = run_flashnext("bench --device cpu --prompts 16,x");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--prompts expects a comma-separated list"));
  r = run_flashnext("bench --device cpu --decode-tokens 10 --decode-skip 32");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--decode-tokens 10 must exceed --decode-skip 32"));
  r = run_flashnext("bench --device cpu --kernel-trace");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--kernel-trace traces CUDA kernels: it needs --device cuda"));
  r = run_flashnext("bench --device cpu --layers 4 --tp 3");  // 16 GDN key heads
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("--tp 3 does not fit"));
  r = run_flashnext("bench --model /nonexistent --layers 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("apply to random-weight models only"));
}

TEST(LoadProgressText, BarAndLine) {
  EXPECT_EQ(flashnext::cli::format_load_progress(12'300'000'000, 78'000'000'000, 2.0, false),
            "loading 12.3 / 78.0 GB (16%, 6.2 GB/s)");
  EXPECT_EQ(flashnext::cli::format_load_progress(39'000'000'000, 78'000'000'000, 10.0, true),
            "[###############               ] loading 39.0 / 78.0 GB (50%, 3.9 GB/s)");
}
