// W4A16 MoE (ops/cuda/moe_w4a16.h).
// Repacking: for every source format (NVFP4 ModelOpt and compressed-tensors, GPTQ v1/v2, compressed-tensors int4
// symmetric and asymmetric, AutoAWQ GEMM with and without zero points, groups 16/32/128 with partial last groups
// where the format allows them) W4Packed::unpack equals, bit for bit, a
// straightforward float32 dequantization of the checkpoint tensors written here from src/loader/quant.h's formulas.
// 8-bit weights (GPTQ of 8 bits v1/v2, compressed-tensors int8 per row and per tensor) as two 4-bit planes
// (int8_planes): the planes' values add up to the checkpoint dequantization (each plane's value is one float
// product, so the sum is compared within 2^-22 of the planes' magnitudes; a wrong code or zero point is off by a
// whole scale). FP8 weights (compressed-tensors float-quantized per row and per tensor, the FP8 block format with
// blocks of kFp8BlockRows rows x `group` inputs) held as FP8 bytes: W4Packed::unpack equals the dequantization bit for
// bit, as the 4-bit formats.
// Kernels: both paths (GEMV and WMMA GEMM) against a CPU loop in double over the dequantized weights, over expert
// counts {1, 3, 16, 33}, top-k {1, 2, 10}, tokens {1, 2, 5, 16, 17, 100, 1000}, H {256, 200}, I {160, 40}; the
// 8-bit formats over the shapes whose widths their groups divide.
// Tolerance atol 3e-3 + rtol 1e-2 on outputs of magnitude ~0.1-0.5, h ~0.3 (as moe_test): the kernels round the
// activation h = silu(g) * u and every weighted slot output to FP16 (relative 2^-11 each; up to 10 slots per token),
// the int4 GEMM path rounds each weight once to FP16, sums run in FP32 in another order; the CPU loop rounds nothing. A
// wrong code, scale, zero point, group or row costs errors of order 0.1 (of 4-bit weights; for 8-bit ones a low
// plane's code off by one moves a weight by about 1/85, which W8Repack's exact check catches instead).
#include "ops/cuda/moe_w4a16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cuda_test_util.h"

namespace flashnext::cuda::test {
namespace {

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ------------------------------------------------------------------ the oracle (quant.h formulas)

float ref_e2m1(uint32_t c) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

float ref_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

float f16_round(float x) {
  return __half2float(__float2half_rn(x));
}

// The formats as checkpoint tensors for one expert matrix [N, K].
enum class Fmt {
  Nvfp4ModelOpt,
  Nvfp4Ct,
  CtInt4Sym,
  CtInt4Asym,
  GptqV1,
  GptqV2,
  Awq,
  AwqSym,
  Gptq8V1,
  Gptq8V2,
  CtInt8Row,
  CtInt8Tensor,
  Fp8CtRow,
  Fp8CtTensor,
  Fp8Block
};

// Rows of an FP8 block of the Fp8Block cases (their inputs: the case's group); odd, so blocks end inside gate_up.
constexpr int64_t kFp8BlockRows = 24;

// AutoAWQ GEMM (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear): nibble i of a word holds output
// 8j + kAwqOrder[i].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::Nvfp4ModelOpt: return "nvfp4_modelopt";
    case Fmt::Nvfp4Ct: return "nvfp4_ct";
    case Fmt::CtInt4Sym: return "ct_int4_sym";
    case Fmt::CtInt4Asym: return "ct_int4_asym";
    case Fmt::GptqV1: return "gptq_v1";
    case Fmt::GptqV2: return "gptq_v2";
    case Fmt::Awq: return "awq";
    case Fmt::AwqSym: return "awq_sym";
    case Fmt::Gptq8V1:
      return "gptq8_v1";
    case Fmt::Gptq8V2:
      return "gptq8_v2";
    case Fmt::CtInt8Row:
      return "ct_int8_row";
    case Fmt::CtInt8Tensor:
      return "ct_int8_tensor";
    case Fmt::Fp8CtRow:
      return "fp8_ct_row";
    case Fmt::Fp8CtTensor:
      return "fp8_ct_tensor";
    case Fmt::Fp8Block:
      return "fp8_block";
  }
  return "?";
}

bool is_nvfp4(Fmt f) {
  return f == Fmt::Nvfp4ModelOpt || f == Fmt::Nvfp4Ct;
}
bool has_zeros(Fmt f) {
  return f == Fmt::CtInt4Asym || f == Fmt::GptqV1 || f == Fmt::GptqV2 || f == Fmt::Awq;
}
bool is_awq(Fmt f) {
  return f == Fmt::Awq || f == Fmt::AwqSym;
}
bool is_gptq8(Fmt f) {
  return f == Fmt::Gptq8V1 || f == Fmt::Gptq8V2;
}
bool is_ct_int8(Fmt f) {
  return f == Fmt::CtInt8Row || f == Fmt::CtInt8Tensor;
}
bool is_fp8(Fmt f) {
  return f == Fmt::Fp8CtRow || f == Fmt::Fp8CtTensor || f == Fmt::Fp8Block;
}
// 8-bit integer formats are held as two 4-bit planes over the inputs twice (moe_w4a16.h int8_planes), FP8 as bytes.
int planes(Fmt f) {
  return is_gptq8(f) || is_ct_int8(f) ? 2 : 1;
}

struct Checkpoint {
  Fmt fmt;
  int64_t N = 0, K = 0, group = 0;
  std::vector<uint8_t> packed, e4m3;  // NVFP4 (packed: also the int8 values of compressed-tensors int8)
  float global = 1.f;
  std::vector<int32_t> words, zwords;  // int4: weight_packed / qweight, weight_zero_point / qzeros
  std::vector<float> scales;           // int4: [N, G] (compressed-tensors) or [G, N] (GPTQ, AWQ); FP8 block:
                                       // [ceil(N / kFp8BlockRows), G]
};

// A random E4M3 byte, never a NaN: one in 16 any of the 254 others (exponents 2^-6 .. 2^8, up to 448), else of
// magnitude about 2 (exponents 2^-3 .. 2^2, one in 16 of those a subnormal).
uint8_t random_e4m3(std::mt19937& rng) {
  const uint32_t r = rng();
  if ((r >> 12) % 16 == 0) {
    const uint32_t b = (r >> 16) % 254;  // skip 0x7f and 0xff
    return uint8_t(b < 127 ? b : b + 1);
  }
  const uint32_t e = (r & 15) == 0 ? 0u : 4u + (r >> 4) % 6u, m = (r >> 8) & 7u, sign = (r >> 11) & 1u;
  return uint8_t((sign << 7) | (e << 3) | m);
}

// The root mean square of random_e4m3's values (about 25, from the top exponents' bytes): FP8 checkpoints
// scale by it, so that the products have the magnitudes the tolerance assumes (a scale for the common bytes alone
// left the sums 12 times larger, and the FP16 rounding of h with them beyond atol + rtol on one H100).
double e4m3_rms() {
  double all = 0, sub = 0, mid = 0;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const double v = ref_e4m3(uint8_t(b)), v2 = v * v;
    all += v2 / 254;
    const int e = (b >> 3) & 15;
    if (e == 0) sub += v2 / 16;
    if (e >= 4 && e <= 9) mid += v2 / 96;
  }
  return std::sqrt(all / 16 + 15.0 / 16 * (sub / 16 + 15.0 / 16 * mid));
}

