// Weight manifest tests on the fixture checkpoints (real layout: per-expert experts, PLE shards, hash buffers), on a
// fused-experts checkpoint rebuilt from tiny-a, and on broken checkpoints derived from tiny-a.
#include "loader/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/st_writer.h"
#include "loader/tensor_plan.h"
#include "ple/ngram_hash.h"

using namespace flashnext;
using namespace flashnext::testing;
using ::testing::HasSubstr;

namespace {

const std::string kTinyA = source_path("tests/data/fixtures/tiny-a/model");
const std::string kTinyB = source_path("models/tiny-b-random");
const std::string kLm = "model.language_model.";

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

// tiny-a's tensors with the text prefix replaced by "model." and the vision tower dropped, for a qwen4_exp_text
// config (the flat text_config of tiny-a).
struct TextOnly {
  nlohmann::json config;
  std::map<std::string, RawTensor> tensors;
};

TextOnly tiny_a_text_only() {
  TextOnly out;
  out.config = read_json(kTinyA + "/config.json")["text_config"];
  out.config["architectures"] = {"Qwen4ExpForCausalLM"};
  for (auto& [name, t] : read_checkpoint(kTinyA)) {
    if (starts_with(name, "model.visual.")) continue;
    std::string n = starts_with(name, kLm) ? "model." + name.substr(kLm.size()) : name;
    RawTensor r = t;
    r.name = n;
    out.tensors.emplace(n, std::move(r));
  }
  return out;
}

std::vector<RawTensor> values(const std::map<std::string, RawTensor>& m) {
  std::vector<RawTensor> v;
  for (auto& [k, t] : m) v.push_back(t);
  return v;
}

// Builds the manifest of `tensors` written with `config` into a temp folder; returns the error message ("" on
// success).
std::string build_error(const TempDir& dir, const nlohmann::json& config, const std::map<std::string, RawTensor>& t) {
  write_checkpoint(dir.path / "m", config, values(t));
  try {
    Checkpoint ck((dir.path / "m").string());
    WeightManifest::build(load_config((dir.path / "m").string()), ck);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Manifest, TinyAEveryTensorMapped) {
  ModelConfig cfg = load_config(kTinyA);
  Checkpoint ck(kTinyA);
  WeightManifest m = WeightManifest::build(cfg, ck);
  size_t lm = 0, visual = 0;
  for (auto& [name, v] : ck.tensors()) {
    if (starts_with(name, "model.visual.")) {
      ++visual;
      continue;
    }
    ++lm;
    const std::string logical = starts_with(name, kLm) ? name.substr(kLm.size()) : name;
    const ManifestEntry* e = m.find(logical);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->source, name);
    EXPECT_EQ(e->view.data, v->data) << name;  // zero-copy
    EXPECT_EQ(e->view.shape, v->shape) << name;
  }
  EXPECT_EQ(m.entries().size(), lm);
  EXPECT_EQ(m.extra().size(), visual);
  EXPECT_GT(visual, 0u);
  for (auto& e : m.extra()) EXPECT_EQ(e.component, Component::Vision);
  EXPECT_FALSE(m.quantized());

  // Shapes from the fixture's safetensors headers.
  EXPECT_EQ(m.get("layers.3.self_attn.q_proj.weight").shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(m.get("layers.0.mlp.experts.7.down_proj.weight").shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(m.get("layers.1.ple.ple_embedding.ngram_embedding.shard_3.weight").shape, (std::vector<int64_t>{1024, 16}));
  EXPECT_EQ(m.find("layers.3.linear_attn.in_proj_qkv.weight"), nullptr);  // layer 3 is QSA
  EXPECT_EQ(m.find("layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_THROW(m.get("layers.0.self_attn.q_proj.weight"), Error);

  EXPECT_EQ(m.find("layers.5.mlp.gate.weight")->component, Component::Router);
  EXPECT_EQ(m.find("layers.5.mlp.gate.weight")->layer, 5);
  EXPECT_EQ(m.find("hyper_connection_mixer.hc_norm.weight")->component, Component::HyperConnection);
  EXPECT_EQ(m.find("lm_head.weight")->component, Component::LmHead);

  // PLE on one-indexed layers 2 and 5 -> layers 1 and 4, four shards each (split_ngram_parts 4), in number order.
  for (int layer : {1, 4}) {
    auto shards = m.ple_table_shards(layer);
    ASSERT_EQ(shards.size(), 4u) << layer;
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(shards[k]->source,
                fmt::format("{}layers.{}.ple.ple_embedding.ngram_embedding.shard_{}.weight", kLm, layer, k));
    }
  }
  EXPECT_TRUE(m.ple_table_shards(0).empty());
}

// The stored hash buffers were written by the reference; build() checks them against ngram_hash_params(). Here the
// same comparison is made explicitly so that a silently skipped check cannot pass.
TEST(Manifest, TinyAHashBuffersMatchConfig) {
  ModelConfig cfg = load_config(kTinyA);
  Checkpoint ck(kTinyA);
  WeightManifest m = WeightManifest::build(cfg, ck);
  for (int i = 0; i < 2; ++i) {
    const int layer = int(cfg.ple_layer_ids[i]) - 1;
    NgramHashParams hp = ngram_hash_params(cfg, i);
    auto read = [&](const char* buf) {
      const TensorView& t = m.get(fmt::format("layers.{}.ple.ple_embedding.{}", layer, buf));
      std::vector<int64_t> v(size_t(t.numel()));
      std::memcpy(v.data(), t.data, t.nbytes);
      return v;
    };
    EXPECT_EQ(read("layer_multipliers"), hp.multipliers);
    EXPECT_EQ(read("ngram_heads_vocab_sizes"), hp.moduli);
    EXPECT_EQ(read("ngram_heads_offsets"), hp.offsets);
  }
}

TEST(Manifest, TinyBBuilds) {
  ModelConfig cfg = load_config(kTinyB);
  Checkpoint ck(kTinyB);
  WeightManifest m = WeightManifest::build(cfg, ck);
  EXPECT_EQ(m.get("embed_tokens.weight").shape, (std::vector<int64_t>{151936, 32}));
  EXPECT_NE(m.find("layers.3.mlp.experts.15.up_proj.weight"), nullptr);
  EXPECT_EQ(m.ple_table_shards(1).size(), 8u);
  int64_t rows = 0;
  for (auto* s : m.ple_table_shards(1)) rows += s->view.shape[0];
  EXPECT_EQ(rows, 321280);  // 8 shards x 40160 rows in the fixture
}

// tiny-a re-saved the way the BF16 release stores experts (fused 3-D `gate_up_proj` [E, 2I, H], rows 0..I-1 gate,
// and `down_proj` [E, H, I]) under the qwen4_exp_text prefix "model.": every per-expert view must hold exactly the
// bytes of the original per-expert tensor.
TEST(Manifest, FusedExpertsAreSlicedPerExpert) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  const int E = 8, layers = 8;
  std::map<std::string, RawTensor> fused = t.tensors;
  for (int L = 0; L < layers; ++L) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", L);
    RawTensor gu{p + "gate_up_proj", "BF16", {E, 64, 64}, {}}, dn{p + "down_proj", "BF16", {E, 64, 32}, {}};
    for (int e = 0; e < E; ++e) {
      for (const char* proj : {"gate_proj", "up_proj"}) {
        auto& src = fused.at(fmt::format("{}{}.{}.weight", p, e, proj));
        gu.bytes.insert(gu.bytes.end(), src.bytes.begin(), src.bytes.end());
      }
      auto& d = fused.at(fmt::format("{}{}.down_proj.weight", p, e));
      dn.bytes.insert(dn.bytes.end(), d.bytes.begin(), d.bytes.end());
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
        fused.erase(fmt::format("{}{}.{}.weight", p, e, proj));
    }
    fused.emplace(gu.name, gu);
    fused.emplace(dn.name, dn);
  }
  write_checkpoint(dir.path / "m", t.config, values(fused));
  ModelConfig cfg = load_config((dir.path / "m").string());
  EXPECT_EQ(cfg.model_type, "qwen4_exp_text");
  Checkpoint ck((dir.path / "m").string());
  WeightManifest m = WeightManifest::build(cfg, ck);
  for (int L = 0; L < layers; ++L) {
    for (int e = 0; e < E; ++e) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string logical = fmt::format("layers.{}.mlp.experts.{}.{}.weight", L, e, proj);
        const ManifestEntry* entry = m.find(logical);
        ASSERT_NE(entry, nullptr) << logical;
        const RawTensor& orig = t.tensors.at("model." + logical);
        EXPECT_EQ(entry->view.shape, orig.shape) << logical;
        ASSERT_EQ(entry->view.nbytes, orig.bytes.size()) << logical;
        EXPECT_EQ(std::memcmp(entry->view.data, orig.bytes.data(), orig.bytes.size()), 0) << logical;
        EXPECT_EQ(entry->source, fmt::format("model.layers.{}.mlp.experts.{}", L,
                                             std::string(proj) == "down_proj" ? "down_proj" : "gate_up_proj"));
      }
    }
  }
}

