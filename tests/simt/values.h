// 16-bit values in the tests/simt tests: conversions, buffers no kernel has written yet (every
// word all ones, NaN in bf16 and f16), and bit-for-bit equality.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace ska::simt {

template <typename T>
T to16(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16(x);
  } else {
    return __float2half(x);
  }
}

// The value of a bf16 or f16 element (exact in f32 and f64).
template <typename T>
double value(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

template <typename T>
std::vector<T> unwritten(size_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0xff, n * sizeof(T));
  return v;
}

// Whether a 16-bit element still holds unwritten's bits.
template <typename T>
bool untouched(const T& e) {
  static_assert(sizeof(T) == 2);
  uint16_t bits;
  std::memcpy(&bits, &e, 2);
  return bits == 0xffff;
}

template <typename E>
bool same_bits(const std::vector<E>& a, const std::vector<E>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(E)) == 0;
}

}  // namespace ska::simt
