// Element types of tensors, their sizes and names, and bf16/f16 <-> f32 conversion.
// Dtype is a runtime value; kernels switch on it (see dispatch in backend/dispatch.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

namespace ska {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);           // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // inverse of dtype_name; throws ValueError
bool dtype_is_floating(DType dt);
inline std::ostream& operator<<(std::ostream& os, DType dt) { return os << dtype_name(dt); }

// bf16: the upper 16 bits of an IEEE f32, rounded to nearest even.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16, round to nearest even, with subnormals, infinities and NaN.
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);

// Storage types for the 16-bit floats on the host. Arithmetic goes through float.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(f32_to_bf16_bits(f)) {}  // NOLINT: implicit like a number
  operator float() const { return bf16_bits_to_f32(bits); }  // NOLINT
};
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(f32_to_f16_bits(f)) {}  // NOLINT
  operator float() const { return f16_bits_to_f32(bits); }  // NOLINT
};

// The DType of a C++ element type, for typed accessors.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };

}  // namespace ska