TEST(Manifest, FusedAndPerExpertCopiesConflict) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  t.tensors.emplace(
      "model.layers.0.mlp.experts.down_proj",
      RawTensor{"model.layers.0.mlp.experts.down_proj", "BF16", {8, 64, 32}, std::vector<uint8_t>(8 * 64 * 32 * 2)});
  EXPECT_THAT(build_error(dir, t.config, t.tensors), HasSubstr("both hold layers.0.mlp.experts.0.down_proj.weight"));
}

TEST(Manifest, FusedExpertsWrongShape) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  for (int e = 0; e < 8; ++e) t.tensors.erase(fmt::format("model.layers.2.mlp.experts.{}.down_proj.weight", e));
  t.tensors.emplace(
      "model.layers.2.mlp.experts.down_proj",
      RawTensor{"model.layers.2.mlp.experts.down_proj", "BF16", {8, 32, 64}, std::vector<uint8_t>(8 * 64 * 32 * 2)});
  std::string err = build_error(dir, t.config, t.tensors);
  EXPECT_THAT(err, HasSubstr("'model.layers.2.mlp.experts.down_proj' has shape [8, 32, 64], expected [8, 64, 32]"));
  EXPECT_THAT(err, HasSubstr("model.safetensors"));
}

TEST(Manifest, MissingTensorIsNamed) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  t.tensors.erase("model.layers.6.linear_attn.A_log");
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("1 tensor is missing from the checkpoint (config " + (dir.path / "m/config.json").string() +
                        "): 'model.layers.6.linear_attn.A_log' [6]"));
}