// Random checkpoint tensors whose weights have magnitude about `mag`.
Checkpoint make_checkpoint(Fmt fmt, int64_t N, int64_t K, int64_t group, float mag, std::mt19937& rng) {
  Checkpoint c;
  c.fmt = fmt;
  c.N = N;
  c.K = K;
  c.group = is_nvfp4(fmt) ? 16 : (group ? group : K);
  std::uniform_real_distribution<float> u01(0.5f, 1.5f);
  if (is_nvfp4(fmt)) {
    c.packed.resize(size_t(N * K / 2));
    for (auto& b : c.packed) b = uint8_t(rng());
    c.e4m3.resize(size_t(N * cdiv(K, 16)));
    for (auto& b : c.e4m3) b = uint8_t(((4 + rng() % 6) << 3) | (rng() % 8) | ((rng() % 8 == 0) ? 0x80 : 0));
    // code * e4m3 has magnitude ~2 * 2: the global brings it to `mag` (a multiplier, or a divisor for CT)
    const float g = mag / 4.f * 1.0371f;
    c.global = fmt == Fmt::Nvfp4ModelOpt ? g : 1.f / g;
    return c;
  }
  if (is_fp8(fmt)) {  // E4M3 [N, K]; F32 scales per row, one, or per block (any float)
    c.group = fmt == Fmt::Fp8Block && group && group < K ? group : K;
    c.packed.resize(size_t(N * K));
    for (auto& b : c.packed) b = random_e4m3(rng);
    c.scales.resize(fmt == Fmt::Fp8CtRow      ? size_t(N)
                    : fmt == Fmt::Fp8CtTensor ? 1
                                              : size_t(cdiv(N, kFp8BlockRows) * cdiv(K, c.group)));
    static const float rms = float(e4m3_rms());
    for (auto& s : c.scales) s = mag / rms * u01(rng);
    return c;
  }
  if (is_ct_int8(fmt)) {  // int8 [N, K]; F32 scales per row or one (any float: the row scale path)
    c.group = K;
    c.packed.resize(size_t(N * K));
    for (auto& b : c.packed) b = uint8_t(rng());
    c.scales.resize(fmt == Fmt::CtInt8Row ? size_t(N) : 1);
    for (auto& s : c.scales) s = mag / 64.f * u01(rng);  // |q| averages 64
    return c;
  }
  const int64_t G = cdiv(K, c.group);
  const float base = mag / (is_gptq8(fmt) ? 85.f : 4.5f);  // |q - z| averages 85 (8 bits) or 4.5 (4 bits)
  const bool gptq = fmt == Fmt::GptqV1 || fmt == Fmt::GptqV2 || is_gptq8(fmt);
  c.scales.resize(size_t(N * G));
  for (auto& s : c.scales) s = gptq || is_awq(fmt) ? f16_round(base * u01(rng)) : bf16_round(base * u01(rng));
  if (is_awq(fmt)) {  // qweight [K, N/8], qzeros [G, N/8]
    c.words.resize(size_t(K * N / 8));
    if (fmt == Fmt::Awq) c.zwords.resize(size_t(G * N / 8));
  } else if (is_gptq8(fmt)) {  // qweight [K/4, N], qzeros [G, N/4]
    c.words.resize(size_t(K / 4 * N));
    c.zwords.resize(size_t(G * N / 4));
  } else if (gptq) {
    c.words.resize(size_t(K / 8 * N));
    c.zwords.resize(size_t(G * N / 8));
  } else {
    c.words.resize(size_t(N * cdiv(K, 8)));
    if (fmt == Fmt::CtInt4Asym) c.zwords.resize(size_t(cdiv(N, 8) * G));
  }
  for (auto& w : c.words) w = int32_t(rng());
  for (auto& w : c.zwords) w = int32_t(rng());
  return c;
}

// float32 dequantization straight from the checkpoint tensors (quant.h).
std::vector<float> oracle(const Checkpoint& c) {
  const int64_t N = c.N, K = c.K, G = cdiv(K, c.group);
  std::vector<float> w(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / c.group;
      float v = 0;
      switch (c.fmt) {
        case Fmt::Nvfp4ModelOpt:
        case Fmt::Nvfp4Ct: {
          const uint8_t byte = c.packed[size_t(n * (K / 2) + k / 2)];
          const uint32_t code = (k & 1) ? byte >> 4 : byte & 0xf;
          const float a = ref_e2m1(code) * ref_e4m3(c.e4m3[size_t(n * cdiv(K, 16) + k / 16)]);
          v = c.fmt == Fmt::Nvfp4ModelOpt ? a * c.global : a / c.global;
          break;
        }
        case Fmt::CtInt4Sym:
        case Fmt::CtInt4Asym: {
          const uint32_t word = uint32_t(c.words[size_t(n * cdiv(K, 8) + k / 8)]);
          int32_t q = int32_t((word >> (4 * (k % 8))) & 0xfu) - 8;
          if (c.fmt == Fmt::CtInt4Asym) {
            const uint32_t zw = uint32_t(c.zwords[size_t((n / 8) * G + g)]);
            q -= int32_t((zw >> (4 * (n % 8))) & 0xfu) - 8;
          }
          v = float(q) * c.scales[size_t(n * G + g)];
          break;
        }
        case Fmt::GptqV1:
        case Fmt::GptqV2: {
          const uint32_t word = uint32_t(c.words[size_t((k / 8) * N + n)]);
          const int32_t q = int32_t((word >> (4 * (k % 8))) & 0xfu);
          const uint32_t zw = uint32_t(c.zwords[size_t(g * (N / 8) + n / 8)]);
          const int32_t z = int32_t((zw >> (4 * (n % 8))) & 0xfu) + (c.fmt == Fmt::GptqV1 ? 1 : 0);
          v = float(q - z) * c.scales[size_t(g * N + n)];
          break;
        }
        case Fmt::Awq:
        case Fmt::AwqSym: {
          int nib = 0;  // the nibble i with kAwqOrder[i] == n % 8
          while (kAwqOrder[nib] != n % 8) ++nib;
          const uint32_t word = uint32_t(c.words[size_t(k * (N / 8) + n / 8)]);
          const int32_t q = int32_t((word >> (4 * nib)) & 0xfu);
          const int32_t z =
              c.fmt == Fmt::Awq ? int32_t((uint32_t(c.zwords[size_t(g * (N / 8) + n / 8)]) >> (4 * nib)) & 0xfu) : 8;
          v = float(q - z) * c.scales[size_t(g * N + n)];
          break;
        }
        case Fmt::Gptq8V1:
        case Fmt::Gptq8V2: {
          const uint32_t word = uint32_t(c.words[size_t((k / 4) * N + n)]);
          const int32_t q = int32_t((word >> (8 * (k % 4))) & 0xffu);
          const uint32_t zw = uint32_t(c.zwords[size_t(g * (N / 4) + n / 4)]);
          const int32_t z = int32_t((zw >> (8 * (n % 4))) & 0xffu) + (c.fmt == Fmt::Gptq8V1 ? 1 : 0);
          v = float(q - z) * c.scales[size_t(g * N + n)];
          break;
        }
        case Fmt::CtInt8Row:
        case Fmt::CtInt8Tensor:
          v = float(int8_t(c.packed[size_t(n * K + k)])) * c.scales[c.fmt == Fmt::CtInt8Row ? size_t(n) : 0];
          break;
        case Fmt::Fp8CtRow:
        case Fmt::Fp8CtTensor:
          v = ref_e4m3(c.packed[size_t(n * K + k)]) * c.scales[c.fmt == Fmt::Fp8CtRow ? size_t(n) : 0];
          break;
        case Fmt::Fp8Block:
          v = ref_e4m3(c.packed[size_t(n * K + k)]) * c.scales[size_t((n / kFp8BlockRows) * G + g)];
          break;
      }
      w[size_t(n * K + k)] = v;
    }
  }
  return w;
}

