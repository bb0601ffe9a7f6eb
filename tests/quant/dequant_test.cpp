// Exact dequantization of every supported format on hand-built tensors, against values computed from the format
// definitions (docs ARTIFACTS.md 3; E2M1 / E4M3 / BF16 / F16 encodings from the OCP and IEEE specifications), and the
// errors for malformed tensors and configs.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/quant.h"

namespace flashnext {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

/// Owns the bytes of hand-built tensors.
struct Store {
  std::deque<std::vector<uint8_t>> bufs;
  std::deque<TensorView> views;

  template <class T>
  const TensorView* add(const std::string& name, DType t, std::vector<int64_t> shape, const std::vector<T>& values) {
    auto& b = bufs.emplace_back(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
    TensorView v;
    v.name = name;
    v.dtype = t;
    v.shape = std::move(shape);
    v.data = b.data();
    v.nbytes = b.size();
    v.file = "test.safetensors";
    return &views.emplace_back(std::move(v));
  }
};

// E4M3 (bias 7) and BF16 / F16 encodings used below, by their definition.
constexpr uint8_t kE4m3One = 0x38, kE4m3Two = 0x40, kE4m3OnePointFive = 0x3C, kE4m3Half = 0x30, kE4m3Max = 0x7E;
constexpr uint16_t kBf16One = 0x3F80, kBf16Two = 0x4000, kBf16Quarter = 0x3E80, kBf16Four = 0x4080;
constexpr uint16_t kF16One = 0x3C00, kF16Half = 0x3800;

TEST(Dequant, E2m1CodesFollowTheSpec) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_float(uint8_t(c)), want[c]) << "code " << c;
  EXPECT_TRUE(std::signbit(e2m1_to_float(8)));
  EXPECT_EQ(f8e4m3_to_float(kE4m3Max), 448.0f);
}

// Two rows of 32 inputs: element 2j in the low nibble of byte j, one E4M3 scale per 16 inputs (row-major, linear),
// times the per-tensor weight_scale_2.
QuantizedWeight nvfp4(Store& s, QuantFormat f, float global) {
  std::vector<uint8_t> codes(2 * 16, 0), scales = {kE4m3Two, kE4m3One, kE4m3Half, kE4m3OnePointFive};
  codes[0] = 0x71;        // row 0: element 0 = code 1 (0.5), element 1 = code 7 (6)
  codes[16 + 8] = 0x9A;   // row 1: element 16 = code 0xA (-1), element 17 = code 9 (-0.5)
  codes[16 + 15] = 0xF0;  // row 1: element 30 = 0, element 31 = code 0xF (-6)
  QuantizedWeight w;
  w.format = f;
  w.name = "layers.0.mlp.experts.0.gate_proj.weight";
  w.rows = 2;
  w.cols = 32;
  w.group = 16;
  w.data = s.add(f == QuantFormat::Nvfp4 ? "x.weight" : "x.weight_packed", DType::U8, {2, 16}, codes);
  w.scale = s.add("x.weight_scale", DType::F8_E4M3, {2, 2}, scales);
  w.global_scale = s.add(f == QuantFormat::Nvfp4 ? "x.weight_scale_2" : "x.weight_global_scale", DType::F32, {},
                         std::vector<float>{global});
  return w;
}

void expect_nvfp4_values(const std::vector<float>& w) {
  ASSERT_EQ(w.size(), 64u);
  std::vector<float> want(64, 0.0f);
  want[0] = 0.5f * 2 * 0.25f;  // code 1, block scale 2, weight_scale_2 1/4
  want[1] = 6.0f * 2 * 0.25f;
  want[32 + 16] = -1.0f * 1.5f * 0.25f;  // row 1, block 1 (scale 1.5)
  want[32 + 17] = -0.5f * 1.5f * 0.25f;
  want[32 + 31] = -6.0f * 1.5f * 0.25f;
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(w[i], want[i]) << "element " << i;
}

TEST(Dequant, Nvfp4ModelOptLowNibbleFirstLinearScalesTimesScale2) {
  Store s;
  expect_nvfp4_values(dequantize(nvfp4(s, QuantFormat::Nvfp4, 0.25f)));
}

