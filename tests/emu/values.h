// Element access shared by the emulated cuBLASLt and cuDNN (tests/emu): f32, bf16 and f16 values
// read as f64 and written rounded once (to nearest even, as the device's conversions), and f32
// rounded to TF32 as the tensor cores read it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace ska::emu {

enum class Element { kF32, kBF16, kF16 };

inline double load(const void* p, Element t, int64_t i) {
  switch (t) {
    case Element::kF32:
      return static_cast<const float*>(p)[i];
    case Element::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Element::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
  return 0.0;
}

inline void store(void* p, Element t, int64_t i, double v) {
  const float f = static_cast<float>(v);
  switch (t) {
    case Element::kF32:
      static_cast<float*>(p)[i] = f;
      break;
    case Element::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(f);
      break;
    case Element::kF16:
      static_cast<__half*>(p)[i] = __float2half(f);
      break;
  }
}

// v (an f32 value) rounded to TF32: 10 mantissa bits, to nearest with ties away from zero.
inline double tf32(double v) {
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ska::emu