// Fills rows [row0, row0 + c.N) of expert e through the public helpers (the unpacking under test).
void set_rows(W4Packed& p, int e, int row0, const Checkpoint& c) {
  if (is_nvfp4(c.fmt)) {
    p.set_rows(e, row0, Nvfp4Source{c.N, c.K, c.packed.data(), c.e4m3.data(), c.global, c.fmt == Fmt::Nvfp4Ct});
    return;
  }
  if (is_fp8(c.fmt)) {
    p.set_rows(e, row0,
               c.fmt == Fmt::Fp8Block
                   ? unpack_fp8_block(c.packed.data(), c.scales.data(), c.N, c.K, kFp8BlockRows, c.group)
                   : unpack_ct_fp8(c.packed.data(), c.scales.data(), c.fmt == Fmt::Fp8CtRow, c.N, c.K));
    return;
  }
  if (planes(c.fmt) == 2) {
    const Int8Plain p8 = is_gptq8(c.fmt) ? unpack_gptq_int8(c.words.data(), c.zwords.data(), c.scales.data(), c.N, c.K,
                                                            c.group, c.fmt == Fmt::Gptq8V2)
                                         : unpack_ct_int8(reinterpret_cast<const int8_t*>(c.packed.data()),
                                                          c.scales.data(), c.fmt == Fmt::CtInt8Row, c.N, c.K);
    std::vector<float> row_scale;
    const Int4Plain both = int8_planes(p8, &row_scale);
    Int4Source src = both.source();
    src.row_scale = row_scale.empty() ? nullptr : row_scale.data();
    p.set_rows(e, row0, src);
    return;
  }
  Int4Plain plain;
  if (is_awq(c.fmt)) {
    plain =
        unpack_awq(c.words.data(), c.zwords.empty() ? nullptr : c.zwords.data(), c.scales.data(), c.N, c.K, c.group);
  } else if (c.fmt == Fmt::GptqV1 || c.fmt == Fmt::GptqV2) {
    plain = unpack_gptq(c.words.data(), c.zwords.data(), c.scales.data(), c.N, c.K, c.group, c.fmt == Fmt::GptqV2);
  } else {
    plain = unpack_ct_int4(c.words.data(), c.zwords.empty() ? nullptr : c.zwords.data(), c.scales.data(), c.N, c.K,
                           c.group);
  }
  p.set_rows(e, row0, plain.source());
}

W4Packed make_packed(Fmt f, int experts, int rows, int cols, int group) {
  if (is_fp8(f))  // one group a row unless the block format's blocks divide it
    return W4Packed(W4Format::Fp8, experts, rows, cols, f == Fmt::Fp8Block && group < cols ? group : 0, false);
  if (planes(f) == 2)  // [rows, 2 cols], groups of `group` (or a row's) inputs, zero points
    return W4Packed(W4Format::Int4, experts, rows, 2 * cols, is_ct_int8(f) || !group ? cols : group, true);
  return W4Packed(is_nvfp4(f) ? W4Format::Nvfp4 : W4Format::Int4, experts, rows, cols, is_nvfp4(f) ? 16 : group,
                  has_zeros(f));
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      if (!bad) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values differ; first at " << first << ": "
                     << got[first] << " vs " << want[first];
}

// ------------------------------------------------------------------ repacking is lossless

struct RepackCase {
  Fmt fmt;
  int group, rows, cols;
};

class W4Repack : public ::testing::TestWithParam<RepackCase> {};

TEST_P(W4Repack, UnpackEqualsCheckpointDequantBitForBit) {
  const auto p = GetParam();
  std::mt19937 rng(11);
  const int E = 3;
  W4Packed packed = make_packed(p.fmt, E, 2 * p.rows, p.cols, p.group);
  std::vector<std::vector<float>> want(E);
  for (int e = 0; e < E; ++e) {
    // Two row ranges per expert from two checkpoint tensors of different magnitude (a fused gate_up).
    const Checkpoint a = make_checkpoint(p.fmt, p.rows, p.cols, p.group, 0.05f, rng);
    const Checkpoint b = make_checkpoint(p.fmt, p.rows, p.cols, p.group, 3e-4f, rng);
    set_rows(packed, e, 0, a);
    set_rows(packed, e, p.rows, b);
    want[e] = oracle(a);
    const auto wb = oracle(b);
    want[e].insert(want[e].end(), wb.begin(), wb.end());
  }
  for (int e = 0; e < E; ++e) expect_bits_equal(packed.unpack(e), want[e], "expert " + std::to_string(e));
}

INSTANTIATE_TEST_SUITE_P(Formats, W4Repack,
                         ::testing::Values(
                             RepackCase{Fmt::Nvfp4ModelOpt, 16, 40, 200}, RepackCase{Fmt::Nvfp4Ct, 16, 40, 200},
                             RepackCase{Fmt::Nvfp4ModelOpt, 16, 16, 40}, RepackCase{Fmt::CtInt4Sym, 32, 24, 200},
                             RepackCase{Fmt::CtInt4Asym, 32, 20, 160}, RepackCase{Fmt::CtInt4Asym, 128, 24, 200},
                             RepackCase{Fmt::CtInt4Sym, 128, 8, 40}, RepackCase{Fmt::GptqV1, 32, 40, 200},
                             RepackCase{Fmt::GptqV2, 32, 16, 40}, RepackCase{Fmt::GptqV1, 128, 24, 256},
                             RepackCase{Fmt::GptqV2, 128, 40, 200}, RepackCase{Fmt::GptqV1, 0, 16, 64},
                             RepackCase{Fmt::Awq, 32, 24, 160}, RepackCase{Fmt::Awq, 128, 40, 256},
                             RepackCase{Fmt::AwqSym, 32, 16, 64}, RepackCase{Fmt::Awq, 0, 16, 64},
                             RepackCase{Fmt::Awq, 64, 8, 192}, RepackCase{Fmt::Fp8CtRow, 0, 24, 200},
                             RepackCase{Fmt::Fp8CtTensor, 0, 16, 40}, RepackCase{Fmt::Fp8Block, 128, 40, 200},
                             RepackCase{Fmt::Fp8Block, 32, 24, 168}, RepackCase{Fmt::Fp8Block, 0, 16, 64}),
                         [](const auto& info) {
                           return std::string(fmt_name(info.param.fmt)) + "_g" + std::to_string(info.param.group) +
                                  "_" + std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
                         });