TEST(Dequant, Nvfp4CompressedTensorsGlobalScaleIsADivisor) {
  Store s;
  expect_nvfp4_values(dequantize(nvfp4(s, QuantFormat::CtNvfp4, 4.0f)));  // 1 / 4 = ModelOpt's 0.25
}

TEST(Dequant, Nvfp4MissingOrMisShapedScaleIsAnError) {
  Store s;
  QuantizedWeight w = nvfp4(s, QuantFormat::Nvfp4, 0.25f);
  w.scale = nullptr;
  EXPECT_THAT([&] { dequantize(w); },
              testing::ThrowsMessage<Error>(HasSubstr("has no 'weight_scale' tensor (one E4M3 scale per 16 inputs)")));
  w = nvfp4(s, QuantFormat::Nvfp4, 0.25f);
  w.scale = s.add("x.weight_scale", DType::F8_E4M3, {4, 1}, std::vector<uint8_t>(4, kE4m3One));
  EXPECT_THAT([&] { dequantize(w); },
              testing::ThrowsMessage<Error>(HasSubstr("tensor 'x.weight_scale' is F8_E4M3 [4, 1], expected F8_E4M3 "
                                                      "[2, 2] (one E4M3 scale per 16 inputs)")));
  w = nvfp4(s, QuantFormat::Nvfp4, 0.25f);
  w.global_scale = s.add("x.weight_scale_2", DType::F32, {2}, std::vector<float>{1, 2});
  EXPECT_THAT([&] { dequantize(w); }, testing::ThrowsMessage<Error>(HasSubstr("expected one F32 value")));
  w = nvfp4(s, QuantFormat::Nvfp4, 0.25f);
  w.data = s.add("x.weight", DType::U8, {2, 32}, std::vector<uint8_t>(64, 0));
  EXPECT_THAT([&] { dequantize(w); }, testing::ThrowsMessage<Error>(HasSubstr("expected U8 [2, 16]")));
}

// 130 x 200 with 128 x 128 blocks: the scale grid is ceil-sized [2, 2]; the last block of each dimension is partial.
TEST(Dequant, Fp8BlockScaleOfBlockNOver128KOver128WithPartialBlocks) {
  Store s;
  QuantizedWeight w;
  w.format = QuantFormat::Fp8Block;
  w.name = "x.weight";
  w.rows = 130;
  w.cols = 200;
  w.block_rows = w.block_cols = 128;
  std::vector<uint8_t> q(130 * 200, kE4m3One);
  q[129 * 200 + 199] = kE4m3OnePointFive;
  w.data = s.add("x.weight", DType::F8_E4M3, {130, 200}, q);
  w.scale = s.add("x.weight_scale_inv", DType::BF16, {2, 2},
                  std::vector<uint16_t>{kBf16One, kBf16Two, kBf16Quarter, kBf16Four});
  const std::vector<float> v = dequantize(w);
  EXPECT_EQ(v[127 * 200 + 127], 1.0f);
  EXPECT_EQ(v[127 * 200 + 128], 2.0f);
  EXPECT_EQ(v[128 * 200 + 127], 0.25f);
  EXPECT_EQ(v[128 * 200 + 128], 4.0f);
  EXPECT_EQ(v[129 * 200 + 199], 1.5f * 4.0f);
  w.scale = s.add("x.weight_scale_inv", DType::BF16, {1, 2}, std::vector<uint16_t>{kBf16One, kBf16Two});
  EXPECT_THAT([&] { dequantize(w); },
              testing::ThrowsMessage<Error>(HasSubstr("is BF16 [1, 2], expected BF16 or F16 or F32 [2, 2]")));
}

