// `inspect` report: the tiny-a fixture (counts checked against its tensors) and the released config (figures from
// ARTIFACTS.md 1.2, 2.4, 2.5 and 5, and from the arithmetic of the state shapes).
#include "loader/inspect.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "loader/memory_plan.h"
#include "loader/safetensors.h"
#include "loader/st_writer.h"

using namespace flashnext;
using namespace flashnext::testing;
using ::testing::HasSubstr;
using json = nlohmann::json;

namespace {

const std::string kTinyADir = source_path("tests/data/fixtures/tiny-a/model");
const std::string kRelease = source_path("models/release/config.json");

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

}  // namespace

TEST(Inspect, TinyAFolder) {
  json r = inspect_model(kTinyADir);
  EXPECT_EQ(r["num_layers"], 8);
  EXPECT_EQ(r["layer_types"], json({"linear_attention", "linear_attention", "linear_attention", "qsa",
                                    "linear_attention", "linear_attention", "linear_attention", "qsa"}));
  EXPECT_EQ(r["qsa_layers"], json({3, 7}));
  EXPECT_EQ(r["ple_layers"], json({1, 4}));
  EXPECT_EQ(r["has_weights"], true);

  // Element counts straight from the checkpoint files.
  Checkpoint ck(kTinyADir);
  int64_t lm = 0, vision = 0, bf16_bytes = 0, i64_bytes = 0;
  for (auto& [name, t] : ck.tensors()) {
    (starts_with(name, "model.visual.") ? vision : lm) += t->numel();
    (t->dtype == DType::I64 ? i64_bytes : bf16_bytes) += int64_t(t->nbytes);
  }
  EXPECT_EQ(r["params"]["language_model"], lm);
  EXPECT_EQ(r["params"]["vision"], vision);
  EXPECT_EQ(r["params"]["mtp"], 0);
  EXPECT_EQ(r["params"]["total"], lm + vision);
  EXPECT_EQ(r["stored"]["params_match_config"], true);
  EXPECT_EQ(r["stored"]["bytes_by_dtype"], json({{"BF16", bf16_bytes}, {"I64", i64_bytes}}));
  EXPECT_EQ(r["quantization"]["quantized"], false);
  EXPECT_TRUE(r["quantization"]["config"].is_null());
  // Components from the fixture shapes: vocab 1024 x 64; 8 layers x 8 experts x 3 x 32 x 64.
  EXPECT_EQ(r["params"]["embedding"], 1024 * 64);
  EXPECT_EQ(r["params"]["lm_head"], 1024 * 64);
  EXPECT_EQ(r["params"]["routed_experts"], 8 * 8 * 3 * 32 * 64);
  // Layer 1: moduli 1009+1013+1019+1021 = 4062 rows, padded to 4096; layer 4: 1031+1033+1039+1049 = 4152 -> 4224.
  EXPECT_EQ(r["params"]["ple_table"], (4096 + 4224) * 16);
  EXPECT_EQ(r["params"]["ple_hash_buffers"], 2 * (3 + 4 + 4));
  // Two PLE layers: moduli are the 8 consecutive primes >= 1000 (ngram_vocab_size_base), 4 per layer.
  EXPECT_EQ(r["ple_head_moduli"], json({1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049}));
  EXPECT_EQ(r["ple_rows"], 4096 + 4224);
}

// The bare config of tiny-a gives the same counts as its folder; its vision count (computed from vision_config)
// equals the element count of the model.visual.* tensors.
TEST(Inspect, TinyABareConfigMatchesFolder) {
  json folder = inspect_model(kTinyADir);
  json bare = inspect_model(kTinyADir + "/config.json");
  EXPECT_EQ(bare["has_weights"], false);
  EXPECT_FALSE(bare.contains("stored"));
  EXPECT_EQ(bare["params"], folder["params"]);
  EXPECT_EQ(bare["vision_from_config"], true);
  // bf16 from the config's "dtype"; the I64 hash buffers at 8 bytes.
  int64_t total = 0;
  for (auto& [k, v] : bare["memory"]["weight_bytes_by_component"].items()) total += v.get<int64_t>();
  EXPECT_EQ(total, folder["stored"]["bytes_by_dtype"]["BF16"].get<int64_t>() +
                       folder["stored"]["bytes_by_dtype"]["I64"].get<int64_t>());
}

