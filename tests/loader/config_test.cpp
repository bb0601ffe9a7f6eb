// qwen4_exp config parsing: the released config (values from ARTIFACTS.md 1.2), the fixtures, the reference
// defaults, and the reference's validation rules (Qwen4ExpTextConfig.validate_architecture) as clear errors.
#include "loader/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/st_writer.h"

using namespace flashnext;
using namespace flashnext::testing;
using ::testing::HasSubstr;
using json = nlohmann::json;

namespace {

const std::string kRelease = source_path("models/release/config.json");
const std::string kTinyA = source_path("tests/data/fixtures/tiny-a/model/config.json");

std::string parse_error(const json& doc) {
  try {
    parse_config(doc, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json release() {
  return read_json(kRelease);
}

}  // namespace

TEST(Config, ReleasedConfig) {
  ModelConfig c = load_config(kRelease);
  EXPECT_EQ(c.model_type, "qwen4_exp");
  EXPECT_EQ(c.architecture, "Qwen4ExpForConditionalGeneration");
  EXPECT_TRUE(c.has_vision);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.num_layers_of(LayerKind::QSA), 12);
  EXPECT_EQ(c.num_layers_of(LayerKind::GatedDeltaNet), 36);
  for (int L = 0; L < 48; ++L) {
    EXPECT_EQ(c.layer_types[L], L % 4 == 3 ? LayerKind::QSA : LayerKind::GatedDeltaNet) << L;
  }
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.qsa_block_topk(), 512);
  EXPECT_EQ(c.ple_head_dim(), 160);
  EXPECT_EQ(c.ple_conv_state_len(), 9);
  EXPECT_EQ(c.ngram_heads(), 16);
  EXPECT_EQ(c.ple_layer_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.ple_index_of_layer(1), 0);
  EXPECT_EQ(c.ple_index_of_layer(2), -1);
  EXPECT_EQ(c.split_ngram_parts, 128);  // the release overrides the class default 512
  EXPECT_EQ(c.seed, 1234);              // absent from the release: class default
  EXPECT_TRUE(c.norm_topk_prob);        // absent from the release: class default
  EXPECT_EQ(c.ple_boundary_token(), 248044);
  EXPECT_EQ(c.output_gate_type, "sigmoid");
  EXPECT_EQ(c.mamba_ssm_dtype, "float32");
  EXPECT_EQ(c.rope.theta, 10000000.0);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.hc_width(), 10240);
  EXPECT_EQ(c.gdn_conv_dim(), 10240);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.source, kRelease);
}

TEST(Config, TinyAFixtureAndFolderPath) {
  ModelConfig c = load_config(source_path("tests/data/fixtures/tiny-a/model"));  // a folder: its config.json
  EXPECT_EQ(c.source, source_path("tests/data/fixtures/tiny-a/model") + "/config.json");
  EXPECT_EQ(c.num_hidden_layers, 8);
  // "qwen_sparse_attention" is a QSA layer.
  EXPECT_EQ(c.layer_types[3], LayerKind::QSA);
  EXPECT_EQ(c.layer_types[7], LayerKind::QSA);
  EXPECT_EQ(c.ple_layer_ids, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(c.output_gate_type, "silu");  // output_gate_type null -> hidden_act
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1001}));
  EXPECT_EQ(c.pad_token_id, 1002);
  EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(Config, FlatTextConfigAndSynthesisedLayerTypes) {
  json t = release()["text_config"];
  t.erase("layer_types");  // synthesised from full_attention_interval (4)
  t["architectures"] = {"Qwen4ExpForCausalLM"};
  t["ple_layer_ids"] = {3, 3, 1};  // sorted(set(...)) as the reference
  ModelConfig c = parse_config(t, "flat.json");
  EXPECT_EQ(c.model_type, "qwen4_exp_text");
  EXPECT_FALSE(c.has_vision);
  EXPECT_EQ(c.num_layers_of(LayerKind::QSA), 12);
  EXPECT_EQ(c.layer_types[3], LayerKind::QSA);
  EXPECT_EQ(c.ple_layer_ids, (std::vector<int64_t>{1, 3}));
  t["full_attention_interval"] = 2;
  EXPECT_EQ(parse_config(t, "flat.json").num_layers_of(LayerKind::QSA), 24);
  t.erase("ple_embed_dim");  // defaults to hidden_size
  EXPECT_EQ(parse_config(t, "flat.json").ple_embed_dim, 2560);
}

