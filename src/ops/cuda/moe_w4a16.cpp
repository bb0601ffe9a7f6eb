#include "ops/cuda/moe_w4a16.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/quant_format.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/random_kernels.h"

namespace flashnext::cuda {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// E2M1 code -> float (sign bit 3; magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}).
float e2m1(uint32_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8u) ? -kMag[code & 7u] : kMag[code & 7u];
}

// E4M3 (OCP FN: bias 7, no infinities, S.1111.111 NaN) -> float; NaN for the NaN codes.
float e4m3(uint8_t v) {
  const int e = (v >> 3) & 15, m = v & 7;
  float f;
  if (e == 15 && m == 7)
    f = std::nanf("");
  else if (e == 0)
    f = std::ldexp(float(m), -9);
  else
    f = std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return (v & 0x80) ? -f : f;
}

// Nibble position of input j (0..7) of a code word: k0 k2 k4 k6 k1 k3 k5 k7.
constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

uint32_t code_at(const std::vector<uint32_t>& codes, size_t row_base, int k) {
  return (codes[row_base + size_t(k / 8)] >> (4 * kNibble[k % 8])) & 0xfu;
}

// The power of two p of a row's G group scales s (set_rows): the largest |s| * 2^-p in [2^top, 2^(top+1)) (p = 0 when
// every scale is 0); *largest receives that |s|. Throws Error for a non-finite scale, naming the format `what`.
int row_shift(const float* s, int64_t G, int top, const char* what, int expert, int64_t row, float* largest) {
  float mx = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    FN_CHECK(std::isfinite(s[g]), "W4Packed::set_rows: {} scale {} at expert {} row {} group {}", what, s[g], expert,
             row, g);
    mx = std::max(mx, std::fabs(s[g]));
  }
  *largest = mx;
  if (mx == 0.f) return 0;
  int ex = 0;
  std::frexp(mx, &ex);  // mx in [2^(ex-1), 2^ex)
  return ex - 1 - top;
}

}  // namespace

namespace {

// GPTQ's b-bit packing into an int4 (b <= 4) or int8 plain weight: qweight column n and qzeros row g are bit streams
// (core/quant_format.h gptq_packed_value); z = zero + 1 (v1) or the zero (v2).
template <class Plain>
Plain unpack_gptq_plain(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                        int64_t group, bool gptq_v2, int bits, const char* op) {
  using Q = typename decltype(Plain::q)::value_type;
  using Z = typename decltype(Plain::zeros)::value_type;
  FN_CHECK(rows > 0 && cols > 0 && rows % 8 == 0 && cols % 8 == 0 && (rows * bits) % 32 == 0 && (cols * bits) % 32 == 0,
           "{}: {}-bit GPTQ packing needs both dimensions divisible by 8 and by 32 / gcd({}, 32), got [{}, {}]", op,
           bits, bits, rows, cols);
  FN_CHECK(group >= 0, "{}: group size {}", op, group);
  FN_CHECK(qweight && qzeros && scales, "{}: null pointer", op);
  const int64_t G = group ? ceil_div(cols, group) : 1, zrow = rows * bits / 32;
  Plain p;
  p.rows = rows;
  p.cols = cols;
  p.group = group;
  p.q.resize(size_t(rows * cols));
  p.zeros.resize(size_t(rows * G));
  p.scales.resize(size_t(rows * G));
  for (int64_t k = 0; k < cols; ++k)
    for (int64_t n = 0; n < rows; ++n)
      p.q[size_t(n * cols + k)] = Q(gptq_packed_value([&](int64_t j) { return qweight[j * rows + n]; }, bits, k));
  const Z off = gptq_v2 ? 0 : 1;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < rows; ++n) {
      p.zeros[size_t(n * G + g)] = Z(gptq_packed_value([&](int64_t j) { return qzeros[g * zrow + j]; }, bits, n) + off);
      p.scales[size_t(n * G + g)] = scales[g * rows + n];
    }
  }
  return p;
}

}  // namespace

Int4Plain unpack_gptq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                      int64_t group, bool gptq_v2, int bits) {
  FN_CHECK(bits >= 2 && bits <= 4, "unpack_gptq: {}-bit values do not fit the 4-bit codes (2, 3 or 4 bits)", bits);
  return unpack_gptq_plain<Int4Plain>(qweight, qzeros, scales, rows, cols, group, gptq_v2, bits, "unpack_gptq");
}

Int4Plain unpack_awq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                     int64_t group) {
  const int64_t g = group ? group : cols;
  FN_CHECK(rows > 0 && cols > 0 && rows % 8 == 0 && group >= 0 && cols % g == 0,
           "unpack_awq: AWQ packing needs rows divisible by 8 and a group dividing cols, got [{}, {}] group {}", rows,
           cols, group);
  FN_CHECK(qweight && scales, "unpack_awq: null pointer");
  // Nibble of output 8j + m: kAwqNibble (core/quant_format.h).
  const int64_t G = cols / g, NW = rows / 8;
  Int4Plain p;
  p.rows = rows;
  p.cols = cols;
  p.group = group;
  p.q.resize(size_t(rows * cols));
  p.scales.resize(size_t(rows * G));
  for (int64_t k = 0; k < cols; ++k)
    for (int64_t n = 0; n < rows; ++n)
      p.q[size_t(n * cols + k)] = uint8_t((uint32_t(qweight[k * NW + n / 8]) >> (4 * kAwqNibble[n % 8])) & 0xfu);
  if (qzeros) p.zeros.resize(size_t(rows * G));
  for (int64_t gi = 0; gi < G; ++gi) {
    for (int64_t n = 0; n < rows; ++n) {
      if (qzeros)
        p.zeros[size_t(n * G + gi)] = uint8_t((uint32_t(qzeros[gi * NW + n / 8]) >> (4 * kAwqNibble[n % 8])) & 0xfu);
      p.scales[size_t(n * G + gi)] = scales[gi * rows + n];
    }
  }
  return p;
}