TEST(Inspect, ReleasedConfig) {
  json r = inspect_model(kRelease, InspectOptions{.context = 32768, .tp = 1});
  EXPECT_EQ(r["num_layers"], 48);
  EXPECT_EQ(r["ple_layers"], json({1}));
  EXPECT_EQ(r["qsa_layers"].size(), 12u);
  EXPECT_EQ(r["qsa_layers"][0], 3);
  EXPECT_EQ(r["qsa_layers"][11], 47);

  // ARTIFACTS.md 2.4.
  EXPECT_EQ(r["ple_rows"], 320001536);
  const std::vector<int64_t> moduli = {20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                                       20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171};
  EXPECT_EQ(r["ple_head_moduli"].get<std::vector<int64_t>>(), moduli);
  std::vector<int64_t> offsets(16, 0);
  std::partial_sum(moduli.begin(), moduli.end() - 1, offsets.begin() + 1);  // exclusive prefix sums
  EXPECT_EQ(r["ple_head_offsets"].get<std::vector<int64_t>>(), offsets);
  EXPECT_EQ(offsets[1], 20000003);
  EXPECT_EQ(offsets[2], 40000026);
  EXPECT_EQ(offsets[15], 300001275);
  EXPECT_EQ(r["ple_detail"][0]["rows_used"], 320001446);
  EXPECT_EQ(r["ple_multipliers"], json({23703573157769LL, 20109073645365LL, 8052911324071LL}));
  EXPECT_EQ(r["ple_head_dim"], 160);

  // Parameter counts (ARTIFACTS.md 5): routed experts 48 x 2,516,582,400; the rest per component.
  const json& p = r["params"];
  EXPECT_EQ(p["routed_experts"], 120795955200LL);
  EXPECT_EQ(p["embedding"], 635699200);
  EXPECT_EQ(p["lm_head"], 635699200);
  EXPECT_EQ(p["gated_deltanet"], 36LL * 57958624);
  EXPECT_EQ(p["qsa"], 12LL * 51446528);
  EXPECT_EQ(p["hyper_connection"], 48LL * 13209600 + 10240 + 2 * 320 * 10240);  // + the final mixer (2.2)
  EXPECT_EQ(p["router"].get<int64_t>() + p["shared_expert"].get<int64_t>(), 48LL * 6228480);
  // 2.4 shapes: key_proj [10240, 2560], value_proj [2560, 2560], three norms [10240], conv1d [10240, 1, 4]. (The
  // 32,849,920 of ARTIFACTS.md 5 is 10,240 higher; with this count the bf16 total below equals the release index.)
  EXPECT_EQ(p["ple_projections"], 10240LL * 2560 + 2560 * 2560 + 3 * 10240 + 10240 * 4);
  EXPECT_EQ(p["ple_table"], 51200245760LL);
  EXPECT_EQ(p["mtp"], 2607150848LL);
  EXPECT_EQ(p["ple_hash_buffers"], 3 + 16 + 16);
  // Vision: 897,862,392 B of the BF16 release minus the 280 B of the I64 hash buffers it includes, / 2 bytes.
  EXPECT_EQ(p["vision"], (897862392LL - 280) / 2);
  // Every tensor at bf16 (hash buffers I64): the index total_size of the BF16 release.
  int64_t total_bytes = 0;
  for (auto& [k, v] : r["memory"]["weight_bytes_by_component"].items()) total_bytes += v.get<int64_t>();
  EXPECT_EQ(total_bytes, 359999963128LL);

  // State: 12 QSA layers x 2 (K, V) x 2 KV heads x 256 x 2 B; indexer keys 12 x 128 x 2 B; GDN recurrent state
  // 36 x 48 x 128 x 128 x 4 B (fp32); GDN conv 36 x 10240 x 3 x 2 B; PLE conv 10240 x 9 x 2 B + 2 int64 ids.
  EXPECT_EQ(r["kv_bytes_per_token"], 24576);
  EXPECT_EQ(r["indexer_bytes_per_token"], 3072);
  EXPECT_EQ(r["gdn_state_bytes_per_sequence"], 113246208);
  EXPECT_EQ(r["gdn_conv_state_bytes_per_sequence"], 2211840);
  EXPECT_EQ(r["ple_state_bytes_per_sequence"], 184320 + 16);
  const json& m = r["memory"];
  EXPECT_EQ(m["context"], 32768);
  EXPECT_EQ(m["ple_table_bytes_host"], 2LL * 51200245760LL + 8 * 35);
  EXPECT_EQ(m["sequence_bytes_per_gpu"], (24576 + 3072) * 32768LL + 113246208 + 2211840 + 184336);
  EXPECT_EQ(m["total_bytes_per_gpu"],
            m["weight_bytes_per_gpu"].get<int64_t>() + m["sequence_bytes_per_gpu"].get<int64_t>());
  // TP 1: every loaded language-model weight except the PLE table (host) and MTP/vision (not loaded), at bf16.
  const json& wb = m["weight_bytes_by_component"];
  int64_t gpu = 0;
  for (const char* k : {"embedding", "lm_head", "hyper_connection", "gated_deltanet", "qsa", "router", "shared_expert",
                        "routed_experts", "ple_projections"}) {
    gpu += wb[k].get<int64_t>();
  }
  EXPECT_EQ(m["weight_bytes_per_gpu"], gpu);
}