// weight_packed I32 [N, K/8]: element k at bits 4*(k%8), stored + 8.
TEST(Dequant, CtInt4SymmetricOffsetEightGroupScales) {
  Store s;
  uint32_t ramp = 0, top = 0;
  for (uint32_t k = 0; k < 8; ++k) {
    ramp |= k << (4 * k);   // nibble k: value k - 8
    top |= 15u << (4 * k);  // value 7
  }
  QuantizedWeight w;
  w.format = QuantFormat::CtInt4;
  w.name = "x.weight";
  w.rows = 2;
  w.cols = 16;
  w.group = 8;
  w.data = s.add("x.weight_packed", DType::I32, {2, 2}, std::vector<uint32_t>{ramp, top, top, ramp});
  w.scale =
      s.add("x.weight_scale", DType::BF16, {2, 2}, std::vector<uint16_t>{kBf16Quarter, kBf16Two, kBf16One, kBf16Four});
  w.shape = s.add("x.weight_shape", DType::I64, {2}, std::vector<int64_t>{2, 16});
  const std::vector<float> v = dequantize(w);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(v[k], float(k - 8) * 0.25f);
    EXPECT_EQ(v[8 + k], 7.0f * 2.0f);
    EXPECT_EQ(v[16 + k], 7.0f * 1.0f);
    EXPECT_EQ(v[24 + k], float(k - 8) * 4.0f);
  }
  w.shape = s.add("x.weight_shape", DType::I64, {2}, std::vector<int64_t>{16, 2});
  EXPECT_THAT([&] { dequantize(w); },
              testing::ThrowsMessage<Error>(HasSubstr("holds [16, 2], but x.weight is [2, 16]")));
}

// Zero points packed along dim 0: row n at bits 4*(n%8) of word row n/8, + 8; 10 rows need 2 word rows.
TEST(Dequant, CtInt4AsymmetricZeroPointsPackedAlongOutputs) {
  Store s;
  uint32_t eights = 0, z0 = 0;
  for (uint32_t i = 0; i < 8; ++i) {
    eights |= 8u << (4 * i);  // q = 0 everywhere
    z0 |= i << (4 * i);       // rows 0..7: zero point i - 8
  }
  const uint32_t z1 = 3u | (12u << 4);  // row 8: 3 - 8, row 9: 12 - 8
  QuantizedWeight w;
  w.format = QuantFormat::CtInt4;
  w.name = "x.weight";
  w.rows = 10;
  w.cols = 8;
  w.group = 8;
  w.data = s.add("x.weight_packed", DType::I32, {10, 1}, std::vector<uint32_t>(10, eights));
  w.scale = s.add("x.weight_scale", DType::F32, {10, 1}, std::vector<float>(10, 0.5f));
  w.zero_point = s.add("x.weight_zero_point", DType::I32, {2, 1}, std::vector<uint32_t>{z0, z1});
  const std::vector<float> v = dequantize(w);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(v[size_t(n * 8 + 3)], float(0 - (n - 8)) * 0.5f) << "row " << n;
  EXPECT_EQ(v[8 * 8], float(0 - (3 - 8)) * 0.5f);
  EXPECT_EQ(v[9 * 8 + 7], float(0 - (12 - 8)) * 0.5f);
  w.zero_point = s.add("x.weight_zero_point", DType::I32, {10, 1}, std::vector<uint32_t>(10, 0));
  EXPECT_THAT([&] { dequantize(w); }, testing::ThrowsMessage<Error>(HasSubstr("expected I32 [2, 1] (zero points")));
}

// qweight I32 [K/8, N] packed along K; qzeros [K/g, N/8] packed along N; v1 stores zero - 1.
QuantizedWeight gptq(Store& s, bool v2) {
  uint32_t ramp = 0, top = 0, sevens = 0;
  for (uint32_t i = 0; i < 8; ++i) {
    ramp |= i << (4 * i);
    top |= 15u << (4 * i);
    sevens |= 7u << (4 * i);
  }
  QuantizedWeight w;
  w.format = QuantFormat::Gptq;
  w.name = "x.weight";
  w.rows = 8;   // N
  w.cols = 16;  // K
  w.group = 8;
  w.gptq_v2 = v2;
  std::vector<uint32_t> qweight(2 * 8);
  for (int n = 0; n < 8; ++n) {
    qweight[size_t(n)] = ramp;     // k = 0..7: q = k
    qweight[size_t(8 + n)] = top;  // k = 8..15: q = 15
  }
  w.data = s.add("x.qweight", DType::I32, {2, 8}, qweight);
  w.zero_point = s.add("x.qzeros", DType::I32, {2, 1}, std::vector<uint32_t>{sevens, ramp});
  std::vector<uint16_t> scales(16, kF16One);
  for (int n = 0; n < 8; ++n) scales[size_t(8 + n)] = kF16Half;
  w.scale = s.add("x.scales", DType::F16, {2, 8}, scales);
  std::vector<int32_t> g_idx(16);
  for (int k = 0; k < 16; ++k) g_idx[size_t(k)] = k / 8;
  w.g_idx = s.add("x.g_idx", DType::I32, {16}, g_idx);
  return w;
}