// 8-bit weights as two planes: expert e's unpacked [2 rows, 2 cols] matrix holds the high plane in columns
// [0, cols) and the low one in [cols, 2 cols); their sum is the checkpoint's dequantized weight.
class W8Repack : public ::testing::TestWithParam<RepackCase> {};

TEST_P(W8Repack, PlanesAddUpToCheckpointDequant) {
  const auto p = GetParam();
  std::mt19937 rng(17);
  const int E = 2, C = p.cols;
  W4Packed packed = make_packed(p.fmt, E, 2 * p.rows, C, p.group);
  for (int e = 0; e < E; ++e) {
    const Checkpoint a = make_checkpoint(p.fmt, p.rows, C, p.group, 0.05f, rng);
    const Checkpoint b = make_checkpoint(p.fmt, p.rows, C, p.group, 3e-4f, rng);
    set_rows(packed, e, 0, a);
    set_rows(packed, e, p.rows, b);
    std::vector<float> want = oracle(a);
    const auto wb = oracle(b);
    want.insert(want.end(), wb.begin(), wb.end());
    const std::vector<float> got = packed.unpack(e);
    size_t bad = 0;
    for (int n = 0; n < 2 * p.rows; ++n) {
      for (int k = 0; k < C; ++k) {
        const double hi = got[size_t(n) * 2 * C + k], lo = got[size_t(n) * 2 * C + C + k];
        const double w = want[size_t(n) * C + k];
        if (std::fabs(hi + lo - w) > std::ldexp(std::fabs(hi) + std::fabs(lo) + std::fabs(w), -22)) {
          if (bad++ < 3)
            ADD_FAILURE() << "expert " << e << " row " << n << " input " << k << ": " << hi << " + " << lo << " vs "
                          << w;
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "expert " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, W8Repack,
                         ::testing::Values(RepackCase{Fmt::Gptq8V1, 32, 40, 256},
                                           RepackCase{Fmt::Gptq8V2, 128, 16, 256}, RepackCase{Fmt::Gptq8V1, 0, 8, 64},
                                           RepackCase{Fmt::Gptq8V2, 32, 24, 160},
                                           RepackCase{Fmt::CtInt8Row, 0, 24, 200},
                                           RepackCase{Fmt::CtInt8Tensor, 0, 16, 40}),
                         [](const auto& info) {
                           return std::string(fmt_name(info.param.fmt)) + "_g" + std::to_string(info.param.group) +
                                  "_" + std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
                         });

// int8_planes on every value and the extreme zero points: 16 (q_hi - z_hi) + (q_lo - z_lo) = q - z, and the
// scales: 16 s / s with groups, 16 / 1 and the row scale s with one group a row.
TEST(W8Repack, PlanesOfEveryValue) {
  for (const uint16_t z : {uint16_t(0), uint16_t(128), uint16_t(255), uint16_t(256)}) {
    Int8Plain p;
    p.rows = 1;
    p.cols = 256;
    p.group = 128;
    for (int q = 0; q < 256; ++q) p.q.push_back(uint8_t(q));
    p.zeros = {z, uint16_t(256 - z)};
    p.scales = {0.375f, 0.0078125f};
    std::vector<float> rs(3, 7.f);
    const Int4Plain r = int8_planes(p, &rs);
    EXPECT_TRUE(rs.empty());
    ASSERT_EQ(r.cols, 512);
    ASSERT_EQ(r.group, 128);
    for (int k = 0; k < 256; ++k) {
      const int g = k / 128, zz = p.zeros[size_t(g)];
      EXPECT_EQ(16 * (int(r.q[size_t(k)]) - int(r.zeros[size_t(g)])) +
                    (int(r.q[size_t(256 + k)]) - int(r.zeros[size_t(2 + g)])),
                k - zz)
          << "q " << k << " z " << zz;
      EXPECT_LE(r.zeros[size_t(g)], 16);
      EXPECT_LE(r.q[size_t(k)], 15);
    }
    EXPECT_EQ(r.scales, (std::vector<float>{6.f, 0.125f, 0.375f, 0.0078125f}));
  }
  const std::vector<int8_t> w = {-128, -1, 0, 127, 5, 6, 7, 8};
  const float s = 0.1f;  // not exact in FP16: kept as the row scale
  std::vector<float> rs;
  const Int4Plain r = int8_planes(unpack_ct_int8(w.data(), &s, false, 1, 8), &rs);
  EXPECT_EQ(rs, std::vector<float>{0.1f});
  EXPECT_EQ(r.scales, (std::vector<float>{16.f, 1.f}));
  for (int k = 0; k < 8; ++k)
    EXPECT_EQ(16 * (int(r.q[size_t(k)]) - int(r.zeros[0])) + (int(r.q[size_t(8 + k)]) - int(r.zeros[1])),
              int(w[size_t(k)]));
  W4Packed packed(W4Format::Int4, 1, 1, 16, 8, true);
  Int4Source src = r.source();
  src.row_scale = rs.data();
  packed.set_rows(0, 0, src);
  const auto got = packed.unpack(0);
  for (int k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(got[size_t(k)] + got[size_t(8 + k)], float(w[size_t(k)]) * s) << k;
  // Bad input: a group that does not divide the inputs, a zero point past 256, a non-finite row scale.
  Int8Plain bad;
  bad.rows = 1;
  bad.cols = 24;
  bad.group = 16;
  bad.q.assign(24, 1);
  bad.scales = {1.f, 1.f};
  EXPECT_THROW(int8_planes(bad, &rs), Error);
  bad.group = 8;
  bad.scales = {1.f, 1.f, 1.f};
  bad.zeros = {1, 257, 3};
  EXPECT_THROW(int8_planes(bad, &rs), Error);
  const float inf = INFINITY;
  const Int4Plain r2 = int8_planes(unpack_ct_int8(w.data(), &inf, false, 1, 8), &rs);
  src = r2.source();
  src.row_scale = rs.data();
  EXPECT_THROW(packed.set_rows(0, 0, src), Error);
}

// A 2- or 3-bit GPTQ matrix in a block held as planes: int8_from_int4 keeps q and z (v1 zeros up to 2^bits),
// its high plane is zero, and the planes add up to (q - z) s.
TEST(W8Repack, FourBitMatricesBesideEightBitOnes) {
  std::mt19937 rng(5);
  for (const int bits : {2, 3}) {
    const int64_t N = 32, K = 64, group = 32, G = K / group;
    std::vector<int32_t> qweight(size_t(K * bits / 32 * N)), qzeros(size_t(G * N * bits / 32));
    for (auto& w : qweight) w = int32_t(rng());
    for (auto& w : qzeros) w = int32_t(rng()) | int32_t(0x49249249u);  // many maximal codes: v1 zeros reach 2^bits
    std::vector<float> scales(size_t(G * N));
    for (auto& v : scales) v = f16_round(0.01f * float(1 + rng() % 100));
    const Int4Plain p4 = unpack_gptq(qweight.data(), qzeros.data(), scales.data(), N, K, group, false, bits);
    std::vector<float> rs;
    const Int4Plain both = int8_planes(int8_from_int4(p4), &rs);
    EXPECT_TRUE(rs.empty());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k / group;
        EXPECT_EQ(both.q[size_t(n * 2 * K + k)], 0);
        EXPECT_EQ(both.zeros[size_t(n * 2 * G + g)], p4.zeros[size_t(n * G + g)] >> 4);
        const int hi = int(both.q[size_t(n * 2 * K + k)]) - int(both.zeros[size_t(n * 2 * G + g)]);
        const int lo = int(both.q[size_t(n * 2 * K + K + k)]) - int(both.zeros[size_t(n * 2 * G + G + g)]);
        ASSERT_EQ(16 * hi + lo, int(p4.q[size_t(n * K + k)]) - int(p4.zeros[size_t(n * G + g)])) << n << " " << k;
      }
  }
}

TEST(W4Repack, EveryE4m3AndE2m1CodeIsExact) {
  // All 256 x 16 (scale, code) pairs except the E4M3 NaNs, as one row each of 16 equal codes.
  std::vector<uint8_t> bytes, scales;
  for (int s = 0; s < 256; ++s) {
    if ((s & 0x7f) == 0x7f) continue;
    for (int c = 0; c < 16; ++c) {
      scales.push_back(uint8_t(s));
      bytes.insert(bytes.end(), 8, uint8_t(c | (c << 4)));
    }
  }
  const int rows = int(scales.size());
  W4Packed p(W4Format::Nvfp4, 1, rows, 16, 16, false);
  p.set_rows(0, 0, Nvfp4Source{rows, 16, bytes.data(), scales.data(), 0.3f, false});
  const auto got = p.unpack(0);
  for (int r = 0; r < rows; ++r) {
    const float want = ref_e2m1(bytes[size_t(r) * 8] & 0xf) * ref_e4m3(scales[size_t(r)]) * 0.3f;
    for (int k = 0; k < 16; ++k) ASSERT_EQ(got[size_t(r) * 16 + k], want) << "row " << r;
  }
}

TEST(W4Repack, BadInputIsAnError) {
  std::vector<uint8_t> q(64, 3), z(2, 8), bad_q(64, 16), bad_z(2, 17);
  std::vector<float> s = {0.0078125f, 0.01171875f}, inexact = {1.f, 1.f + 1.f / 4096};
  W4Packed sym(W4Format::Int4, 1, 1, 64, 32, false), asym(W4Format::Int4, 1, 1, 64, 32, true);
  EXPECT_THROW(sym.set_rows(0, 0, Int4Source{1, 64, 32, q.data(), s.data(), z.data()}), Error);  // zeros, none made
  EXPECT_THROW(sym.set_rows(0, 0, Int4Source{1, 64, 32, bad_q.data(), s.data(), nullptr}), Error);
  EXPECT_THROW(asym.set_rows(0, 0, Int4Source{1, 64, 32, q.data(), s.data(), bad_z.data()}), Error);
  EXPECT_THROW(sym.set_rows(0, 0, Int4Source{1, 64, 32, q.data(), inexact.data(), nullptr}), Error);  // 13 bits
  EXPECT_THROW(sym.set_rows(0, 0, Int4Source{1, 64, 128, q.data(), s.data(), nullptr}), Error);       // group
  EXPECT_THROW(sym.set_rows(0, 1, Int4Source{1, 64, 32, q.data(), s.data(), nullptr}), Error);        // row range
  EXPECT_THROW(W4Packed(W4Format::Int4, 1, 1, 60, 32, false), Error);                                 // cols % 8
  EXPECT_THROW(W4Packed(W4Format::Nvfp4, 1, 1, 64, 32, false), Error);                                // NVFP4 group
  std::vector<uint8_t> codes(32, 0x21), e4(4, 0x38), nan_e4 = {0x38, 0x7f, 0x38, 0x38};
  W4Packed fp4(W4Format::Nvfp4, 1, 2, 64, 16, false);
  EXPECT_THROW(fp4.set_rows(0, 0, Nvfp4Source{1, 64, codes.data(), nan_e4.data(), 1.f, false}), Error);
  fp4.set_rows(0, 0, Nvfp4Source{1, 64, codes.data(), e4.data(), 1.f, false});
  EXPECT_THROW(fp4.set_rows(0, 1, Nvfp4Source{1, 64, codes.data(), e4.data(), 2.f, true}), Error);  // mixed kinds
  EXPECT_THROW(fp4.set_rows(0, 0, Int4Source{1, 64, 16, q.data(), s.data(), nullptr}), Error);      // wrong format
  sym.set_rows(0, 0, Int4Source{1, 64, 32, q.data(), s.data(), nullptr});  // and a good one passes
  // FP8: a NaN code (either sign), a group the matrix was not made for, FP8 rows to a 4-bit matrix and 4-bit rows to
  // an FP8 one, zero points, a non-finite scale or row scale.
  const std::vector<uint8_t> f8(64, 0x38);
  const float one = 1.f;
  Fp8Plain good = unpack_ct_fp8(f8.data(), &one, false, 1, 64);
  W4Packed fp8(W4Format::Fp8, 1, 1, 64, 0, false);
  for (const uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
    Fp8Plain bad = good;
    bad.q[37] = nan;
    EXPECT_THROW(fp8.set_rows(0, 0, bad), Error);
  }
  const std::vector<float> two = {1.f, 2.f};
  EXPECT_THROW(fp8.set_rows(0, 0, unpack_fp8_block(f8.data(), two.data(), 1, 64, 1, 32)), Error);  // group 32
  EXPECT_THROW(sym.set_rows(0, 0, good), Error);
  EXPECT_THROW(fp8.set_rows(0, 0, Int4Source{1, 64, 0, q.data(), s.data(), nullptr}), Error);
  EXPECT_THROW(W4Packed(W4Format::Fp8, 1, 1, 64, 0, true), Error);
  for (const float v : {INFINITY, NAN}) {
    Fp8Plain bad = good;
    bad.scales[0] = v;
    EXPECT_THROW(fp8.set_rows(0, 0, bad), Error);
    bad = good;
    bad.row_scale[0] = v;
    EXPECT_THROW(fp8.set_rows(0, 0, bad), Error);
  }
  fp8.set_rows(0, 0, good);  // and a good one passes
}

// A tensor-parallel rank's rows of an FP8 block matrix whose inputs end in a partial block (200 = 128 + 72): the
// slice keeps the partial last group, and columns that stop short of the end must tile the groups.
TEST(W4Repack, Fp8SliceKeepsAPartialLastBlock) {
  std::mt19937 rng(21);
  const Checkpoint c = make_checkpoint(Fmt::Fp8Block, 64, 200, 128, 0.05f, rng);
  const Fp8Plain all = unpack_fp8_block(c.packed.data(), c.scales.data(), 64, 200, kFp8BlockRows, 128);
  const Fp8Plain rows = slice_fp8(all, 32, 32, 0, 200, 128);
  W4Packed packed(W4Format::Fp8, 1, 32, 200, 128, false);
  packed.set_rows(0, 0, rows);
  const std::vector<float> want = oracle(c);
  expect_bits_equal(packed.unpack(0), std::vector<float>(want.begin() + 32 * 200, want.end()), "rows [32, 64)");
  EXPECT_THROW(slice_fp8(all, 0, 64, 0, 192, 128), Error);  // 192 columns: 1.5 groups, not at the end
  const Fp8Plain cols = slice_fp8(all, 0, 64, 128, 72, 8);  // the partial block alone, in groups of 8
  ASSERT_EQ(cols.scales.size(), 64u * 9);
  for (size_t n = 0; n < 64; ++n)
    for (size_t j = 0; j < 9; ++j) EXPECT_EQ(cols.scales[n * 9 + j], all.scales[n * 2 + 1]) << n << " " << j;
}

// Every E4M3 byte but the NaNs through the FP8 layout: unpack gives e4m3 * scale, for a per-row scale of any bits
// (compressed-tensors) and block scales of any bits (the block format), bit for bit.
TEST(W4Repack, EveryE4m3WeightIsExact) {
  std::vector<uint8_t> q;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) q.push_back(uint8_t(b));
  ASSERT_EQ(q.size(), 254u);
  q.resize(256, 0x00);  // two zero inputs more: two groups of 128
  const float rs = 0.1f;
  W4Packed a(W4Format::Fp8, 1, 1, 256, 0, false);
  a.set_rows(0, 0, unpack_ct_fp8(q.data(), &rs, true, 1, 256));
  const std::vector<float> block = {3.3e-3f, 7.77f};
  W4Packed b(W4Format::Fp8, 1, 1, 256, 128, false);
  b.set_rows(0, 0, unpack_fp8_block(q.data(), block.data(), 1, 256, 128, 128));
  const auto ga = a.unpack(0), gb = b.unpack(0);
  for (int64_t k = 0; k < 256; ++k) {
    ASSERT_EQ(ga[size_t(k)], ref_e4m3(q[size_t(k)]) * rs) << "byte " << int(q[size_t(k)]);
    ASSERT_EQ(gb[size_t(k)], ref_e4m3(q[size_t(k)]) * block[size_t(k / 128)]) << "byte " << int(q[size_t(k)]);
  }
}

// Auto's choice of the grouped GEMV: where the slots are at least 1.25 times the experts uniform routing touches,
// E (1 - (1 - k/E)^T) (moe_w4a16.h kW4GroupMinMeanX4), and only where the grouped kernels can run.
TEST(W4Path, AutoGroupsTheGemvWhereSlotsShareExperts) {
  // 512 experts, top-10: 16 tokens touch 138.6 (160 slots: 1.15 a touched expert), 24 touch 193.1 (1.24), 32 touch
  // 239.6 (1.34); 256 experts: 8 tokens touch 69.9 (1.14), 16 touch 120.7 (1.33).
  EXPECT_EQ(moe_w4a16_pick_path(1, 10, 512, true, true), W4Path::Gemv);
  EXPECT_EQ(moe_w4a16_pick_path(16, 10, 512, true, true), W4Path::Gemv);
  EXPECT_EQ(moe_w4a16_pick_path(24, 10, 512, true, true), W4Path::Gemv);
  EXPECT_EQ(moe_w4a16_pick_path(32, 10, 512, true, true), W4Path::GemvGrouped);
  EXPECT_EQ(moe_w4a16_pick_path(8, 10, 256, true, true), W4Path::Gemv);
  EXPECT_EQ(moe_w4a16_pick_path(16, 10, 256, true, true), W4Path::GemvGrouped);
  EXPECT_EQ(moe_w4a16_pick_path(32, 10, 512, true, false), W4Path::Gemv);    // the grouped kernels cannot run
  EXPECT_EQ(moe_w4a16_pick_path(32, 10, 512, false, false), W4Path::Gemm);   // FP32-FMA GEMV limits: 320 > 160 slots
  EXPECT_EQ(moe_w4a16_pick_path(256, 10, 512, true, true), W4Path::Gemm);    // 2,560 slots: past the GEMV's 1,280
  EXPECT_EQ(moe_w4a16_pick_path(4, 1, 1, true, true), W4Path::Gemm);         // 4 slots of one expert: mean 4 > 2.5
  EXPECT_EQ(moe_w4a16_pick_path(2, 1, 1, true, true), W4Path::GemvGrouped);  // 2 slots of one expert: 2 >= 1.25
}

// ------------------------------------------------------------------ kernels vs a CPU loop

struct MoeCase {
  int experts, top_k, tokens, hidden, inter;
  bool shared;
};

struct FmtCase {
  Fmt fmt;
  int group;
};

class W4Moe : public ::testing::TestWithParam<std::tuple<FmtCase, MoeCase>> {};

// "<format>_g<group>_E<experts>_k<top_k>_T<tokens>[_H<hidden>_I<inter>][_shared]"
std::string moe_case_name(const std::tuple<FmtCase, MoeCase>& param, bool with_widths) {
  const auto& [f, m] = param;
  return std::string(fmt_name(f.fmt)) + "_g" + std::to_string(f.group) + "_E" + std::to_string(m.experts) + "_k" +
         std::to_string(m.top_k) + "_T" + std::to_string(m.tokens) +
         (with_widths ? "_H" + std::to_string(m.hidden) + "_I" + std::to_string(m.inter) : "") +
         (m.shared ? "_shared" : "");
}

TEST_P(W4Moe, BothPathsMatchReference) {
  const auto [fc, p] = GetParam();
  const int E = p.experts, H = p.hidden, I = p.inter, T = p.tokens, k = p.top_k;
  ASSERT_LE(k, E) << "a case picks more experts per token than it has";
  std::mt19937 rng(uint32_t(E * 1000 + k * 100 + T + H + I));
  const int P = planes(fc.fmt);
  W4Packed gu = make_packed(fc.fmt, E, 2 * I, H, fc.group), dn = make_packed(fc.fmt, E, H, I, fc.group);
  std::vector<std::vector<float>> wgu(E), wdn(E);
  for (int e = 0; e < E; ++e) {
    const float mg = 1.f / std::sqrt(float(H)), md = 0.5f / std::sqrt(float(I));  // outputs ~0.1-0.5
    const Checkpoint gate = make_checkpoint(fc.fmt, I, H, fc.group, mg, rng);
    const Checkpoint up = make_checkpoint(fc.fmt, I, H, fc.group, mg * 0.7f, rng);
    const Checkpoint down = make_checkpoint(fc.fmt, H, I, fc.group, md, rng);
    set_rows(gu, e, 0, gate);
    set_rows(gu, e, I, up);
    set_rows(dn, e, 0, down);
    wgu[e] = oracle(gate);
    const auto wu = oracle(up);
    wgu[e].insert(wgu[e].end(), wu.begin(), wu.end());
    wdn[e] = oracle(down);
  }
  const W4DeviceMatrix dgu(gu), ddn(dn);
  const MoeW4A16Experts experts{&dgu, &ddn, E, H, I, P};

  const auto u = rand_f16_values(size_t(T) * H, 7);
  std::vector<int32_t> ids(size_t(T) * k);
  std::vector<float> wts(size_t(T) * k);
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_real_distribution<float> uw(0.1f, 1.f);
  for (int t = 0; t < T; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += (wts[size_t(t) * k + j] = uw(rng));
    for (int j = 0; j < k; ++j) {
      ids[size_t(t) * k + j] = perm[j];
      wts[size_t(t) * k + j] /= sum;
    }
  }
  // The gated shared expert's term (FP32), added last.
  const auto sh = rand_f16_values(size_t(T) * H, 9, -0.5f, 0.5f);

  // Reference in double: no roundings.
  std::vector<float> ref(size_t(T) * H);
  std::vector<double> hbuf(I), acc(H);
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* x = &u[size_t(t) * H];
    for (int j = 0; j < k; ++j) {
      const int e = ids[size_t(t) * k + j];
      for (int n = 0; n < I; ++n) {
        double g = 0, v = 0;
        const float* wg = &wgu[e][size_t(n) * H];
        const float* wu = &wgu[e][size_t(I + n) * H];
        for (int c = 0; c < H; ++c) {
          g += double(wg[c]) * x[c];
          v += double(wu[c]) * x[c];
        }
        hbuf[n] = g / (1.0 + std::exp(-g)) * v;
      }
      for (int c = 0; c < H; ++c) {
        double y = 0;
        const float* wd = &wdn[e][size_t(c) * I];
        for (int n = 0; n < I; ++n) y += double(wd[n]) * hbuf[n];
        acc[c] += double(wts[size_t(t) * k + j]) * y;
      }
    }
    for (int c = 0; c < H; ++c) {
      if (p.shared) acc[c] += sh[size_t(t) * H + c];
      ref[size_t(t) * H + c] = float(acc[c]);
    }
  }

  auto du = dev_half(u);
  auto dids = to_device(ids);
  auto dw = to_device(wts), dsh = to_device(sh);
  MoeW4A16Workspace ws(T, k, E, H, I, P);
  DeviceArray<__half> out(size_t(T) * H, "out");
  DeviceArray<float> out32(size_t(T) * H, "out32");
  std::vector<float> gemv_out;
  for (W4Path path : {W4Path::Gemv, W4Path::GemvGrouped, W4Path::GemvFma, W4Path::Gemm, W4Path::GemmWmma}) {
    moe_w4a16_routed(experts, du.get(), H, T, dids.get(), dw.get(), p.shared ? dsh.get() : nullptr, nullptr, out.get(),
                     H, ws, nullptr, path);
    sync();
    const std::vector<float> got = host_half(out.get(), size_t(T) * H);
    expect_close(got, ref, 3e-3f, 1e-2f,
                 path == W4Path::Gemv          ? "GEMV path (tensor cores where the GPU has them)"
                 : path == W4Path::GemvGrouped ? "grouped GEMV path (the GEMV path where it cannot run)"
                 : path == W4Path::GemvFma     ? "GEMV path, FP32 FMA"
                 : path == W4Path::Gemm        ? "GEMM path (mma.sync where the GPU has it)"
                                               : "GEMM path, WMMA");
    // The grouped GEMV computes each slot's column as the one-slot GEMV does: the same bits.
    if (path == W4Path::Gemv) gemv_out = got;
    if (path == W4Path::GemvGrouped)
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], gemv_out[i]) << "grouped GEMV output " << i << " differs from the GEMV's";
  }
  // The shared term written on another stream meanwhile, ready at an event that the routed call waits for.
  cudaStream_t other = nullptr;
  cudaEvent_t ready = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  DeviceArray<float> dsh2(sh.size(), "shared on another stream");
  ASSERT_EQ(cudaMemsetAsync(dsh2.get(), 0, sh.size() * sizeof(float), other), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dsh2.get(), sh.data(), sh.size() * sizeof(float), cudaMemcpyHostToDevice, other),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ready, other), cudaSuccess);
  moe_w4a16_routed(experts, du.get(), H, T, dids.get(), dw.get(), p.shared ? dsh2.get() : nullptr,
                   p.shared ? ready : nullptr, out32.get(), H, ws, nullptr);
  moe_w4a16_check_status(ws, nullptr);
  cudaEventDestroy(ready);
  cudaStreamDestroy(other);
  expect_close(download(out32.get(), size_t(T) * H), ref, 3e-3f, 1e-2f, "auto path, FP32 output");
  // FP32 activations where the tensor-core GEMV takes them: bit for bit the result on their FP16 copy (u scaled off
  // the FP16 grid, so that the staging has to round).
  if (moe_w4a16_routed_takes_f32(experts, T, k)) {
    std::vector<float> u32(u.size()), u16(u.size());
    for (size_t i = 0; i < u.size(); ++i) {
      u32[i] = u[i] * (1.f + 3e-4f);
      u16[i] = f16_round(u32[i]);
    }
    auto du32 = to_device(u32);
    auto du16 = dev_half(u16);
    DeviceArray<float> from16(size_t(T) * H, "out from FP16"), from32(size_t(T) * H, "out from FP32");
    moe_w4a16_routed(experts, du16.get(), H, T, dids.get(), dw.get(), nullptr, nullptr, from16.get(), H, ws, nullptr);
    moe_w4a16_routed(experts, du32.get(), H, T, dids.get(), dw.get(), nullptr, nullptr, from32.get(), H, ws, nullptr);
    sync();
    const auto a = download(from16.get(), size_t(T) * H), b = download(from32.get(), size_t(T) * H);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "output " << i << " of FP32 activations";
  }
}