TEST(Inspect, TensorParallelSplitsShardedWeightsAndHeads) {
  json one = inspect_model(kRelease, InspectOptions{.context = 1000, .tp = 1});
  json four = inspect_model(kRelease, InspectOptions{.context = 1000, .tp = 4});
  const json& wb = one["memory"]["weight_bytes_by_component"];
  const int64_t replicated =
      wb["hyper_connection"].get<int64_t>() + wb["router"].get<int64_t>() + wb["ple_projections"].get<int64_t>();
  const int64_t sharded = one["memory"]["weight_bytes_per_gpu"].get<int64_t>() - replicated;
  EXPECT_EQ(four["memory"]["weight_bytes_per_gpu"], replicated + (sharded + 3) / 4);
  // 2 KV heads over 4 GPUs: one (replicated) head each; 48 GDN value heads: 12 each.
  EXPECT_EQ(four["memory"]["kv_bytes_per_token_per_gpu"], 12 * 2 * 1 * 256 * 2);
  EXPECT_EQ(four["memory"]["gdn_state_bytes_per_sequence_per_gpu"], 36LL * 12 * 128 * 128 * 4);
  EXPECT_EQ(four["memory"]["indexer_bytes_per_token_per_gpu"], 3072);
  EXPECT_EQ(four["kv_bytes_per_token"], 24576);  // the top-level figures are for the whole model
}