TEST(Dequant, GptqV1ZerosAreStoredMinusOne) {
  Store s;
  const std::vector<float> v = dequantize(gptq(s, false));
  for (int n = 0; n < 8; ++n) {
    for (int k = 0; k < 8; ++k) EXPECT_EQ(v[size_t(n * 16 + k)], float(k - (7 + 1)) * 1.0f);
    for (int k = 8; k < 16; ++k) EXPECT_EQ(v[size_t(n * 16 + k)], float(15 - (n + 1)) * 0.5f);
  }
}

TEST(Dequant, GptqV2ZerosAreStoredAsIs) {
  Store s;
  const std::vector<float> v = dequantize(gptq(s, true));
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(v[size_t(n * 16 + 2)], float(2 - 7));
    EXPECT_EQ(v[size_t(n * 16 + 9)], float(15 - n) * 0.5f);
  }
}

TEST(Dequant, GptqPermutedGIdxIsRejected) {
  Store s;
  QuantizedWeight w = gptq(s, false);
  std::vector<int32_t> g_idx(16);
  for (int k = 0; k < 16; ++k) g_idx[size_t(k)] = k % 2;  // act-order style
  w.g_idx = s.add("x.g_idx", DType::I32, {16}, g_idx);
  EXPECT_THAT([&] { dequantize(w); },
              testing::ThrowsMessage<Error>(HasSubstr("tensor 'x.g_idx' maps input 1 to group 1, expected 0")));
  w = gptq(s, false);
  w.zero_point = nullptr;
  EXPECT_THAT([&] { dequantize(w); }, testing::ThrowsMessage<Error>(HasSubstr("has no 'qzeros' tensor")));
}

// AutoAWQ GEMM (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear): qweight I32 [K, N/8] packed along the
// outputs, nibble i (bits 4i..4i+3) of word j holding output 8j + AWQ_ORDER[i], AWQ_ORDER = {0, 2, 4, 6, 1, 3, 5, 7};
// qzeros I32 [K/g, N/8] packed the same way, no offset; scales F16 [K/g, N]; w = (q - z) * s.
// Here N = 16 (two words per input row), K = 64, group 32: word 0 = 0x76543210 (nibble i holds i), word 1 =
// 0xFEDCBA98 (nibble i holds 8 + i), the same for every input row.
QuantizedWeight awq(Store& s, bool zeros) {
  QuantizedWeight w;
  w.format = QuantFormat::Awq;
  w.name = "x.weight";
  w.rows = 16;  // N
  w.cols = 64;  // K
  w.group = 32;
  std::vector<uint32_t> qweight;
  for (int k = 0; k < 64; ++k) qweight.insert(qweight.end(), {0x76543210u, 0xFEDCBA98u});
  w.data = s.add("x.qweight", DType::I32, {64, 2}, qweight);
  // Group 0: only nibble 1 of word 0 is set (3); by AWQ_ORDER[1] = 2 that is output 2's zero point. Group 1: every
  // zero point 8.
  if (zeros)
    w.zero_point = s.add("x.qzeros", DType::I32, {2, 2}, std::vector<uint32_t>{0x30u, 0, 0x88888888u, 0x88888888u});
  std::vector<uint16_t> scales(32, kF16One);
  for (int n = 0; n < 16; ++n) scales[size_t(16 + n)] = kF16Half;  // group 1: 0.5
  w.scale = s.add("x.scales", DType::F16, {2, 16}, scales);
  return w;
}

// q of outputs 0..15 by the definition: output 8j + AWQ_ORDER[i] holds nibble i, so outputs 0, 2, 4, 6, 1, 3, 5, 7
// hold 0..7 (word 0) and outputs 8, 10, ..., 15 hold 8..15 (word 1).
constexpr int kAwqWantQ[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};