TEST(Manifest, MisShapedTensorIsNamed) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  auto& q = t.tensors.at("model.layers.7.self_attn.q_proj.weight");  // [256, 64]
  q.shape = {128, 128};
  std::string err = build_error(dir, t.config, t.tensors);
  EXPECT_THAT(err, HasSubstr("model.safetensors: tensor 'model.layers.7.self_attn.q_proj.weight' has shape [128, 128], "
                             "expected [256, 64]"));
}

TEST(Manifest, UnexpectedTensorIsNamed) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  // Layer 0 is a GDN layer: an attention projection there is not part of the model.
  t.tensors.emplace(
      "model.layers.0.self_attn.q_proj.weight",
      RawTensor{"model.layers.0.self_attn.q_proj.weight", "BF16", {256, 64}, std::vector<uint8_t>(256 * 64 * 2)});
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("model.safetensors: unexpected tensor 'model.layers.0.self_attn.q_proj.weight'"));
  t.tensors.erase("model.layers.0.self_attn.q_proj.weight");
  t.tensors.emplace("encoder.weight", RawTensor{"encoder.weight", "F32", {2}, std::vector<uint8_t>(8)});
  EXPECT_THAT(build_error(dir, t.config, t.tensors), HasSubstr("unexpected tensor 'encoder.weight'"));
}

TEST(Manifest, WrongDtypeWithoutScalesIsRejected) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  t.tensors.at("model.layers.0.mlp.shared_expert_gate.weight").dtype = "I16";  // unknown to safetensors reader
  EXPECT_THAT(build_error(dir, t.config, t.tensors), HasSubstr("dtype I16, which flashnext does not read"));
  t = tiny_a_text_only();
  auto& w = t.tensors.at("model.layers.0.mlp.experts.0.gate_proj.weight");  // BF16 [32, 64] -> U8 [32, 64] bytes
  w.dtype = "U8";
  w.shape = {32, 128};
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("'model.layers.0.mlp.experts.0.gate_proj.weight' is U8, but a weight without quantization "
                        "scales must be BF16, F16 or F32"));
}