// The shapes of the 4-bit and FP8 formats.
const std::vector<MoeCase> kShapes = {
    MoeCase{1, 1, 1, 256, 160, false}, MoeCase{1, 1, 1000, 200, 40, true}, MoeCase{3, 2, 2, 256, 40, false},
    MoeCase{3, 2, 17, 200, 160, true}, MoeCase{3, 1, 1000, 256, 160, false}, MoeCase{16, 10, 5, 256, 160, true},
    MoeCase{16, 2, 16, 200, 40, false}, MoeCase{16, 10, 100, 200, 160, false}, MoeCase{33, 10, 1, 200, 40, false},
    MoeCase{33, 10, 17, 256, 160, false}, MoeCase{33, 2, 100, 256, 40, true}, MoeCase{33, 10, 1000, 256, 160, true},
    // rows of more than 4,096 inputs: the tensor-core GEMV stages the rest of the activations past its registers'
    // share
    MoeCase{3, 2, 3, 4352, 40, true},
    // the mma.sync GEMM over an odd number of 128-input stages (3 and 3, the last one partial), 17 slots an expert
    MoeCase{9, 4, 40, 384, 328, true}};

INSTANTIATE_TEST_SUITE_P(Shapes, W4Moe,
                         ::testing::Combine(::testing::Values(FmtCase{Fmt::Nvfp4ModelOpt, 16},
                                                              FmtCase{Fmt::Nvfp4Ct, 16}, FmtCase{Fmt::CtInt4Sym, 32},
                                                              FmtCase{Fmt::GptqV1, 32}, FmtCase{Fmt::CtInt4Asym, 128},
                                                              FmtCase{Fmt::GptqV2, 128}),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) { return moe_case_name(info.param, true); });

