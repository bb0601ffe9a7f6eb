// Element types of checkpoint tensors and their conversions to float32 on the host.
//
// Names follow the safetensors header ("BF16", "F8_E4M3", ...). Conversions are exact: every BF16, F16 and FP8
// value is representable in float32. FP8 E4M3 is the "fn" variant (no infinities, 0x7F/0xFF are NaN) used by
// ModelOpt and the official FP8 release; E5M2 follows IEEE rules (OCP FP8 spec, 2023).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace flashnext {

enum class DType : uint8_t { BF16, F16, F32, F8_E4M3, F8_E5M2, U8, I8, I32, I64 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::I64: return 8;
    default: return 1;
  }
}

/// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);

/// Parses a safetensors dtype string; returns false for dtypes flashnext does not read (F64, BOOL, U16, ...).
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_float(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }

/// Round-to-nearest-even float -> bf16 (NaN stays NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// IEEE half -> float, exact for every input including subnormals, infinities and NaN.
inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(bits);
}

/// float -> IEEE half, round to nearest even; values beyond the half range become +-inf.
uint16_t float_to_f16(float f);

/// FP8 E4M3 (fn: bias 7, no inf, S.1111.111 = NaN) -> float.
float f8e4m3_to_float(uint8_t v);
/// FP8 E5M2 (bias 15, IEEE-style inf/NaN) -> float.
inline float f8e5m2_to_float(uint8_t v) { return f16_to_float(uint16_t(v) << 8); }

/// Converts `n` elements of type `t` at `src` (any alignment) to float32. Integer types convert by value. Throws
/// Error for types that are not numeric tensors of a model (none today).
void convert_to_float(DType t, const void* src, float* dst, size_t n);

}  // namespace flashnext