// ModelOpt NVFP4 (ARTIFACTS.md 3.1): U8 weight [N, K/2], F8_E4M3 weight_scale [N, K/16], F32 scalars weight_scale_2
// and input_scale. FP8 block (3.3): F8_E4M3 weight with BF16 weight_scale_inv.
TEST(Manifest, QuantizedCompanionsAreKept) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  const std::string p = "model.layers.0.mlp.experts.3.gate_proj.";  // logical [32, 64]
  t.tensors.at(p + "weight") = RawTensor{p + "weight", "U8", {32, 32}, std::vector<uint8_t>(32 * 32)};
  t.tensors.emplace(p + "weight_scale", RawTensor{p + "weight_scale", "F8_E4M3", {32, 4}, std::vector<uint8_t>(128)});
  t.tensors.emplace(p + "weight_scale_2", RawTensor{p + "weight_scale_2", "F32", {}, std::vector<uint8_t>(4)});
  t.tensors.emplace(p + "input_scale", RawTensor{p + "input_scale", "F32", {}, std::vector<uint8_t>(4)});
  const std::string d = "model.layers.3.mlp.experts.1.down_proj.";  // logical [64, 32]
  t.tensors.at(d + "weight") = RawTensor{d + "weight", "F8_E4M3", {64, 32}, std::vector<uint8_t>(64 * 32)};
  t.tensors.emplace(d + "weight_scale_inv", RawTensor{d + "weight_scale_inv", "BF16", {1, 1}, std::vector<uint8_t>(2)});
  write_checkpoint(dir.path / "m", t.config, values(t.tensors));
  Checkpoint ck((dir.path / "m").string());
  WeightManifest m = WeightManifest::build(load_config((dir.path / "m").string()), ck);
  EXPECT_TRUE(m.quantized());
  EXPECT_EQ(m.get("layers.0.mlp.experts.3.gate_proj.weight").dtype, DType::U8);
  EXPECT_EQ(m.get("layers.0.mlp.experts.3.gate_proj.weight_scale").dtype, DType::F8_E4M3);
  EXPECT_EQ(m.find("layers.0.mlp.experts.3.gate_proj.weight_scale_2")->component, Component::RoutedExperts);
  EXPECT_EQ(m.find("layers.0.mlp.experts.3.gate_proj.input_scale")->layer, 0);
  EXPECT_EQ(m.get("layers.3.mlp.experts.1.down_proj.weight_scale_inv").dtype, DType::BF16);

  // A U8 weight whose shape is not [N, K/2] of the logical weight is rejected.
  t.tensors.at(p + "weight") = RawTensor{p + "weight", "U8", {32, 64}, std::vector<uint8_t>(32 * 64)};
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("quantized tensor 'model.layers.0.mlp.experts.3.gate_proj.weight' is U8 [32, 64], which does "
                        "not store the logical [32, 64] weight"));
}

// compressed-tensors pack-quantized (ARTIFACTS.md 3.2): I32 weight_packed [N, K/8] replaces `weight`.
TEST(Manifest, PackedWeightReplacesWeight) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  const std::string p = "model.layers.5.mlp.experts.2.up_proj.";  // logical [32, 64]
  t.tensors.erase(p + "weight");
  t.tensors.emplace(p + "weight_packed",
                    RawTensor{p + "weight_packed", "I32", {32, 8}, std::vector<uint8_t>(32 * 8 * 4)});
  t.tensors.emplace(p + "weight_scale", RawTensor{p + "weight_scale", "BF16", {32, 2}, std::vector<uint8_t>(128)});
  t.tensors.emplace(p + "weight_shape", RawTensor{p + "weight_shape", "I64", {2}, std::vector<uint8_t>(16)});
  EXPECT_EQ(build_error(dir, t.config, t.tensors), "");
  t.tensors.erase(p + "weight_scale");
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("has no 'model.layers.5.mlp.experts.2.up_proj.weight_scale'"));
}