Int4Plain unpack_ct_int4(const int32_t* weight_packed, const int32_t* zero_point, const float* scales, int64_t rows,
                         int64_t cols, int64_t group) {
  FN_CHECK(rows > 0 && cols > 0 && group >= 0, "unpack_ct_int4: shape [{}, {}], group {}", rows, cols, group);
  FN_CHECK(weight_packed && scales, "unpack_ct_int4: null pointer");
  const int64_t G = group ? ceil_div(cols, group) : 1, KP = ceil_div(cols, 8);
  Int4Plain p;
  p.rows = rows;
  p.cols = cols;
  p.group = group;
  p.q.resize(size_t(rows * cols));
  p.scales.assign(scales, scales + rows * G);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < cols; ++k)
      p.q[size_t(n * cols + k)] = uint8_t((uint32_t(weight_packed[n * KP + k / 8]) >> (4 * (k % 8))) & 0xfu);
  if (zero_point) {
    p.zeros.resize(size_t(rows * G));
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t g = 0; g < G; ++g)
        p.zeros[size_t(n * G + g)] = uint8_t((uint32_t(zero_point[(n / 8) * G + g]) >> (4 * (n % 8))) & 0xfu);
  }
  return p;
}

namespace {

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of an int4 or int8 plain weight, groups of `group` (0: one).
template <class Plain>
Plain slice_plain(const Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group, const char* op) {
  const int64_t src_group = p.group ? p.group : p.cols, g = group ? group : cols;
  FN_CHECK(r0 >= 0 && rows > 0 && r0 + rows <= p.rows && c0 >= 0 && cols > 0 && c0 + cols <= p.cols,
           "{}: rows [{}, +{}) and columns [{}, +{}) of a [{}, {}] matrix", op, r0, rows, c0, cols, p.rows, p.cols);
  // A slice that ends where the matrix ends may end in a partial group, as the source's last one.
  FN_CHECK(c0 % g == 0 && (cols % g == 0 || c0 + cols == p.cols) && src_group % g == 0,
           "{}: groups of {} do not tile columns [{}, +{}) inside source groups of {}", op, g, c0, cols, src_group);
  const int64_t G = ceil_div(p.cols, src_group), Gs = ceil_div(cols, g);
  Plain s;
  s.rows = rows;
  s.cols = cols;
  s.group = group;
  s.q.resize(size_t(rows * cols));
  s.scales.resize(size_t(rows * Gs));
  constexpr bool kZeros = requires {
    p.zeros;
  };  // int4 and int8 (FP8 has none, but a row scale)
  if constexpr (kZeros) {
    if (!p.zeros.empty()) s.zeros.resize(size_t(rows * Gs));
  } else {
    if (!p.row_scale.empty()) s.row_scale.assign(p.row_scale.begin() + r0, p.row_scale.begin() + r0 + rows);
  }
  for (int64_t n = 0; n < rows; ++n) {
    std::copy_n(p.q.begin() + (r0 + n) * p.cols + c0, cols, s.q.begin() + n * cols);
    for (int64_t j = 0; j < Gs; ++j) {
      const size_t from = size_t((r0 + n) * G + (c0 + j * g) / src_group), to = size_t(n * Gs + j);
      s.scales[to] = p.scales[from];
      if constexpr (kZeros) {
        if (!p.zeros.empty()) s.zeros[to] = p.zeros[from];
      }
    }
  }
  return s;
}

}  // namespace

Int4Plain slice_int4(const Int4Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group) {
  return slice_plain(p, r0, rows, c0, cols, group, "slice_int4");
}

Int8Plain slice_int8(const Int8Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group) {
  return slice_plain(p, r0, rows, c0, cols, group, "slice_int8");
}

Fp8Plain slice_fp8(const Fp8Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group) {
  return slice_plain(p, r0, rows, c0, cols, group, "slice_fp8");
}

Fp8Plain unpack_ct_fp8(const uint8_t* weight, const float* scales, bool per_row, int64_t rows, int64_t cols) {
  FN_CHECK(rows > 0 && cols > 0, "unpack_ct_fp8: shape [{}, {}]", rows, cols);
  FN_CHECK(weight && scales, "unpack_ct_fp8: null pointer");
  Fp8Plain p;
  p.rows = rows;
  p.cols = cols;
  p.q.assign(weight, weight + rows * cols);
  p.scales.assign(size_t(rows), 1.f);  // one group of scale 1; the channel (or tensor) scale a row scale
  p.row_scale.resize(size_t(rows));
  for (int64_t n = 0; n < rows; ++n) p.row_scale[size_t(n)] = scales[per_row ? n : 0];
  return p;
}

Fp8Plain unpack_fp8_block(const uint8_t* weight, const float* scales, int64_t rows, int64_t cols, int64_t block_rows,
                          int64_t block_cols) {
  FN_CHECK(rows > 0 && cols > 0 && block_rows > 0 && block_cols > 0,
           "unpack_fp8_block: shape [{}, {}] with blocks of [{}, {}]", rows, cols, block_rows, block_cols);
  FN_CHECK(weight && scales, "unpack_fp8_block: null pointer");
  Fp8Plain p;
  p.rows = rows;
  p.cols = cols;
  p.group = w8a16_fp8_group(QuantFormat::Fp8Block, block_cols, cols);
  p.q.assign(weight, weight + rows * cols);
  const int64_t G = ceil_div(cols, block_cols);
  p.scales.resize(size_t(rows * G));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < G; ++j) p.scales[size_t(n * G + j)] = scales[(n / block_rows) * G + j];
  return p;
}

Int8Plain unpack_gptq_int8(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows,
                           int64_t cols, int64_t group, bool gptq_v2) {
  return unpack_gptq_plain<Int8Plain>(qweight, qzeros, scales, rows, cols, group, gptq_v2, 8, "unpack_gptq_int8");
}

