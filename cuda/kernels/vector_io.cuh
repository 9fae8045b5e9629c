// Eight consecutive elements read as f32 and written back, by 16-byte accesses where the
// pointers allow: the vectorised elementwise kernels' loads and stores (dropout, StarReLU).
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace ska::cuda {

// Eight consecutive elements as f32 from x + i (16-byte loads where `vectors`: 16-bit T, or
// f32 read as two halves), and back.
template <typename T>
__device__ __forceinline__ void load8(const T* x, float (&v)[8], bool vectors) {
  if constexpr (sizeof(T) <= 4) {
    if (vectors) {
      constexpr int kPer = 16 / sizeof(T);  // elements per 16-byte load
      alignas(16) T tmp[8];
#pragma unroll
      for (int h = 0; h < 8 / kPer; ++h) {
        reinterpret_cast<uint4*>(tmp)[h] = reinterpret_cast<const uint4*>(x)[h];
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = to_float(tmp[k]);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = to_float(x[k]);
}
template <typename T>
__device__ __forceinline__ void store8(T* out, const float (&v)[8], bool vectors) {
  if constexpr (sizeof(T) <= 4) {
    if (vectors) {
      constexpr int kPer = 16 / sizeof(T);
      alignas(16) T tmp[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) tmp[k] = from_float<T>(v[k]);
#pragma unroll
      for (int h = 0; h < 8 / kPer; ++h) {
        reinterpret_cast<uint4*>(out)[h] = reinterpret_cast<const uint4*>(tmp)[h];
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = from_float<T>(v[k]);
}

}  // namespace ska::cuda
