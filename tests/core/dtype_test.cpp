#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flashnext;

// Values from the IEEE 754 binary16 / bfloat16 / OCP FP8 definitions.
TEST(DType, HalfConversionsAreExact) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x3951), 0.0001993179321289062f);  // the RadixArk PLE FP8 table scale
}

TEST(DType, HalfRoundTripAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16(f), uint16_t(h)) << h;
  }
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(DType, Fp8) {
  EXPECT_EQ(f8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_float(0x7e), 448.0f);  // largest E4M3fn
  EXPECT_EQ(f8e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  EXPECT_EQ(f8e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(f8e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(f8e5m2_to_float(0x7b), 57344.0f);
}

TEST(DType, Names) {
  DType t;
  EXPECT_TRUE(parse_dtype("F8_E4M3", &t));
  EXPECT_EQ(t, DType::F8_E4M3);
  EXPECT_EQ(dtype_name(DType::I64), "I64");
  EXPECT_FALSE(parse_dtype("F64", &t));
  EXPECT_FALSE(parse_dtype("BOOL", &t));
}
