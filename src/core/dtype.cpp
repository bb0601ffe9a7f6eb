#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace flashnext {

namespace {
constexpr std::string_view kNames[] = {"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "U8", "I8", "I32", "I64"};
}

std::string_view dtype_name(DType t) { return kNames[static_cast<int>(t)]; }

bool parse_dtype(std::string_view name, DType* out) {
  for (int i = 0; i < int(std::size(kNames)); ++i) {
    if (kNames[i] == name) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

uint16_t float_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {                                  // below the smallest normal half: subnormal or zero
    // value = absu as float; half subnormal unit is 2^-24.
    float a = std::bit_cast<float>(absu);
    float scaled = a * 16777216.0f;  // exact (power of two)
    uint32_t m = uint32_t(std::nearbyint(scaled));  // default rounding mode: nearest even
    return uint16_t(sign | m);
  }
  uint32_t exp = ((absu >> 23) - 127 + 15);
  uint32_t man = absu & 0x7fffffu;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return uint16_t(sign | half);
}

float f8e4m3_to_float(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  float out;
  if (exp == 0xf && man == 0x7) {
    out = std::nanf("");
  } else if (exp == 0) {
    out = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    out = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
  }
  return sign ? -out : out;
}

namespace {
// Element i of a little-endian array at `src`, which may be unaligned (safetensors offsets need not be).
template <class T>
T load(const void* src, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(src) + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

void convert_to_float(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load<uint16_t>(src, i));
      return;
    }
    case DType::F16: {
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_float(load<uint16_t>(src, i));
      return;
    }
    case DType::F8_E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_float(s[i]);
      return;
    }
    case DType::F8_E5M2: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e5m2_to_float(s[i]);
      return;
    }
    case DType::U8: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::I8: {
      auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::I32: {
      for (size_t i = 0; i < n; ++i) dst[i] = float(load<int32_t>(src, i));
      return;
    }
    case DType::I64: {
      for (size_t i = 0; i < n; ++i) dst[i] = float(load<int64_t>(src, i));
      return;
    }
  }
  fail("convert_to_float: unknown dtype");
}

}  // namespace flashnext
