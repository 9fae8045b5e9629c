// DType names and the bf16 / f16 conversions against known bit patterns.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"

using namespace ska;

TEST_CASE("dtype names round-trip and sizes", "[cpu]") {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                   DType::kU8}) {
    CHECK(dtype_from_name(dtype_name(dt)) == dt);
  }
  CHECK(dtype_size(DType::kBF16) == 2);
  CHECK(dtype_size(DType::kI64) == 8);
  CHECK_THROWS_AS(dtype_from_name("float33"), ValueError);
}

TEST_CASE("f16 conversion matches IEEE binary16 bit patterns", "[cpu]") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);              // largest normal
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);              // rounds to inf
  CHECK(f32_to_f16_bits(5.9604645e-08f) == 0x0001);        // smallest subnormal
  CHECK(f32_to_f16_bits(1.0f + 1.0f / 2048.0f) == 0x3c00);  // tie rounds to even
  CHECK(f32_to_f16_bits(1.0f + 3.0f / 2048.0f) == 0x3c02);
  CHECK(f16_bits_to_f32(0x3555) == Approx(0.33325195f).epsilon(0));
  CHECK(f16_bits_to_f32(0x0001) == 5.9604645e-08f);
  CHECK(std::isinf(f16_bits_to_f32(0x7c00)));
  CHECK(std::isnan(f16_bits_to_f32(f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN()))));
  // Every finite f16 value survives a round trip through f32.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    REQUIRE(f32_to_f16_bits(f16_bits_to_f32(static_cast<uint16_t>(h))) == h);
  }
}

TEST_CASE("bf16 conversion rounds to nearest even", "[cpu]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(bf16_bits_to_f32(0x3f80) == 1.0f);
  CHECK(f32_to_bf16_bits(1.00390625f) == 0x3f80);  // exactly halfway: stays even
  CHECK(f32_to_bf16_bits(1.01171875f) == 0x3f82);  // halfway above odd: rounds up
  CHECK(bf16_bits_to_f32(f32_to_bf16_bits(3.14159f)) == 3.140625f);
}