Int8Plain unpack_ct_int8(const int8_t* weight, const float* scales, bool per_row, int64_t rows, int64_t cols) {
  FN_CHECK(rows > 0 && cols > 0, "unpack_ct_int8: shape [{}, {}]", rows, cols);
  FN_CHECK(weight && scales, "unpack_ct_int8: null pointer");
  Int8Plain p;
  p.rows = rows;
  p.cols = cols;
  p.q.resize(size_t(rows * cols));
  for (size_t i = 0; i < p.q.size(); ++i) p.q[i] = uint8_t(int(weight[i]) + 128);  // z = 128 (zeros left empty)
  p.scales.resize(size_t(rows));
  for (int64_t n = 0; n < rows; ++n) p.scales[size_t(n)] = scales[per_row ? n : 0];
  return p;
}

Int8Plain int8_from_int4(const Int4Plain& p) {
  Int8Plain e;
  e.rows = p.rows;
  e.cols = p.cols;
  e.group = p.group;
  e.q = p.q;
  e.scales = p.scales;
  e.zeros.assign(p.scales.size(), uint16_t(8));  // symmetric int4: z = 8
  for (size_t i = 0; i < p.zeros.size(); ++i) e.zeros[i] = p.zeros[i];
  return e;
}

Int4Plain int8_planes(const Int8Plain& p, std::vector<float>* row_scale) {
  const int64_t C = p.cols, g = p.group && p.group < C ? p.group : C;  // a group of a row or more: the row
  FN_CHECK(C > 0 && C % g == 0, "int8_planes: groups of {} do not divide the {} inputs", g, C);
  FN_CHECK(row_scale, "int8_planes: null row_scale");
  const int64_t G = C / g;
  FN_CHECK(p.q.size() == size_t(p.rows * C) && p.scales.size() == size_t(p.rows * G) &&
               (p.zeros.empty() || p.zeros.size() == p.scales.size()),
           "int8_planes: arrays do not fit [{}, {}] with groups of {}", p.rows, C, g);
  Int4Plain r;
  r.rows = p.rows;
  r.cols = 2 * C;
  r.group = g;
  r.q.resize(size_t(p.rows * 2 * C));
  r.zeros.resize(size_t(p.rows * 2 * G));
  r.scales.resize(size_t(p.rows * 2 * G));
  const bool per_row = G == 1;
  if (per_row)
    row_scale->assign(size_t(p.rows), 1.f);
  else
    row_scale->clear();
  for (int64_t n = 0; n < p.rows; ++n) {
    for (int64_t k = 0; k < C; ++k) {
      const uint8_t q = p.q[size_t(n * C + k)];
      r.q[size_t(n * 2 * C + k)] = uint8_t(q >> 4);
      r.q[size_t(n * 2 * C + C + k)] = uint8_t(q & 15);
    }
    for (int64_t j = 0; j < G; ++j) {
      const uint16_t z = p.zeros.empty() ? uint16_t(128) : p.zeros[size_t(n * G + j)];
      FN_CHECK(z <= 256, "int8_planes: zero point {} at row {} group {} (0..256)", z, n, j);
      const float s = p.scales[size_t(n * G + j)];
      r.zeros[size_t(n * 2 * G + j)] = uint8_t(z >> 4);
      r.zeros[size_t(n * 2 * G + G + j)] = uint8_t(z & 15);
      r.scales[size_t(n * 2 * G + j)] = per_row ? 16.f : 16.f * s;  // exact: a power of two
      r.scales[size_t(n * 2 * G + G + j)] = per_row ? 1.f : s;
      if (per_row) (*row_scale)[size_t(n)] = s;
    }
  }
  return r;
}

W4Packed::W4Packed(W4Format format_, int experts_, int rows_, int cols_, int group_, bool with_zeros)
    : format(format_), experts(experts_), rows(rows_), cols(cols_), group(group_ ? group_ : cols_), has_zeros(with_zeros) {
  FN_CHECK(experts > 0 && rows > 0 && cols > 0 && cols % 8 == 0,
           "W4Packed: {} experts of [{}, {}]: need positive sizes and cols a multiple of 8", experts, rows, cols);
  FN_CHECK(format != W4Format::Nvfp4 || (group == 16 && !with_zeros),
           "W4Packed: NVFP4 has groups of 16 inputs and no zero points (group {}, zeros {})", group_, with_zeros);
  FN_CHECK(format != W4Format::Fp8 || !with_zeros, "W4Packed: FP8 has no zero points");
  FN_CHECK(group > 0 && group % 8 == 0, "W4Packed: group size {} must be a positive multiple of 8 (or 0: all {})",
           group_, cols);
  // The kernels index the stacked rows [E * rows] in 32 bits.
  FN_CHECK(int64_t(experts) * rows < (int64_t(1) << 31), "W4Packed: {} experts of {} rows exceed 2^31 stacked rows",
           experts, rows);
  const int per_word = format == W4Format::Fp8 ? 4 : 8;  // inputs a code word holds
  wpr = int(ceil_div(cols, 4 * per_word) * detail::kW4WordsAlign);
  groups = int(ceil_div(int64_t(wpr) * per_word, group));
  const size_t er = size_t(experts) * rows;
  codes.assign(er * wpr, 0u);
  if (format == W4Format::Fp8)
    fscales.assign(er * groups, 0.f);
  else
    scales.assign(er * groups, __float2half_rn(0.f));
  if (has_zeros) zeros.assign(er * groups, uint8_t(8));
  global.assign(er, 1.f);
}