// RadixArk / FP8 releases: F8_E4M3 table shards with one BF16 `ngram_embedding.weight_scale`.
TEST(Manifest, Fp8PleTableNeedsItsScale) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  for (int k = 0; k < 4; ++k) {
    auto& s = t.tensors.at(fmt::format("model.layers.1.ple.ple_embedding.ngram_embedding.shard_{}.weight", k));
    s.dtype = "F8_E4M3";
    s.bytes.resize(s.bytes.size() / 2);
  }
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("is an FP8 PLE table shard without its table scale "
                        "'model.layers.1.ple.ple_embedding.ngram_embedding.weight_scale'"));
  const std::string sc = "model.layers.1.ple.ple_embedding.ngram_embedding.weight_scale";
  t.tensors.emplace(sc, RawTensor{sc, "BF16", {1}, {0x51, 0x39}});
  EXPECT_EQ(build_error(dir, t.config, t.tensors), "");
}

TEST(Manifest, PleShardProblems) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  auto shard = [](int layer, int k) {
    return fmt::format("model.layers.{}.ple.ple_embedding.ngram_embedding.shard_{}.weight", layer, k);
  };
  TextOnly gap = t;
  gap.tensors.erase(shard(4, 2));
  EXPECT_THAT(build_error(dir, gap.config, gap.tensors), HasSubstr("PLE table shard 2 of layer 4 is missing"));
  TextOnly none = t;
  for (int k = 0; k < 4; ++k) none.tensors.erase(shard(1, k));
  EXPECT_THAT(build_error(dir, none.config, none.tensors), HasSubstr("the PLE n-gram table of layer 1 is missing"));
  TextOnly short_rows = t;
  auto& s3 = short_rows.tensors.at(shard(1, 3));
  s3.shape = {1000, 16};
  s3.bytes.resize(1000 * 16 * 2);
  EXPECT_THAT(build_error(dir, short_rows.config, short_rows.tensors),
              HasSubstr("hold 4072 rows, but the config " + (dir.path / "m/config.json").string() + " gives 4096"));
  // A shard on a layer without PLE is not part of the model.
  TextOnly stray = t;
  stray.tensors.emplace(shard(2, 0), RawTensor{shard(2, 0), "BF16", {4, 16}, std::vector<uint8_t>(128)});
  EXPECT_THAT(build_error(dir, stray.config, stray.tensors), HasSubstr("unexpected tensor '" + shard(2, 0) + "'"));
}

TEST(Manifest, HashBufferMismatchIsNamed) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  // Same checkpoint, another seed: the stored multipliers no longer match the config.
  t.config["seed"] = 4321;
  EXPECT_THAT(build_error(dir, t.config, t.tensors),
              HasSubstr("tensor 'model.layers.1.ple.ple_embedding.layer_multipliers' holds ["));
  t = tiny_a_text_only();
  t.tensors.at("model.layers.4.ple.ple_embedding.ngram_heads_offsets").bytes[8] ^= 1;
  EXPECT_THAT(build_error(dir, t.config, t.tensors), HasSubstr("ngram_heads_offsets' holds [0, 1030,"));
}

TEST(Manifest, TiedEmbeddingsAliasLmHead) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  t.config["tie_word_embeddings"] = true;
  t.tensors.erase("lm_head.weight");
  write_checkpoint(dir.path / "m", t.config, values(t.tensors));
  Checkpoint ck((dir.path / "m").string());
  WeightManifest m = WeightManifest::build(load_config((dir.path / "m").string()), ck);
  EXPECT_EQ(m.get("lm_head.weight").data, m.get("embed_tokens.weight").data);
  EXPECT_EQ(m.find("lm_head.weight")->source, "model.embed_tokens.weight");
  // Untied: lm_head.weight is required.
  t.config["tie_word_embeddings"] = false;
  EXPECT_THAT(build_error(dir, t.config, t.tensors), HasSubstr("'lm_head.weight' [1024, 64]"));
}

TEST(Manifest, MtpTensorsGoToExtra) {
  TempDir dir;
  TextOnly t = tiny_a_text_only();
  t.tensors.emplace("mtp.fc_hidden.weight",
                    RawTensor{"mtp.fc_hidden.weight", "BF16", {64, 64}, std::vector<uint8_t>(64 * 64 * 2)});
  write_checkpoint(dir.path / "m", t.config, values(t.tensors));
  Checkpoint ck((dir.path / "m").string());
  WeightManifest m = WeightManifest::build(load_config((dir.path / "m").string()), ck);
  ASSERT_EQ(m.extra().size(), 1u);
  EXPECT_EQ(m.extra()[0].component, Component::Mtp);
  EXPECT_EQ(m.find("mtp.fc_hidden.weight"), nullptr);
}