TEST(Config, UnsupportedArchitecture) {
  EXPECT_THAT(parse_error({{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}}),
              HasSubstr("cfg.json: unsupported architecture: model_type \"llama\" (LlamaForCausalLM)"));
  json d = release();
  d["architectures"] = {"Qwen3NextForCausalLM"};
  EXPECT_THAT(parse_error(d), HasSubstr("unsupported architecture \"Qwen3NextForCausalLM\""));
  d = release();
  d.erase("text_config");
  EXPECT_THAT(parse_error(d), HasSubstr("model_type qwen4_exp needs a \"text_config\" object"));
  EXPECT_THAT(parse_error(json::array()), HasSubstr("config is not a JSON object"));
}

TEST(Config, InvalidValues) {
  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"hc_count", 1, "requires hc_count > 1, got 1"},
      {"hidden_size", "wide", "field \"hidden_size\" must be an integer, got \"wide\""},
      {"vocab_size", 0, "field \"vocab_size\" must be > 0, got 0"},
      {"num_experts_per_tok", 513, "num_experts_per_tok must be in [1, num_experts], got 513 and 512"},
      {"moe_intermediate_size", 0, "moe_intermediate_size and shared_expert_intermediate_size must be > 0"},
      {"indexer_kv_heads", 2, "requires indexer_kv_heads = 1, got 2"},
      {"indexer_budget", 2047, "indexer_budget (2047) must be divisible by indexer_compress_ratio (4)"},
      {"indexer_head_dim", 32, "RoPE dimensions must fit the QSA index head: rotary_dim=64, indexer_head_dim=32"},
      {"indexer_n_heads", 0, "QSA config values must be positive: \"indexer_n_heads\" is 0"},
      {"ple_embed_dim", 2500, "ple_embed_dim divisible by it: ple_embed_dim 2500, ngram_size 3, heads_per_ngram 8"},
      {"ple_layer_ids", json{0}, "ple_layer_ids must contain one-indexed ids in [1, 48], got 0"},
      {"ple_layer_ids", json{49}, "ple_layer_ids must contain one-indexed ids in [1, 48], got 49"},
      {"ple_layer_ids", json{4},
       "PLE is only supported on linear_attention layers, but ple_layer_ids (one-indexed) "
       "puts it on the attention layer(s) 4"},
      {"eos_token_id", 248320, "eos_token_id 248320 is outside the vocabulary [0, 248320)"},
      {"output_gate_type", "tanh", "unsupported output gate activation \"tanh\""},
      {"hidden_act", "gelu", "field \"hidden_act\" is \"gelu\"; qwen4_exp uses \"silu\""},
      {"num_attention_heads", 23, "num_attention_heads (23) must be a multiple of num_key_value_heads (2)"},
      {"linear_num_value_heads", 40, "linear_num_value_heads (40) must be a multiple of linear_num_key_heads (16)"},
      {"rms_norm_eps", 0, "field \"rms_norm_eps\" must be > 0"},
      {"norm_topk_prob", "yes", "field \"norm_topk_prob\" must be true or false"},
      {"layer_types", json{"linear_attention"}, "\"layer_types\" has 1 entries but num_hidden_layers is 48"},
  };
  for (const Case& c : cases) {
    json d = release();
    d["text_config"][c.key] = c.value;
    EXPECT_THAT(parse_error(d), HasSubstr(c.message)) << c.key << " = " << c.value.dump();
    EXPECT_THAT(parse_error(d), HasSubstr("cfg.json: text_config")) << c.key;
  }
  json d = release();
  d["text_config"]["layer_types"][5] = "mamba";
  EXPECT_THAT(parse_error(d), HasSubstr("unsupported layer type \"mamba\""));
  d = release();
  d["text_config"].erase("indexer_budget");
  EXPECT_THAT(parse_error(d), HasSubstr("QSA config is missing required fields: indexer_budget"));
  d = release();
  d["text_config"].erase("eos_token_id");
  EXPECT_THAT(parse_error(d), HasSubstr("eos_token_id must be set when PLE layers are enabled"));
  d = release();
  d["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_THAT(parse_error(d), HasSubstr("rope_type \"yarn\" is not supported"));
}

TEST(Config, FileErrors) {
  TempDir dir;
  EXPECT_THAT([&] { load_config((dir.path / "missing.json").string()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("missing.json: cannot open config file")));
  write_file(dir.path / "config.json", "{\"model_type\": ");
  EXPECT_THAT([&] { load_config(dir.str()); },
              ::testing::ThrowsMessage<Error>(HasSubstr((dir.path / "config.json").string() + ": not valid JSON")));
}