void W4Packed::set_rows(int expert, int row0, const Nvfp4Source& src) {
  FN_CHECK(format == W4Format::Nvfp4, "W4Packed::set_rows: NVFP4 rows given to a matrix of another format");
  FN_CHECK(expert >= 0 && expert < experts && row0 >= 0 && src.rows > 0 && row0 + src.rows <= rows &&
               src.cols == cols,
           "W4Packed::set_rows: expert {} rows [{}, {}) x {} do not fit {} experts of [{}, {}]", expert, row0,
           row0 + src.rows, src.cols, experts, rows, cols);
  FN_CHECK(src.packed && src.scales, "W4Packed::set_rows: null NVFP4 pointer");
  FN_CHECK(std::isfinite(src.global) && src.global != 0.f, "W4Packed::set_rows: NVFP4 global scale {} (expert {})",
           src.global, expert);
  const int kind = src.global_is_divisor ? 2 : 1;
  FN_CHECK(divide_known_ == 0 || divide_known_ == kind,
           "W4Packed::set_rows: NVFP4 rows mix global multipliers (weight_scale_2) and divisors (weight_global_scale)");
  divide_known_ = kind;
  divide = src.global_is_divisor;
  const int64_t sc = ceil_div(cols, 16);
  for (int64_t r = 0; r < src.rows; ++r) {
    const size_t row = size_t(expert) * rows + size_t(row0 + r);
    uint32_t* dst = &codes[row * wpr];
    std::fill(dst, dst + wpr, 0u);
    const uint8_t* in = src.packed + r * (cols / 2);
    for (int k = 0; k < cols; ++k) {
      const uint32_t c = (k & 1) ? uint32_t(in[k / 2] >> 4) : uint32_t(in[k / 2] & 0xf);
      dst[k / 8] |= c << (4 * kNibble[k % 8]);
    }
    for (int64_t g = 0; g < sc; ++g) {
      const uint8_t b = src.scales[r * sc + g];
      const float f = e4m3(b);
      FN_CHECK(!std::isnan(f), "W4Packed::set_rows: NVFP4 scale of expert {} row {} group {} is an E4M3 NaN (0x{:02x})",
               expert, row0 + r, g, b);
      scales[row * groups + size_t(g)] = __float2half_rn(f);  // exact: E4M3 fits FP16
    }
    global[row] = src.global;
  }
}

void W4Packed::set_rows(int expert, int row0, const Int4Source& src) {
  FN_CHECK(format == W4Format::Int4, "W4Packed::set_rows: int4 rows given to a matrix of another format");
  FN_CHECK(expert >= 0 && expert < experts && row0 >= 0 && src.rows > 0 && row0 + src.rows <= rows &&
               src.cols == cols,
           "W4Packed::set_rows: expert {} rows [{}, {}) x {} do not fit {} experts of [{}, {}]", expert, row0,
           row0 + src.rows, src.cols, experts, rows, cols);
  FN_CHECK((src.group ? src.group : src.cols) == group, "W4Packed::set_rows: int4 group {} (matrix made for {})",
           src.group, group);
  FN_CHECK(src.q && src.scales, "W4Packed::set_rows: null int4 pointer");
  FN_CHECK(has_zeros || !src.zeros, "W4Packed::set_rows: zero points given to a matrix made without them");
  const int64_t G = ceil_div(cols, group);
  for (int64_t r = 0; r < src.rows; ++r) {
    const size_t row = size_t(expert) * rows + size_t(row0 + r);
    uint32_t* dst = &codes[row * wpr];
    std::fill(dst, dst + wpr, 0u);
    const uint8_t* in = src.q + r * cols;
    for (int k = 0; k < cols; ++k) {
      FN_CHECK(in[k] <= 15, "W4Packed::set_rows: int4 value {} at expert {} row {} input {}", in[k], expert, row0 + r,
               k);
      dst[k / 8] |= uint32_t(in[k]) << (4 * kNibble[k % 8]);
    }
    const float* s = src.scales + r * G;
    float mx = 0.f;
    const int p = row_shift(s, G, 10, "int4", expert, row0 + r, &mx);
    for (int64_t g = 0; g < G; ++g) {
      const float v = std::ldexp(s[g], -p);
      const __half h = __float2half_rn(v);
      FN_CHECK(__half2float(h) == v && std::ldexp(__half2float(h), p) == s[g],
               "W4Packed::set_rows: int4 scale {} at expert {} row {} group {} is not exact in FP16 next to the row's "
               "largest scale {} (more than 11 significant bits or a range above 2^24; 2^20 for 8-bit planes, whose "
               "high plane's scale is 16 times the group's)",
               s[g], expert, row0 + r, g, mx);
      scales[row * groups + size_t(g)] = h;
      if (has_zeros) {
        const uint8_t z = src.zeros ? src.zeros[r * G + g] : uint8_t(8);
        FN_CHECK(z <= 16, "W4Packed::set_rows: zero point {} at expert {} row {} group {} (0..16)", z, expert,
                 row0 + r, g);
        zeros[row * groups + size_t(g)] = z;
      }
    }
    for (int64_t g = G; g < groups; ++g) scales[row * groups + size_t(g)] = __float2half_rn(0.f);
    const float rs = src.row_scale ? src.row_scale[r] : 1.f;
    FN_CHECK(std::isfinite(rs), "W4Packed::set_rows: row scale {} at expert {} row {}", rs, expert, row0 + r);
    global[row] = std::ldexp(rs, p);  // exact: a power-of-two multiple
  }
}

