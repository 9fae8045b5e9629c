// Element values in the tests/simt tests: conversions, buffers no kernel has written yet (every
// word all ones, NaN in bf16 and f16), and bit-for-bit equality.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace ska::simt {

// x rounded to T (bf16, f16 or f32: then x itself).
template <typename T>
T round_to(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half(x);
  } else {
    return x;
  }
}

// The value of a bf16, f16 or f32 element (exact in f32 and f64).
template <typename T>
double value(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return x;
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