// The per-rank plan of the sharding plan (loader/sharding.h) at the released geometry, TP 4: caches in float32 as the
// engine keeps them, from the config's dims; the ranks' shares add up to TP 1's.
TEST(Inspect, PerRankPlanAtTp4) {
  const json one = inspect_model(kRelease, InspectOptions{.tp = 1})["memory"]["tp_plan"];
  const json four = inspect_model(kRelease, InspectOptions{.tp = 4})["memory"]["tp_plan"];
  ASSERT_EQ(four["ranks"].size(), 4u);
  const int64_t qsa = 12, gdn = 36, D = 256, Di = 128, c = 4, nv = 48, dk = 128, dv = 128, nk = 16;
  int64_t table = 0, experts4 = 0;
  for (const json& k : four["ranks"]) {
    EXPECT_EQ(k["kv_bytes_per_token"], qsa * 2 * 1 * D * 4);              // one KV head per rank (replicated)
    EXPECT_EQ(k["indexer_bytes_per_token"], qsa * Di * 4 * (c + 1) / c);  // replicated, with its pooled keys
    const int64_t conv = 2 * (nk / 4) * dk + (nv / 4) * dv;
    EXPECT_EQ(k["state_bytes_per_sequence"], gdn * (nv / 4) * dk * dv * 4 + gdn * 3 * conv * 4 + 1 * 9 * 4 * 2560 * 4);
    table += k["ple_table_bytes_host"].get<int64_t>();
    experts4 += k["weight_bytes"].get<int64_t>() - k["weight_bytes_w4_experts"].get<int64_t>();
    for (const json& ctx : k["contexts"]) {
      EXPECT_EQ(ctx["total_bytes"].get<int64_t>(),
                k["weight_bytes"].get<int64_t>() + ctx["sequence_bytes"].get<int64_t>());
      EXPECT_FALSE(ctx["fits_v100_32gb"].get<bool>());  // FP16 weights: about 60 GiB per rank
    }
  }
  const json& k1 = one["ranks"][0];
  EXPECT_EQ(table, k1["ple_table_bytes_host"].get<int64_t>());
  // Routed experts: 2 - 0.5625 bytes saved per weight, split exactly four ways.
  EXPECT_EQ(experts4 / 4, (k1["weight_bytes"].get<int64_t>() - k1["weight_bytes_w4_experts"].get<int64_t>()) / 4);
  EXPECT_TRUE(four["ranks"][0]["contexts"][2]["fits_v100_32gb_w4_experts"].get<bool>());  // 262K with 4.5-bit experts
  EXPECT_EQ(four["ranks"][0]["contexts"][2]["context"], 262144);
  EXPECT_THAT(
      [] { inspect_model(kRelease, InspectOptions{.tp = 3}); },
      ::testing::ThrowsMessage<Error>(HasSubstr("--tp 3 does not fit the 16 GDN key heads (linear_num_key_heads")));
}

TEST(Inspect, DefaultContextIsMaxPositions) {
  json r = inspect_model(kRelease);
  EXPECT_EQ(r["memory"]["context"], 262144);
  EXPECT_EQ(r["memory"]["tp"], 1);
}

TEST(Inspect, TextReport) {
  const std::string text = format_inspect(inspect_model(kTinyADir, InspectOptions{.context = 100}));
  EXPECT_THAT(text, HasSubstr("qwen4_exp, Qwen4ExpForConditionalGeneration"));
  EXPECT_THAT(text, HasSubstr("    3  QSA\n"));
  EXPECT_THAT(text, HasSubstr("    1  GDN  + PLE\n"));
  EXPECT_THAT(text, HasSubstr("PLE on layer 4: 4,224 table rows (4,152 addressed) x 16"));
  EXPECT_THAT(text, HasSubstr("language-model elements match the config: yes"));
  EXPECT_THAT(text, HasSubstr("Memory plan (TP 1, context 100 tokens, weights from checkpoint)"));
}

TEST(Inspect, BadInput) {
  EXPECT_THAT([] { inspect_model("/nonexistent/model"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("/nonexistent/model: no such file or directory")));
  EXPECT_THAT([] { inspect_model(kRelease, InspectOptions{.tp = 0}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("--tp must be >= 1, got 0")));
  TempDir dir;
  json c = read_json(kRelease);
  c["text_config"]["hc_count"] = 1;
  write_json(dir.path / "config.json", c);
  EXPECT_THAT(
      [&] { inspect_model(dir.str()); },
      ::testing::ThrowsMessage<Error>(HasSubstr((dir.path / "config.json").string() + ": text_config: qwen4_exp "
                                                                                      "requires hc_count > 1, got 1")));
  c = read_json(kRelease);
  c["text_config"]["mamba_ssm_dtype"] = "float64x";
  write_json(dir.path / "config.json", c);
  EXPECT_THAT([&] { inspect_model((dir.path / "config.json").string()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("mamba_ssm_dtype: unknown dtype \"float64x\"")));
}