void W4Packed::set_rows(int expert, int row0, const Fp8Plain& src) {
  FN_CHECK(format == W4Format::Fp8, "W4Packed::set_rows: FP8 rows given to a 4-bit matrix");
  FN_CHECK(expert >= 0 && expert < experts && row0 >= 0 && src.rows > 0 && row0 + src.rows <= rows && src.cols == cols,
           "W4Packed::set_rows: expert {} rows [{}, {}) x {} do not fit {} experts of [{}, {}]", expert, row0,
           row0 + src.rows, src.cols, experts, rows, cols);
  FN_CHECK((src.group ? src.group : src.cols) == group, "W4Packed::set_rows: FP8 group {} (matrix made for {})",
           src.group, group);
  const int64_t G = ceil_div(cols, group);
  FN_CHECK(src.q.size() == size_t(src.rows * cols) && src.scales.size() == size_t(src.rows * G) &&
               (src.row_scale.empty() || src.row_scale.size() == size_t(src.rows)),
           "W4Packed::set_rows: FP8 arrays do not fit [{}, {}] with groups of {}", src.rows, cols, group);
  for (int64_t r = 0; r < src.rows; ++r) {
    const size_t row = size_t(expert) * rows + size_t(row0 + r);
    uint32_t* dst = &codes[row * wpr];
    std::fill(dst, dst + wpr, 0u);
    const uint8_t* in = src.q.data() + r * cols;
    for (int k = 0; k < cols; ++k) {
      FN_CHECK((in[k] & 0x7f) != 0x7f,
               "W4Packed::set_rows: FP8 value at expert {} row {} input {} is an E4M3 NaN "
               "(0x{:02x})",
               expert, row0 + r, k, in[k]);
      dst[k / 4] |= uint32_t(in[k]) << (8 * (k % 4));
    }
    const float* s = src.scales.data() + r * G;
    float mx = 0.f;
    const int p = row_shift(s, G, 14, "FP8", expert, row0 + r, &mx);
    for (int64_t g = 0; g < G; ++g) {
      const float v = std::ldexp(s[g], -p);
      FN_CHECK(std::ldexp(v, p) == s[g],
               "W4Packed::set_rows: FP8 scale {} at expert {} row {} group {} does not keep "
               "its bits next to the row's largest scale {} (the row's scales span more than float32's range)",
               s[g], expert, row0 + r, g, mx);
      fscales[row * groups + size_t(g)] = v;
    }
    for (int64_t g = G; g < groups; ++g) fscales[row * groups + size_t(g)] = 0.f;
    const float rs = src.row_scale.empty() ? 1.f : src.row_scale[size_t(r)];
    FN_CHECK(std::isfinite(rs), "W4Packed::set_rows: FP8 row scale {} at expert {} row {}", rs, expert, row0 + r);
    global[row] = std::ldexp(rs, 8 + p);  // exact: a power-of-two multiple
    FN_CHECK(rs == 0.f || (std::isfinite(global[row]) && std::ldexp(global[row], -8 - p) == rs),
             "W4Packed::set_rows: FP8 row scale {} at expert {} row {} leaves float32's range times 2^{}", rs, expert,
             row0 + r, 8 + p);
  }
}

std::vector<float> W4Packed::unpack(int expert) const {
  FN_CHECK(expert >= 0 && expert < experts, "W4Packed::unpack: expert {} of {}", expert, experts);
  std::vector<float> out(size_t(rows) * cols);
  for (int n = 0; n < rows; ++n) {
    const size_t row = size_t(expert) * rows + n;
    for (int k = 0; k < cols; ++k) {
      const size_t gi = row * groups + size_t(k / group);
      if (format == W4Format::Fp8) {
        // (s' * 2^-8) * G = s_group * s_row, exactly where one of the two is a power of two (unpack_ct_fp8: group
        // scales 1; unpack_fp8_block: no row scale): the source's scale, and e4m3 times it one rounding, as the
        // loader's.
        const uint8_t b = uint8_t(codes[row * wpr + size_t(k / 4)] >> (8 * (k % 4)));
        out[size_t(n) * cols + k] = e4m3(b) * (std::ldexp(fscales[gi], -8) * global[row]);
        continue;
      }
      const uint32_t c = code_at(codes, row * wpr, k);
      const float s = __half2float(scales[gi]);
      float v;
      if (format == W4Format::Nvfp4) {
        const float a = e2m1(c) * s;  // exact
        v = divide ? a / global[row] : a * global[row];
      } else {
        const int z = has_zeros ? zeros[gi] : 8;
        v = float(int(c) - z) * (s * global[row]);  // s * 2^p (* the row scale): the source scale, exactly
      }
      out[size_t(n) * cols + k] = v;
    }
  }
  return out;
}

size_t W4Packed::expert_bytes() const {
  const size_t per_group = format == W4Format::Fp8 ? 4 : 2 + (has_zeros ? 1 : 0);
  return size_t(rows) * (size_t(wpr) * 4 + size_t(groups) * per_group + 4);
}

W4DeviceMatrix::W4DeviceMatrix(const W4Packed& p)
    : experts(p.experts),
      format(p.format),
      codes_(p.codes.size(), "w4a16 codes"),
      scales_(std::max<size_t>(1, p.scales.size()), "w4a16 scales"),
      zeros_(std::max<size_t>(1, p.zeros.size()), "w4a16 zero points"),
      global_(p.global.size(), "w4a16 global scales"),
      fscales_(std::max<size_t>(1, p.fscales.size()), "w8a16 fp8 scales") {
  upload(codes_, p.codes);
  if (!p.scales.empty()) upload(scales_, p.scales);
  if (!p.zeros.empty()) upload(zeros_, p.zeros);
  upload(global_, p.global);
  if (!p.fscales.empty()) upload(fscales_, p.fscales);
  view_.codes = codes_.get();
  view_.scales = p.scales.empty() ? nullptr : scales_.get();
  view_.fscales = p.fscales.empty() ? nullptr : fscales_.get();
  view_.zeros = p.has_zeros ? zeros_.get() : nullptr;
  view_.global = global_.get();
  view_.rows = p.rows;
  view_.cols = p.cols;
  view_.wpr = p.wpr;
  view_.groups = p.groups;
  view_.group = p.group;
  for (int k = 0; p.format != W4Format::Fp8 && 32 << k <= p.group; ++k)  // (FP8 looks its groups up by division)
    if (32 << k == p.group) view_.chunk_shift = k;
  view_.nvfp4 = p.format == W4Format::Nvfp4;
  view_.fp8 = p.format == W4Format::Fp8;
  view_.divide = p.divide;
}