TEST(Dequant, AwqNibbleOrderZeroPointsAndGroupBoundary) {
  Store s;
  const std::vector<float> v = dequantize(awq(s, true));
  ASSERT_EQ(v.size(), 16u * 64u);
  for (int n = 0; n < 16; ++n) {
    const float z0 = n == 2 ? 3.f : 0.f;
    for (int k : {0, 17, 31}) EXPECT_EQ(v[size_t(n * 64 + k)], (float(kAwqWantQ[n]) - z0) * 1.0f) << n << " " << k;
    for (int k : {32, 40, 63}) EXPECT_EQ(v[size_t(n * 64 + k)], float(kAwqWantQ[n] - 8) * 0.5f) << n << " " << k;
  }
  // Spelled out for one word: outputs 1 and 2 of input 0 are 4 and 1 - 3, outputs 9 and 15 of input 63 are
  // (12 - 8) / 2 and (15 - 8) / 2.
  EXPECT_EQ(v[1 * 64 + 0], 4.0f);
  EXPECT_EQ(v[2 * 64 + 0], -2.0f);
  EXPECT_EQ(v[9 * 64 + 63], 2.0f);
  EXPECT_EQ(v[15 * 64 + 63], 3.5f);
}

TEST(Dequant, AwqSymmetricZeroIsEight) {
  Store s;
  const std::vector<float> v = dequantize(awq(s, false));  // zero_point false: no qzeros
  for (int n = 0; n < 16; ++n) {
    EXPECT_EQ(v[size_t(n * 64 + 5)], float(kAwqWantQ[n] - 8) * 1.0f) << n;
    EXPECT_EQ(v[size_t(n * 64 + 60)], float(kAwqWantQ[n] - 8) * 0.5f) << n;
  }
}

TEST(Dequant, AwqOneGroupOverK) {
  Store s;
  QuantizedWeight w = awq(s, true);
  w.group = 0;  // group_size -1
  w.zero_point = s.add("x.qzeros", DType::I32, {1, 2}, std::vector<uint32_t>{0x11111111u, 0x22222222u});
  w.scale = s.add("x.scales", DType::F16, {1, 16}, std::vector<uint16_t>(16, kF16Half));
  const std::vector<float> v = dequantize(w);
  for (int n = 0; n < 16; ++n) EXPECT_EQ(v[size_t(n * 64 + 50)], float(kAwqWantQ[n] - (n < 8 ? 1 : 2)) * 0.5f) << n;
}

TEST(Dequant, AwqShapeDtypeAndGroupErrorsNameTheTensor) {
  Store s;
  auto err = [](const QuantizedWeight& w, const std::string& want) {
    EXPECT_THAT([&] { dequantize(w); }, testing::ThrowsMessage<Error>(HasSubstr(want)));
  };
  QuantizedWeight w = awq(s, true);
  w.data = s.add("x.qweight", DType::I32, {8, 16}, std::vector<uint32_t>(128, 0));  // GPTQ's [K/8, N]
  err(w, "tensor 'x.qweight' is I32 [8, 16], expected I32 [64, 2] (eight 4-bit outputs per int32 in AWQ order)");
  w = awq(s, true);
  w.scale = s.add("x.scales", DType::F16, {16, 2}, std::vector<uint16_t>(32, kF16One));
  err(w, "tensor 'x.scales' is F16 [16, 2], expected BF16 or F16 or F32 [2, 16] (one scale per group and output)");
  w = awq(s, true);
  w.scale = s.add("x.scales", DType::I32, {2, 16}, std::vector<int32_t>(32, 1));
  err(w, "tensor 'x.scales' is I32 [2, 16], expected BF16 or F16 or F32 [2, 16]");
  w = awq(s, true);
  w.zero_point = s.add("x.qzeros", DType::I32, {2, 16}, std::vector<uint32_t>(32, 0));
  err(w, "tensor 'x.qzeros' is I32 [2, 16], expected I32 [2, 2] (zero points packed eight per int32 along outputs");
  w = awq(s, true);
  w.zero_point = s.add("x.qzeros", DType::F16, {2, 2}, std::vector<uint16_t>(4, 0));
  err(w, "tensor 'x.qzeros' is F16 [2, 2], expected I32 [2, 2]");
  w = awq(s, true);
  w.group = 48;
  err(w, "tensor 'x.qweight': group_size 48 does not divide K = 64");
  w = awq(s, true);
  w.group = 128;  // larger than K: also no tiling
  err(w, "tensor 'x.qweight': group_size 128 does not divide K = 64");
  w = awq(s, true);
  w.scale = nullptr;
  err(w, "has no 'scales' tensor (one scale per group and output) next to 'x.qweight'");
}