// FP8 experts as bytes (the FP32-FMA GEMV and the WMMA GEMM on every GPU; the Gemv and Gemm paths take them too):
// per-row scales, and blocks of 128 inputs (a partial last block at H 200 and 384, one block a row at I 40), over the
// shapes above; per-tensor scales over a few.
INSTANTIATE_TEST_SUITE_P(Fp8Shapes, W4Moe,
                         ::testing::Combine(::testing::Values(FmtCase{Fmt::Fp8CtRow, 0}, FmtCase{Fmt::Fp8Block, 128}),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) { return moe_case_name(info.param, true); });
// Blocks of 40 inputs: a scale looked up per word of 4 inputs (not a multiple of 16), several a row.
INSTANTIATE_TEST_SUITE_P(Fp8Block40Shapes, W4Moe,
                         ::testing::Combine(::testing::Values(FmtCase{Fmt::Fp8Block, 40}),
                                            ::testing::Values(MoeCase{1, 1, 1, 200, 160, false},
                                                              MoeCase{3, 2, 17, 200, 160, true},
                                                              MoeCase{16, 10, 100, 200, 160, false})),
                         [](const auto& info) { return moe_case_name(info.param, true); });
INSTANTIATE_TEST_SUITE_P(Fp8TensorShapes, W4Moe,
                         ::testing::Combine(::testing::Values(FmtCase{Fmt::Fp8CtTensor, 0}),
                                            ::testing::Values(MoeCase{1, 1, 1, 256, 160, false},
                                                              MoeCase{16, 10, 100, 200, 160, false},
                                                              MoeCase{33, 10, 1000, 256, 160, true})),
                         [](const auto& info) { return moe_case_name(info.param, true); });