W4DeviceMatrix W4DeviceMatrix::random_nvfp4(int experts, int rows, int cols, float global, uint64_t seed,
                                            cudaStream_t stream) {
  FN_CHECK(experts > 0 && rows > 0 && cols > 0 && cols % 8 == 0 && int64_t(experts) * rows < (int64_t(1) << 31),
           "random W4A16 experts: {} experts of [{}, {}]: need positive sizes, cols a multiple of 8 and fewer than "
           "2^31 stacked rows",
           experts, rows, cols);
  constexpr int kGroup = 16;  // NVFP4 block
  const int wpr = int(ceil_div(cols, 32) * detail::kW4WordsAlign), groups = int(ceil_div(int64_t(wpr) * 8, kGroup));
  const int64_t er = int64_t(experts) * rows;
  W4DeviceMatrix m;
  m.experts = experts;
  m.format = W4Format::Nvfp4;
  m.codes_ = DeviceArray<uint32_t>(size_t(er) * wpr, "random w4a16 codes");
  m.scales_ = DeviceArray<__half>(size_t(er) * groups, "random w4a16 scales");
  m.zeros_ = DeviceArray<uint8_t>(1, "w4a16 zero points");
  m.global_ = DeviceArray<float>(size_t(er), "random w4a16 global scales");
  FN_CUDA_CHECK(detail::launch_random_w4_codes(m.codes_.get(), er, wpr, cols / 8, seed, stream), "random_nvfp4 codes");
  // Block scales 1 (padding words hold code 0, whose product is 0 whatever its group's scale).
  FN_CUDA_CHECK(detail::launch_fill_f16(m.scales_.get(), er * groups, 1.f, stream), "random_nvfp4 scales");
  FN_CUDA_CHECK(detail::launch_fill_f32(m.global_.get(), er, global, stream), "random_nvfp4 global scales");
  m.view_ = detail::W4Mat{.codes = m.codes_.get(),
                          .scales = m.scales_.get(),
                          .zeros = nullptr,
                          .global = m.global_.get(),
                          .rows = rows,
                          .cols = cols,
                          .wpr = wpr,
                          .groups = groups,
                          .group = kGroup,
                          .nvfp4 = true,
                          .divide = false};
  return m;
}

MoeW4A16Workspace::MoeW4A16Workspace(int max_tokens_, int top_k_, int experts_, int hidden_, int inter_, int planes_)
    : max_tokens(max_tokens_),
      top_k(top_k_),
      experts(experts_),
      hidden(hidden_),
      inter(inter_),
      planes(planes_),
      max_tiles((max_tokens_ * top_k_ + detail::kW4GroupSlots - 1) / detail::kW4GroupSlots +
                std::min(experts_, max_tokens_ * top_k_)),
      offsets(size_t(experts_) + 1, "moe expert offsets"),
      sorted_slots(size_t(max_tokens_) * top_k_, "moe sorted slots"),
      slot_row(size_t(max_tokens_) * top_k_, "moe slot rows"),
      tile_expert(std::max(1, max_tiles), "moe tiles"),
      tile_row(std::max(1, max_tiles), "moe tiles"),
      num_tiles(1, "moe tile count"),
      status(1, "moe status"),
      h(size_t(max_tokens_) * top_k_ * inter_, "moe expert activations"),
      ys(size_t(max_tokens_) * top_k_ * hidden_, "moe expert outputs"),
      u2(planes_ == 2 ? size_t(max_tokens_) * 2 * hidden_ : 1, "moe repeated expert inputs"),
      h2(planes_ == 2 ? size_t(max_tokens_) * top_k_ * 2 * inter_ : 1, "moe repeated expert activations"),
      // Row blocks of the widest down matrix in code columns: two planes (2I) or FP8 (2I; w4_code_cols).
      done(size_t(std::max(1, max_tokens_)) * std::max(1, detail::w4_gemv_down_row_blocks(hidden_, 2 * inter_)),
           "w4a16 gemv counters") {
  FN_CHECK(max_tokens > 0 && top_k > 0 && experts > 0 && hidden > 0 && inter > 0 && (planes == 1 || planes == 2),
           "MoeW4A16Workspace: bad sizes tokens={} top_k={} experts={} hidden={} inter={} planes={}", max_tokens, top_k,
           experts, hidden, inter, planes);
  FN_CUDA_CHECK(cudaMemset(status.get(), 0, sizeof(int32_t)), "MoeW4A16Workspace status");
  FN_CUDA_CHECK(cudaMemset(done.get(), 0, done.size() * sizeof(int32_t)), "MoeW4A16Workspace counters");
}

namespace {
// FLASHNEXT_CUDA_W4_GEMV (read once, for before/after measurements): `fma` the FP32-FMA GEMV kernels on every GPU,
// `grouped` the grouped tensor-core GEMV wherever Auto picks the GEMV and it can run, `ungrouped` never; else unset.
std::string_view w4_gemv_setting() {
  static const std::string setting = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_W4_GEMV");
    return std::string(v ? v : "");
  }();
  return setting;
}

bool gemv_tensor_cores_allowed() {
  return w4_gemv_setting() != "fma";
}

// FLASHNEXT_CUDA_W4_GEMM=wmma (read once): the WMMA GEMM kernels on every GPU, for before/after measurements.
bool gemm_mma_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("FLASHNEXT_CUDA_W4_GEMM");
    return !(v && std::string_view(v) == "wmma");
  }();
  return allowed;
}

}  // namespace

bool moe_w4a16_gemv_tensor_cores() {
  return gemv_tensor_cores_allowed() && detail::w4_gemv_tensor_cores_compiled();
}

namespace {
// Whether both matrices can run the grouped tensor-core GEMV (W4Path::GemvGrouped) here.
bool grouped_gemv_runs(const MoeW4A16Experts& w) {
  return w.gate_up && w.down && gemv_tensor_cores_allowed() && detail::w4_gemv_grouped(w.gate_up->view()) &&
         detail::w4_gemv_grouped(w.down->view());
}
}  // namespace