TEST(Dequant, PleFp8RowsTimesTheBf16Scalar) {
  Store s;
  const uint16_t scale_bits = 0x3951;  // the RadixArk table scale, about 1.993e-4
  const float scale = bf16_to_float(scale_bits);
  const TensorView* shard = s.add("t.shard_0.weight", DType::F8_E4M3, {2, 3},
                                  std::vector<uint8_t>{kE4m3One, kE4m3Two, uint8_t(0x80 | kE4m3Half), 0, kE4m3Max, 1});
  const TensorView* sc = s.add("t.weight_scale", DType::BF16, {1}, std::vector<uint16_t>{scale_bits});
  const std::vector<float> v = dequantize_ple_shard(*shard, *sc);
  const std::vector<float> want = {scale, 2 * scale, -0.5f * scale, 0, 448 * scale, std::ldexp(1.0f, -9) * scale};
  EXPECT_EQ(v, want);
  const TensorView* bad = s.add("t.weight_scale", DType::BF16, {2}, std::vector<uint16_t>{scale_bits, scale_bits});
  EXPECT_THAT([&] { dequantize_ple_shard(*shard, *bad); },
              testing::ThrowsMessage<Error>(HasSubstr("expected one BF16 value (shape [1])")));
  const TensorView* bf16 = s.add("t.shard_0.weight", DType::BF16, {1, 1}, std::vector<uint16_t>{kBf16One});
  EXPECT_THAT([&] { dequantize_ple_shard(*bf16, *sc); }, testing::ThrowsMessage<Error>(HasSubstr("expected FP8")));
}

// ------------------------------------------------------------------------------------------------ configs

QuantConfig parse(const json& qc, const json& hf = json()) {
  return parse_quant_config(json{{"quantization_config", qc}}, hf, "test/config.json");
}

TEST(QuantConfig, ModelOptNvfp4AndMixedPrecision) {
  QuantConfig q = parse({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"ignore", {"lm_head"}}},
                        {{"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"a"}}}}});
  EXPECT_EQ(q.method, "modelopt");
  EXPECT_EQ(q.algo, "NVFP4");
  EXPECT_EQ(q.group_size, 16);
  EXPECT_EQ(q.exclude_modules, std::vector<std::string>{"a"});
  q = parse({{"quant_method", "modelopt"},
             {"quant_algo", "MIXED_PRECISION"},
             {"quantized_layers",
              {{"model.layers.0.mlp.experts", {{"quant_algo", "NVFP4"}, {"group_size", 16}}},
               {"mtp.layers.0.mlp.experts", {{"quant_algo", "FP8_PB_WO"}}}}}});
  ASSERT_EQ(q.quantized_layers.size(), 2u);
  EXPECT_EQ(q.quantized_layers[0].second, "NVFP4");
  // Only hf_quant_config.json (no quantization_config in config.json) is ModelOpt too.
  q = parse_quant_config(json::object(), {{"quantization", {{"quant_algo", "NVFP4"}}}}, "x");
  EXPECT_EQ(q.method, "modelopt");
  EXPECT_TRUE(parse_quant_config(json::object(), json(), "x").method.empty());
}

TEST(QuantConfig, UnknownOrUnsupportedDeclarationsAreClearErrors) {
  auto err = [](const json& qc, const json& hf, const std::string& want) {
    EXPECT_THAT([&] { parse(qc, hf); }, testing::ThrowsMessage<Error>(HasSubstr(want))) << qc.dump();
  };
  const json none;
  err({{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}}, none,
      "unknown ModelOpt quant_algo 'W4A8_AWQ' (supported: NVFP4, MIXED_PRECISION)");
  err({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}, {{"quantization", {{"quant_algo", "FP8"}}}},
      "quant_algo disagrees: config.json says 'NVFP4', hf_quant_config.json says 'FP8'");
  err({{"quant_method", "modelopt"},
       {"quant_algo", "MIXED_PRECISION"},
       {"quantized_layers", {{"model.layers.0.mlp.experts", {{"quant_algo", "INT4_AWQ"}}}}}},
      none, "unknown quant_algo 'INT4_AWQ' (supported in quantized_layers: NVFP4, FP8, FP8_PB_WO)");
  err({{"quant_method", "modelopt"}, {"quant_algo", "MIXED_PRECISION"}}, none, "needs a non-empty quantized_layers");
  err({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", "FP8"}}, none,
      "quantized KV caches are not supported");
  err({{"quant_method", "hqq"}, {"bits", 4}}, none,
      "unknown quant_method 'hqq' in quantization_config (supported: modelopt, fp8, compressed-tensors, gptq, "
      "auto-round, awq)");
  err({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}, none, "without weight_block_size");
  err({{"quant_method", "fp8"}, {"weight_block_size", {128}}}, none, "must be two positive integers");
  err({{"quant_method", "gptq"}, {"bits", 5}}, none, "bits is 5: GPTQ packings of 2, 3, 4 or 8 bits are supported");
  err({{"quant_method", "auto-round"}, {"bits", 4}, {"data_type", "nv_fp"}}, none,
      "data_type is 'nv_fp': only integer AutoRound weights are supported");
  err({{"quant_method", "gptq"}, {"bits", 4}, {"desc_act", true}}, none, "GPTQ activation order");
  err({{"quant_method", "gptq"}, {"checkpoint_format", "marlin"}}, none, "checkpoint_format 'marlin'");
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups":
                      {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}})"),
      none, "unknown compressed-tensors format 'marlin-24'");
  // 8-bit channel / tensor formats: group strategies and asymmetric weights are refused.
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups":
                      {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}})"),
      none, "float-quantized weights of 8 bits, type 'float', strategy 'group', symmetric true are not supported");
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups":
                      {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
                       "strategy": "channel", "symmetric": false}}}})"),
      none, "int-quantized weights of 8 bits, type 'int', strategy 'channel', symmetric false are not supported");
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups":
                      {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
                       "strategy": "group", "group_size": 128, "actorder": "group"}}}})"),
      none, "activation ordering with a stored g_idx is not supported");
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                      "kv_cache_scheme": {"num_bits": 8, "type": "float"}})"),
      none, "kv_cache_scheme is {\"num_bits\":8,\"type\":\"float\"}: quantized KV caches are not supported");
  err(json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                      "sparsity_config": {"format": "sparse-24-bitmask"}})"),
      none, "sparse-compressed checkpoints are not supported");
  err({{"quant_method", "gptq"}, {"group_size", "128"}}, none, "group_size must be an integer");
}