// 8-bit experts as two planes (groups must divide H and I: g32 over H 256 / I 160, g128 over H 256 / I 128; one
// group a row at any width, past 4,096 inputs a plane and the odd GEMM stage counts included).
INSTANTIATE_TEST_SUITE_P(
    Int8Shapes, W4Moe,
    ::testing::Combine(::testing::Values(FmtCase{Fmt::Gptq8V1, 32}, FmtCase{Fmt::CtInt8Row, 0}),
                       ::testing::Values(MoeCase{1, 1, 1, 256, 160, false}, MoeCase{3, 1, 1000, 256, 160, false},
                                         MoeCase{16, 10, 5, 256, 160, true}, MoeCase{16, 10, 100, 256, 160, false},
                                         MoeCase{33, 10, 17, 256, 160, false}, MoeCase{33, 10, 1000, 256, 160, true})),
    [](const auto& info) { return moe_case_name(info.param, false); });
INSTANTIATE_TEST_SUITE_P(
    Int8OddShapes, W4Moe,
    ::testing::Combine(::testing::Values(FmtCase{Fmt::Gptq8V2, 128}, FmtCase{Fmt::CtInt8Tensor, 0}),
                       ::testing::Values(MoeCase{3, 2, 2, 256, 128, false}, MoeCase{16, 10, 100, 256, 128, true})),
    [](const auto& info) { return moe_case_name(info.param, false); });