W4Path moe_w4a16_auto_path(const MoeW4A16Experts& w, int tokens, int top_k) {
  const bool tensor_cores = w.gate_up && w.down && gemv_tensor_cores_allowed() &&
                            detail::w4_gemv_tensor_cores(w.gate_up->view()) &&
                            detail::w4_gemv_tensor_cores(w.down->view());
  const bool can_group = tensor_cores && grouped_gemv_runs(w);
  // Auto groups only where a block's staged rows leave room for several blocks an SM (kW4GroupAutoSmem).
  const bool grouped = can_group && w4_gemv_setting() != "ungrouped" &&
                       detail::w4_gemv_grouped_smem(w.gate_up->view()) <= kW4GroupAutoSmem &&
                       detail::w4_gemv_grouped_smem(w.down->view()) <= kW4GroupAutoSmem;
  const W4Path path = moe_w4a16_pick_path(tokens, top_k, w.experts, tensor_cores, grouped);
  return path == W4Path::Gemv && can_group && w4_gemv_setting() == "grouped" ? W4Path::GemvGrouped : path;
}

W4Path moe_w4a16_pick_path(int tokens, int top_k, int experts, bool tensor_core_gemv, bool grouped_gemv) {
  const int64_t slots = int64_t(tokens) * top_k;
  const int64_t touched = std::max<int64_t>(1, std::min<int64_t>(experts, slots));
  const int64_t max_slots = tensor_core_gemv ? kW4GemvMaxSlots : kW4GemvFmaMaxSlots;
  const int64_t max_mean_x2 = tensor_core_gemv ? kW4GemvMaxMeanX2 : kW4GemvFmaMaxMeanX2;
  if (!(slots <= max_slots && 2 * slots <= max_mean_x2 * touched)) return W4Path::Gemm;
  if (!grouped_gemv) return W4Path::Gemv;
  // The experts uniform routing touches: E * (1 - (1 - k/E)^tokens).
  const double e = double(std::max(1, experts)), hit = std::min(1.0, double(top_k) / e);
  const double expected = e * (1.0 - std::pow(1.0 - hit, double(tokens)));
  return 4.0 * double(slots) >= double(kW4GroupMinMeanX4) * expected ? W4Path::GemvGrouped : W4Path::Gemv;
}