TEST(QuantConfig, CompressedTensorsGroupsAndGptqDynamic) {
  QuantConfig q = parse(json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "symmetric": false, "strategy": "group", "group_size": 32}}}})"));
  ASSERT_EQ(q.ct_groups.size(), 1u);
  EXPECT_EQ(q.ct_groups[0].group_size, 32);
  EXPECT_FALSE(q.ct_groups[0].symmetric);
  EXPECT_EQ(q.ct_groups[0].format, "pack-quantized");
  q = parse({{"quant_method", "gptq"},
             {"bits", 4},
             {"group_size", 128},
             {"checkpoint_format", "gptq_v2"},
             {"dynamic", {{"-:.*self_attn.*", json::object()}, {"+:.*experts.*", {{"group_size", 32}}}}}});
  EXPECT_TRUE(q.gptq_v2);
  ASSERT_EQ(q.gptq_dynamic.size(), 2u);
  for (const GptqRule& r : q.gptq_dynamic) {
    EXPECT_EQ(r.exclude, r.pattern == ".*self_attn.*") << r.pattern;
    EXPECT_EQ(r.group_size, r.pattern == ".*experts.*" ? 32 : 0) << r.pattern;
  }
}

// transformers' AwqConfig as AutoAWQ writes it into config.json, and AutoAWQ's own quant_config.json spelling.
TEST(QuantConfig, AwqGemmFields) {
  QuantConfig q = parse({{"quant_method", "awq"},
                         {"bits", 4},
                         {"group_size", 32},
                         {"zero_point", true},
                         {"version", "gemm"},
                         {"modules_to_not_convert", {"visual", "mlp.gate."}}});
  EXPECT_EQ(q.method, "awq");
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 32);
  EXPECT_TRUE(q.awq_zero_point);
  EXPECT_EQ(q.not_convert, (std::vector<std::string>{"visual", "mlp.gate."}));
  q = parse({{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 128}, {"zero_point", false}, {"version", "GEMM"}});
  EXPECT_EQ(q.group_size, 128);
  EXPECT_FALSE(q.awq_zero_point);
  EXPECT_TRUE(q.not_convert.empty());
  q = parse({{"quant_method", "awq"}, {"group_size", -1}, {"modules_to_not_convert", nullptr}, {"backend", "autoawq"}});
  EXPECT_EQ(q.group_size, 0);  // one group over K
  EXPECT_EQ(q.bits, 4);
  EXPECT_TRUE(q.awq_zero_point);  // AutoAWQ's default
}