INSTANTIATE_TEST_SUITE_P(Int8RowShapes, W4Moe,
                         ::testing::Combine(::testing::Values(FmtCase{Fmt::CtInt8Row, 0}),
                                            ::testing::Values(MoeCase{1, 1, 1000, 200, 40, true},
                                                              MoeCase{3, 2, 3, 4352, 40, true},
                                                              MoeCase{9, 4, 40, 384, 328, true})),
                         [](const auto& info) { return moe_case_name(info.param, true); });

// AWQ groups must divide H and I: the H 256 / I 160 shapes with group 32.
INSTANTIATE_TEST_SUITE_P(
    AwqShapes, W4Moe,
    ::testing::Combine(::testing::Values(FmtCase{Fmt::Awq, 32}, FmtCase{Fmt::AwqSym, 32}),
                       ::testing::Values(MoeCase{1, 1, 1, 256, 160, false}, MoeCase{3, 1, 1000, 256, 160, false},
                                         MoeCase{16, 10, 5, 256, 160, true}, MoeCase{16, 10, 100, 256, 160, false},
                                         MoeCase{33, 10, 17, 256, 160, false}, MoeCase{33, 10, 1000, 256, 160, true})),
    [](const auto& info) { return moe_case_name(info.param, false); });

// unpack_awq against hand-computed words (the format definition, not the oracle above): word 0x76543210 (nibble i
// holds i) gives outputs 0..7 the values 0 4 1 5 2 6 3 7; zero word 0x00000030 gives output 2 (AWQ_ORDER[1]) zero 3.
TEST(W4Repack, AwqUnpackHandComputedWord) {
  const std::vector<int32_t> qweight(8, int32_t(0x76543210u)), qzeros = {int32_t(0x30u)};
  const std::vector<float> scales(8, 0.5f);
  const Int4Plain p = unpack_awq(qweight.data(), qzeros.data(), scales.data(), 8, 8, 8);
  const uint8_t want_q[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int n = 0; n < 8; ++n) {
    for (int k = 0; k < 8; ++k) EXPECT_EQ(p.q[size_t(n * 8 + k)], want_q[n]) << n << " " << k;
    EXPECT_EQ(p.zeros[size_t(n)], n == 2 ? 3 : 0) << n;
    EXPECT_EQ(p.scales[size_t(n)], 0.5f);
  }
  const Int4Plain sym = unpack_awq(qweight.data(), nullptr, scales.data(), 8, 8, 8);
  EXPECT_TRUE(sym.zeros.empty());  // zero_point false: z = 8 in W4Packed
  EXPECT_THROW(unpack_awq(qweight.data(), nullptr, scales.data(), 8, 8, 3), Error);    // group does not divide
  EXPECT_THROW(unpack_awq(qweight.data(), nullptr, scales.data(), 12, 8, 8), Error);   // rows % 8
}

TEST(W4Moe, ExpertIdOutOfRangeIsReported) {
  const int E = 3, H = 64, I = 32, T = 2, k = 1;
  std::mt19937 rng(3);
  W4Packed gu = make_packed(Fmt::CtInt4Sym, E, 2 * I, H, 32), dn = make_packed(Fmt::CtInt4Sym, E, H, I, 32);
  for (int e = 0; e < E; ++e) {
    set_rows(gu, e, 0, make_checkpoint(Fmt::CtInt4Sym, 2 * I, H, 32, 0.1f, rng));
    set_rows(dn, e, 0, make_checkpoint(Fmt::CtInt4Sym, H, I, 32, 0.1f, rng));
  }
  const W4DeviceMatrix dgu(gu), ddn(dn);
  auto du = dev_half(rand_f16_values(size_t(T) * H, 1));
  auto dids = to_device(std::vector<int32_t>{1, 7});
  auto dw = to_device(std::vector<float>{1.f, 1.f});
  MoeW4A16Workspace ws(T, k, E, H, I);
  DeviceArray<__half> out(size_t(T) * H, "out");
  moe_w4a16_routed(MoeW4A16Experts{&dgu, &ddn, E, H, I}, du.get(), H, T, dids.get(), dw.get(), nullptr, nullptr,
                   out.get(), H, ws, nullptr);
  EXPECT_THROW(moe_w4a16_check_status(ws, nullptr), Error);
  EXPECT_THROW(moe_w4a16_routed(MoeW4A16Experts{&dgu, &ddn, E, H, 2 * I}, du.get(), H, T, dids.get(), dw.get(),
                                nullptr, nullptr, out.get(), H, ws, nullptr),
               Error);
}

}  // namespace
}  // namespace flashnext::cuda::test