namespace {

// TU: FP16 activations, or FP32 ones for the tensor-core GEMV path alone (moe_w4a16_routed_takes_f32).
template <class TO, class TU>
void routed(const MoeW4A16Experts& w, const TU* u, int64_t ldu, int tokens, const int32_t* ids, const float* weights,
            const float* shared, cudaEvent_t shared_ready, TO* out, int64_t ldo, MoeW4A16Workspace& ws,
            cudaStream_t stream, W4Path path) {
  constexpr bool f32_in = std::is_same_v<TU, float>;
  FN_CHECK(w.gate_up && w.down, "moe_w4a16_routed: missing expert weights");
  const int E = w.experts, H = w.hidden, I = w.inter;
  FN_CHECK(E >= 1 && E <= detail::kMoeMaxExperts, "moe_w4a16_routed: {} experts (1..{})", E, detail::kMoeMaxExperts);
  FN_CHECK(H > 0 && I > 0 && H % 8 == 0 && I % 8 == 0,
           "moe_w4a16_routed: hidden {} and expert width {} must be positive multiples of 8", H, I);
  const auto& gu = w.gate_up->view();
  const auto& dn = w.down->view();
  const int P = w.planes;
  FN_CHECK(P == 1 || P == 2, "moe_w4a16_routed: {} planes (1 or 2)", P);
  FN_CHECK(w.gate_up->experts == E && gu.rows == 2 * I && gu.cols == P * H,
           "moe_w4a16_routed: gate_up holds {} experts of [{}, {}], expected {} of [2I = {}, {} x H = {}]",
           w.gate_up->experts, gu.rows, gu.cols, E, 2 * I, P, P * H);
  FN_CHECK(w.down->experts == E && dn.rows == H && dn.cols == P * I,
           "moe_w4a16_routed: down holds {} experts of [{}, {}], expected {} of [H = {}, {} x I = {}]", w.down->experts,
           dn.rows, dn.cols, E, H, P, P * I);
  FN_CHECK(ws.experts == E && ws.hidden == H && ws.inter == I && ws.planes == P,
           "moe_w4a16_routed: workspace made for E={} H={} I={} planes={}, weights have E={} H={} I={} planes={}",
           ws.experts, ws.hidden, ws.inter, ws.planes, E, H, I, P);
  FN_CHECK(tokens >= 0 && tokens <= ws.max_tokens, "moe_w4a16_routed: {} tokens exceed the workspace's {}", tokens,
           ws.max_tokens);
  FN_CHECK(ldu >= H && ldu % 8 == 0 && ldo >= H, "moe_w4a16_routed: row strides u {} / out {} (H {})", ldu, ldo, H);
  if (tokens == 0) return;
  FN_CHECK(u && ids && weights && out, "moe_w4a16_routed: null pointer");
  const int slots = tokens * ws.top_k;
  if (path == W4Path::Auto) path = moe_w4a16_auto_path(w, tokens, ws.top_k);
  if (path == W4Path::GemvGrouped && !grouped_gemv_runs(w)) path = W4Path::Gemv;
  if constexpr (f32_in) {
    FN_CHECK(P == 1 && (path == W4Path::Gemv || path == W4Path::GemvGrouped) && gemv_tensor_cores_allowed() &&
                 detail::w4_gemv_tensor_cores(gu),
             "moe_w4a16_routed: FP32 activations are taken by the tensor-core GEMV only (moe_w4a16_routed_takes_f32)");
  } else if (P == 2) {  // two planes: the products read [u, u] and [h, h] (the planes' inputs side by side)
    FN_CUDA_CHECK(detail::launch_repeat_cols_f16(u, ldu, tokens, H, 2, ws.u2.get(), stream),
                  "moe_w4a16_routed repeat u");
    u = ws.u2.get();
    ldu = 2 * int64_t(H);
  }
  const auto repeat_h = [&] {
    if (P == 2)
      FN_CUDA_CHECK(detail::launch_repeat_cols_f16(ws.h.get(), I, slots, I, 2, ws.h2.get(), stream),
                    "moe_w4a16_routed repeat h");
  };
  const __half* hin = P == 2 ? ws.h2.get() : ws.h.get();  // down's input rows, P * I wide
  const auto wait_for_shared = [&] {                      // before the launch that reads `shared`
    if (shared && shared_ready)
      FN_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0), "moe_w4a16_routed: wait for the shared expert");
  };
  if (path == W4Path::Gemv || path == W4Path::GemvFma) {  // two launches, no grouping pass
    const bool mma = path == W4Path::Gemv && gemv_tensor_cores_allowed();
    if constexpr (f32_in)
      FN_CUDA_CHECK(
          detail::launch_w4_gemv_gate_up(gu, u, ldu, ids, slots, ws.top_k, E, I, ws.h.get(), ws.status.get(), stream),
          "moe_w4a16_routed gemv gate_up");
    else
      FN_CUDA_CHECK(detail::launch_w4_gemv_gate_up(gu, u, ldu, ids, slots, ws.top_k, E, I, ws.h.get(), ws.status.get(),
                                                   mma && detail::w4_gemv_tensor_cores(gu), stream),
                    "moe_w4a16_routed gemv gate_up");
    repeat_h();
    wait_for_shared();
    FN_CUDA_CHECK(
        detail::launch_w4_gemv_down(dn, hin, ids, weights, tokens, ws.top_k, E, H, P * I, ws.ys.get(), ws.done.get(),
                                    shared, out, ldo, mma && detail::w4_gemv_tensor_cores(dn), stream),
        "moe_w4a16_routed gemv down");
    return;
  }
  const auto align = [&](int tile_m) {
    FN_CUDA_CHECK(
        detail::launch_w4_align(ids, slots, E, tile_m, ws.offsets.get(), ws.sorted_slots.get(), ws.slot_row.get(),
                                ws.tile_expert.get(), ws.tile_row.get(), ws.num_tiles.get(), ws.status.get(), stream),
        "moe_w4a16_routed align");
  };
  const auto combine = [&] {
    wait_for_shared();
    FN_CUDA_CHECK(
        detail::launch_moe_combine(ws.ys.get(), ws.slot_row.get(), tokens, ws.top_k, H, shared, out, ldo, stream),
        "moe_w4a16_routed combine");
  };
  if (path == W4Path::GemvGrouped) {  // grouping, then the GEMVs over tiles of up to kW4GroupSlots slots, combine
    align(detail::kW4GroupSlots);
    const detail::W4Tiles tiles{ws.offsets.get(), ws.sorted_slots.get(), ws.tile_expert.get(), ws.tile_row.get(),
                                ws.num_tiles.get()};
    const int max_tiles = int(ceil_div(slots, detail::kW4GroupSlots)) + std::min(E, slots);
    FN_CUDA_CHECK(detail::launch_w4_gemv_grouped_gate_up(gu, u, ldu, tiles, max_tiles, ws.top_k, I, ws.h.get(), stream),
                  "moe_w4a16_routed grouped gemv gate_up");
    repeat_h();
    FN_CUDA_CHECK(
        detail::launch_w4_gemv_grouped_down(dn, hin, tiles, max_tiles, weights, H, P * I, ws.ys.get(), stream),
        "moe_w4a16_routed grouped gemv down");
    combine();
    return;
  }
  if constexpr (!f32_in) {  // (FP32 activations were refused above)
    const bool mma = path != W4Path::GemmWmma && gemm_mma_allowed();
    align(detail::kW4TileM);
    const int max_tiles = int(ceil_div(slots, detail::kW4TileM)) + std::min(E, slots);
    FN_CUDA_CHECK(detail::launch_w4_gemm_gate_up(gu, u, ldu, ws.top_k, I, ws.offsets.get(), ws.sorted_slots.get(),
                                                 ws.tile_expert.get(), ws.tile_row.get(), ws.num_tiles.get(), max_tiles,
                                                 ws.h.get(), mma && detail::w4_gemm_tensor_cores(gu), stream),
                  "moe_w4a16_routed gemm gate_up");
    repeat_h();
    FN_CUDA_CHECK(detail::launch_w4_gemm_down(dn, hin, H, P * I, ws.offsets.get(), ws.sorted_slots.get(), weights,
                                              ws.tile_expert.get(), ws.tile_row.get(), ws.num_tiles.get(), max_tiles,
                                              ws.ys.get(), mma && detail::w4_gemm_tensor_cores(dn), stream),
                  "moe_w4a16_routed gemm down");
    combine();
  }
}

}  // namespace

void moe_w4a16_routed(const MoeW4A16Experts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, __half* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream, W4Path path) {
  routed(w, u, ldu, tokens, ids, weights, shared, shared_ready, out, ldo, ws, stream, path);
}

void moe_w4a16_routed(const MoeW4A16Experts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, float* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream, W4Path path) {
  routed(w, u, ldu, tokens, ids, weights, shared, shared_ready, out, ldo, ws, stream, path);
}

bool moe_w4a16_routed_takes_f32(const MoeW4A16Experts& w, int tokens, int top_k) {
  const W4Path path = w.gate_up && w.down ? moe_w4a16_auto_path(w, tokens, top_k) : W4Path::Gemm;
  return w.gate_up && w.down && w.planes == 1 && (path == W4Path::Gemv || path == W4Path::GemvGrouped) &&
         gemv_tensor_cores_allowed() && detail::w4_gemv_tensor_cores(w.gate_up->view());
}

void moe_w4a16_routed(const MoeW4A16Experts& w, const float* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, float* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream) {
  routed(w, u, ldu, tokens, ids, weights, shared, shared_ready, out, ldo, ws, stream, W4Path::Auto);
}

void moe_w4a16_check_status(MoeW4A16Workspace& ws, cudaStream_t stream) {
  const char* op = "moe_w4a16_routed";
  FN_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  int32_t v = 0;
  FN_CUDA_CHECK(cudaMemcpy(&v, ws.status.get(), sizeof v, cudaMemcpyDeviceToHost), op);
  FN_CHECK(v == 0, "{}: expert ids outside 0..{} were given; those slots were dropped", op, ws.experts - 1);
}

}  // namespace flashnext::cuda