TEST(QuantConfig, AwqUnsupportedFieldsAreClearErrors) {
  auto err = [](const json& qc, const std::string& want) {
    EXPECT_THAT([&] { parse(qc); }, testing::ThrowsMessage<Error>(HasSubstr(want))) << qc.dump();
  };
  const json base = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", true}};
  auto with = [&](const char* k, const json& v) {
    json c = base;
    c[k] = v;
    return c;
  };
  for (const char* v : {"gemv", "gemv_fast", "marlin", "exllama", "ipex"}) {
    err(with("version", v), fmt::format("config.json: quantization_config.version is '{}': only AutoAWQ's GEMM "
                                        "packing (version gemm",
                                        v));
  }
  err(with("bits", 8), "quantization_config.bits is 8: only 4-bit AWQ is supported");
  err(json{{"quant_method", "awq"}, {"w_bit", 3}}, "quantization_config.w_bit is 3: only 4-bit AWQ is supported");
  err(with("group_size", -2), "quantization_config.group_size must be positive or -1, got -2");
  err(with("group_size", "32"), "quantization_config.group_size must be an integer, got \"32\"");
  err(with("zero_point", "yes"), "quantization_config.zero_point must be true or false, got \"yes\"");
  err(with("version", 2), "quantization_config.version must be a string, got 2");
  err(with("backend", "llm-awq"), "quantization_config.backend is 'llm-awq': only AutoAWQ checkpoints");
  err(with("modules_to_not_convert", "visual"),
      "quantization_config.modules_to_not_convert must be a list of strings, got \"visual\"");
}

// How the CUDA backend holds a block of routed experts (core/quant_format.h w4a16_block_planes), folded over its
// matrices in either order: 4-bit codes, two planes where an 8-bit integer matrix is among them, FP8 bytes only when
// every matrix is FP8, FP16 (0) for anything else.
TEST(QuantFormat, ExpertBlockHoldingIsTheSameInEveryOrder) {
  using F = QuantFormat;
  struct M {
    F f;
    int64_t bits;
  };
  const auto fold = [](std::vector<M> ms) {
    int forward = kW4a16BlockStart, backward = kW4a16BlockStart;
    for (const M& m : ms) forward = w4a16_block_planes(forward, m.f, m.bits);
    for (auto it = ms.rbegin(); it != ms.rend(); ++it) backward = w4a16_block_planes(backward, it->f, it->bits);
    EXPECT_EQ(forward, backward);
    return forward;
  };
  EXPECT_EQ(fold({{F::Nvfp4, 4}, {F::Nvfp4, 4}}), 1);
  EXPECT_EQ(fold({{F::Gptq, 2}, {F::Gptq, 3}, {F::Gptq, 4}}), 1);
  EXPECT_EQ(fold({{F::Gptq, 4}, {F::Gptq, 8}}), 2);
  EXPECT_EQ(fold({{F::CtInt8, 8}, {F::CtInt8, 8}}), 2);
  EXPECT_EQ(fold({{F::CtFp8, 8}, {F::CtFp8, 8}}), kW4a16Fp8);
  EXPECT_EQ(fold({{F::Fp8Block, 8}}), kW4a16Fp8);
  EXPECT_EQ(fold({{F::Nvfp4, 4}, {F::CtFp8, 8}}), 0);
  EXPECT_EQ(fold({{F::CtInt4, 4}, {F::Fp8Block, 8}}), 0);
  EXPECT_EQ(fold({{F::CtInt8, 8}, {F::CtFp8, 8}}), 0);
  EXPECT_EQ(fold({{F::Nvfp4, 4}, {F::None, 16}}), 0);
  EXPECT_EQ(fold({{F::Gptq, 8}, {F::Gptq, 16}}), 0);
}

}  // namespace
}  // namespace flashnext
