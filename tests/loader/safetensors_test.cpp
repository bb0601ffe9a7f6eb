// safetensors reader: valid single files and sharded folders, and every kind of malformed input getting an Error that
// names the file and the problem (never a crash; these tests also run under ASan/UBSan).
#include "loader/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/st_writer.h"

using namespace flashnext;
using namespace flashnext::testing;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

std::string open_error(const fs::path& p) {
  try {
    SafetensorsFile f(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string checkpoint_error(const fs::path& p) {
  try {
    Checkpoint c(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A file whose header is `header` verbatim followed by `data_bytes` zero bytes.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
  std::string out(8, '\0');
  const uint64_t n = header_len_override ? header_len_override : header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\0');
  write_file(p, out);
}

std::vector<uint8_t> bytes_of(std::initializer_list<uint8_t> b) {
  return b;
}

}  // namespace

TEST(Safetensors, ReadsEveryDtypeZeroCopy) {
  TempDir dir;
  std::vector<RawTensor> ts = {
      {"bf16", "BF16", {2}, bytes_of({0x80, 0x3f, 0x00, 0xc0})},  // 1.0, -2.0
      {"f16", "F16", {1}, bytes_of({0x00, 0x3c})},                // 1.0
      {"f32", "F32", {1}, bytes_of({0x00, 0x00, 0x80, 0x3f})},    // 1.0
      {"e4m3", "F8_E4M3", {1}, bytes_of({0x38})},                 // 1.0
      {"e5m2", "F8_E5M2", {1}, bytes_of({0x3c})},                 // 1.0
      {"u8", "U8", {1}, bytes_of({200})},
      {"i8", "I8", {1}, bytes_of({0xff})},
      {"i32", "I32", {1}, bytes_of({0xfe, 0xff, 0xff, 0xff})},
      {"i64", "I64", {}, bytes_of({7, 0, 0, 0, 0, 0, 0, 0})},  // a scalar: shape []
      {"empty", "F32", {0, 3}, {}},
  };
  write_file(dir.path / "a.safetensors", safetensors_bytes(ts));
  SafetensorsFile f((dir.path / "a.safetensors").string());
  ASSERT_EQ(f.tensors().size(), ts.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  float out[2];
  auto conv = [&](const char* name) {
    const TensorView& t = f.tensors().at(name);
    convert_to_float(t.dtype, t.data, out, size_t(t.numel()));
    return out[0];
  };
  EXPECT_EQ(conv("bf16"), 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(conv("f16"), 1.0f);
  EXPECT_EQ(conv("f32"), 1.0f);
  EXPECT_EQ(conv("e4m3"), 1.0f);
  EXPECT_EQ(conv("e5m2"), 1.0f);
  EXPECT_EQ(conv("u8"), 200.0f);
  EXPECT_EQ(conv("i8"), -1.0f);
  EXPECT_EQ(conv("i32"), -2.0f);
  EXPECT_EQ(conv("i64"), 7.0f);
  const TensorView& s = f.tensors().at("i64");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(f.tensors().at("empty").nbytes, 0u);
  EXPECT_EQ(f.tensors().at("empty").shape_str(), "[0, 3]");
  // Zero-copy: the view points into the mapping, right after the header.
  const uint8_t* first = f.tensors().at("bf16").data;
  EXPECT_EQ(f.tensors().at("f16").data, first + 4);
}

TEST(Safetensors, TruncatedFile) {
  TempDir dir;
  write_file(dir.path / "t.safetensors", std::string("\x10\x00\x00", 3));
  EXPECT_THAT(open_error(dir.path / "t.safetensors"), AllOf(HasSubstr((dir.path / "t.safetensors").string()),
                                                            HasSubstr("truncated safetensors file: 3 bytes")));
  // A real file cut in the middle of its data block: the last tensor's offsets run past the end.
  std::string full =
      safetensors_bytes({{"a", "F32", {4}, std::vector<uint8_t>(16)}, {"b", "F32", {4}, std::vector<uint8_t>(16)}});
  write_file(dir.path / "cut.safetensors", full.substr(0, full.size() - 5));
  EXPECT_THAT(open_error(dir.path / "cut.safetensors"),
              HasSubstr("tensor 'b': data_offsets [16, 32] out of range (data block is 27 bytes)"));
}

TEST(Safetensors, HeaderLengthPastEnd) {
  TempDir dir;
  write_raw(dir.path / "h.safetensors", "{}", 0, 1000);
  EXPECT_THAT(open_error(dir.path / "h.safetensors"),
              HasSubstr("h.safetensors: header length 1000 runs past the end of the file (10 bytes)"));
  write_raw(dir.path / "huge.safetensors", "{}", 0, ~uint64_t(0));  // must not overflow into a small number
  EXPECT_THAT(open_error(dir.path / "huge.safetensors"), HasSubstr("runs past the end of the file"));
}

TEST(Safetensors, HeaderNotJson) {
  TempDir dir;
  write_raw(dir.path / "j.safetensors", "{\"a\": [1, 2", 0);
  EXPECT_THAT(open_error(dir.path / "j.safetensors"), HasSubstr("j.safetensors: header is not valid JSON"));
  write_raw(dir.path / "arr.safetensors", "[1, 2]", 0);
  EXPECT_THAT(open_error(dir.path / "arr.safetensors"), HasSubstr("header is not a JSON object"));
  write_raw(dir.path / "fields.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  EXPECT_THAT(open_error(dir.path / "fields.safetensors"), HasSubstr("tensor 'w' needs dtype, shape and data_offsets"));
  write_raw(dir.path / "shape.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(open_error(dir.path / "shape.safetensors"), HasSubstr("tensor 'w': bad shape [-1]"));
  write_raw(dir.path / "neg.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4);
  EXPECT_THAT(open_error(dir.path / "neg.safetensors"), HasSubstr("data_offsets must be two non-negative integers"));
}

TEST(Safetensors, OffsetsOutOfRange) {
  TempDir dir;
  write_raw(dir.path / "o.safetensors", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8);
  EXPECT_THAT(open_error(dir.path / "o.safetensors"),
              HasSubstr("o.safetensors: tensor 'w': data_offsets [4, 12] out of range (data block is 8 bytes)"));
  write_raw(dir.path / "rev.safetensors", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8);
  EXPECT_THAT(open_error(dir.path / "rev.safetensors"), HasSubstr("data_offsets [8, 4] out of range"));
}

TEST(Safetensors, OverlappingTensors) {
  TempDir dir;
  write_raw(dir.path / "ov.safetensors",
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            12);
  EXPECT_THAT(open_error(dir.path / "ov.safetensors"),
              HasSubstr("ov.safetensors: tensors 'a' and 'b' overlap (bytes [0, 8) and [4, 12))"));
  // A long tensor that contains a later one, with an empty tensor sorted between them.
  write_raw(dir.path / "nest.safetensors",
            R"({"big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                "inner": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
            16);
  EXPECT_THAT(open_error(dir.path / "nest.safetensors"), HasSubstr("tensors 'big' and 'inner' overlap"));
  // Adjacent and empty tensors are fine.
  write_raw(dir.path / "ok.safetensors",
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            8);
  EXPECT_EQ(open_error(dir.path / "ok.safetensors"), "");
}

TEST(Safetensors, UnknownDtype) {
  TempDir dir;
  write_raw(dir.path / "d.safetensors", R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_THAT(
      open_error(dir.path / "d.safetensors"),
      HasSubstr("d.safetensors: tensor 'w' has dtype F64, which flashnext does not read (expected one of BF16"));
  write_raw(dir.path / "n.safetensors", R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_THAT(open_error(dir.path / "n.safetensors"), HasSubstr("tensor 'w': dtype is not a string"));
}

TEST(Safetensors, ByteSizeDoesNotMatchShape) {
  TempDir dir;
  write_raw(dir.path / "b.safetensors", R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})", 10);
  EXPECT_THAT(open_error(dir.path / "b.safetensors"),
              HasSubstr("b.safetensors: tensor 'w': 10 bytes stored but shape [2,3] of BF16 needs 12"));
  // A shape whose byte size overflows 64 bits must not wrap around to the stored size.
  write_raw(dir.path / "ovf.safetensors",
            R"({"w": {"dtype": "I64", "shape": [2305843009213693952, 2], "data_offsets": [0, 0]}})", 0);
  EXPECT_NE(open_error(dir.path / "ovf.safetensors"), "");
}

TEST(Safetensors, MissingFile) {
  TempDir dir;
  EXPECT_THAT(open_error(dir.path / "nope.safetensors"), HasSubstr("nope.safetensors: cannot open safetensors file"));
}

TEST(Checkpoint, ShardedFixture) {
  const std::string dir = source_path("tests/data/fixtures/tiny-a/model");
  Checkpoint c(dir);
  const auto index = read_json(dir + "/model.safetensors.index.json");
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.tensors().size(), index["weight_map"].size());
  for (auto& [name, shard] : index["weight_map"].items()) {
    ASSERT_NE(c.find(name), nullptr) << name;
    EXPECT_EQ(fs::path(c.find(name)->file).filename(), shard.get<std::string>()) << name;
  }
  EXPECT_EQ(c.get("lm_head.weight").shape, (std::vector<int64_t>{1024, 64}));
  EXPECT_THAT([&] { c.get("model.nope"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'model.nope' is missing")));
}

TEST(Checkpoint, SingleFileAndLooseShards) {
  TempDir dir;
  write_file(dir.path / "model.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  EXPECT_EQ(Checkpoint(dir.str()).tensors().size(), 1u);
  TempDir loose;
  write_file(loose.path / "b.safetensors", safetensors_bytes({{"y", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_file(loose.path / "a.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  Checkpoint c(loose.str());
  EXPECT_EQ(c.tensors().size(), 2u);
  EXPECT_THAT(c.find("x")->file, HasSubstr("a.safetensors"));
}

TEST(Checkpoint, MissingShard) {
  TempDir dir;
  write_file(dir.path / "s1.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_json(dir.path / "model.safetensors.index.json",
             {{"weight_map", {{"x", "s1.safetensors"}, {"y", "s2.safetensors"}}}});
  EXPECT_THAT(checkpoint_error(dir.path), AllOf(HasSubstr("model.safetensors.index.json: shard"),
                                                HasSubstr("s2.safetensors named by the index is missing")));
}

TEST(Checkpoint, IndexDisagreesWithShards) {
  TempDir dir;
  write_file(dir.path / "s1.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_file(dir.path / "s2.safetensors", safetensors_bytes({{"y", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_json(dir.path / "model.safetensors.index.json",
             {{"weight_map", {{"x", "s2.safetensors"}, {"y", "s1.safetensors"}}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("the index places tensor 'x' in s2.safetensors, but it is in"));
  write_json(dir.path / "model.safetensors.index.json",
             {{"weight_map", {{"x", "s1.safetensors"}, {"y", "s2.safetensors"}, {"z", "s2.safetensors"}}}});
  EXPECT_THAT(checkpoint_error(dir.path),
              HasSubstr("the index places tensor 'z' in s2.safetensors, which does not hold it"));
  write_file(dir.path / "s2.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_json(dir.path / "model.safetensors.index.json",
             {{"weight_map", {{"x", "s1.safetensors"}, {"w", "s2.safetensors"}}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("tensor 'x' appears in both"));
  write_file(dir.path / "model.safetensors.index.json", "{not json");
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("model.safetensors.index.json: not valid JSON"));
  write_json(dir.path / "model.safetensors.index.json", {{"metadata", {}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("missing the \"weight_map\" object"));
}

// A PLE table in files of its own (ple_table.json): their tensors join the checkpoint under tensor_prefix; the
// descriptor's mistakes are named errors.
TEST(Checkpoint, PleTableInSeparateFiles) {
  const std::string prefix = "model.language_model.layers.1.ple.ple_embedding.ngram_embedding.";
  TempDir dir;
  write_file(dir.path / "model.safetensors", safetensors_bytes({{"x", "F32", {1}, std::vector<uint8_t>(4)}}));
  write_file(dir.path / "ple-fp8.safetensors",
             safetensors_bytes({{"shard_0.weight", "F8_E4M3", {2, 3}, std::vector<uint8_t>(6, 0x38)},
                                {"weight_scale", "BF16", {1}, bytes_of({0x80, 0x3f})}}));
  write_json(dir.path / "ple_table.json", {{"files", {"ple-fp8.safetensors"}}, {"tensor_prefix", prefix}});
  {
    Checkpoint c(dir.str());
    EXPECT_EQ(c.tensors().size(), 3u);
    const TensorView* t = c.find(prefix + "shard_0.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, prefix + "shard_0.weight");
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_THAT(t->file, HasSubstr("ple-fp8.safetensors"));
    EXPECT_NE(c.find(prefix + "weight_scale"), nullptr);
    EXPECT_EQ(c.files().size(), 2u);
  }
  // Loose shards: the table's file is not read as a shard too.
  fs::rename(dir.path / "model.safetensors", dir.path / "a.safetensors");
  EXPECT_EQ(Checkpoint(dir.str()).tensors().size(), 3u);
  fs::rename(dir.path / "a.safetensors", dir.path / "model.safetensors");
  // Mistakes: no prefix (names that are no PLE table tensors), a missing file, a shard named as the table's file,
  // another field, no files, not JSON.
  write_json(dir.path / "ple_table.json", {{"files", {"ple-fp8.safetensors"}}});
  EXPECT_THAT(checkpoint_error(dir.path),
              AllOf(HasSubstr("ple_table.json: tensor 'shard_0.weight'"), HasSubstr("is not a PLE table tensor")));
  write_json(dir.path / "ple_table.json", {{"files", {"nope.safetensors"}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("\"files\" names 'nope.safetensors', which is not a file of"));
  write_json(dir.path / "ple_table.json", {{"files", {"model.safetensors"}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("'model.safetensors' is a shard of the checkpoint itself"));
  write_json(dir.path / "ple_table.json",
             {{"files", {"ple-fp8.safetensors"}}, {"tensor_prefix", prefix}, {"scale", 2}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("unknown field \"scale\""));
  write_json(dir.path / "ple_table.json", {{"files", nlohmann::json::array()}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("a non-empty array of safetensors file names"));
  write_json(dir.path / "ple_table.json", {{"file", {"ple-fp8.safetensors"}}});  // a typo is named first
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("unknown field \"file\""));
  write_json(dir.path / "ple_table.json", {{"files", {"./ple-fp8.safetensors"}}, {"tensor_prefix", prefix}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("must be the bare name of a file"));
  write_json(dir.path / "ple_table.json",
             {{"files", {"ple-fp8.safetensors", "ple-fp8.safetensors"}}, {"tensor_prefix", prefix}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("lists 'ple-fp8.safetensors' twice"));
  write_json(dir.path / "ple_table.json", {{"files", {"ple-fp8.safetensors"}}, {"tensor_prefix", "layers.1.x"}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("is not a PLE table tensor"));
  fs::create_directories(dir.path / "sub.safetensors");
  write_json(dir.path / "ple_table.json", {{"files", {"sub.safetensors"}}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("names 'sub.safetensors', which is not a file of"));
  fs::remove_all(dir.path / "ple_table.json");
  fs::create_directories(dir.path / "ple_table.json");
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("ple_table.json: not a file"));
  fs::remove_all(dir.path / "ple_table.json");
  write_file(dir.path / "ple_table.json", "{");
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("ple_table.json: not valid JSON"));
  // A table tensor also in the shards.
  write_file(dir.path / "model.safetensors",
             safetensors_bytes({{prefix + "weight_scale", "BF16", {1}, bytes_of({0x80, 0x3f})}}));
  write_json(dir.path / "ple_table.json", {{"files", {"ple-fp8.safetensors"}}, {"tensor_prefix", prefix}});
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("weight_scale' appears in both"));
}

TEST(Checkpoint, NotAModelFolder) {
  TempDir dir;
  EXPECT_THAT(checkpoint_error(dir.path), HasSubstr("no model.safetensors, no model.safetensors.index.json"));
  EXPECT_THAT(checkpoint_error(dir.path / "absent"), HasSubstr("not a directory"));
}
