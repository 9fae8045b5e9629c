// Runtime dtype dispatch for CPU kernels: calls a generic lambda with a value of the C++ type.
//   dispatch_floating(x.dtype(), "softmax", [&](auto tag) { using T = decltype(tag); ... });
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace ska::cpu {

// f32 and f64: the CPU compute dtypes.
template <typename F>
void dispatch_floating(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); return;
    case DType::kF64: f(double{}); return;
    default:
      SKA_FAIL(DTypeError, "cpu kernel '", kernel, "' supports f32 and f64, got ", dtype_name(dt));
  }
}

// Every dtype (for copies and fills).
template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); return;
    case DType::kF64: f(double{}); return;
    case DType::kBF16: f(BFloat16{}); return;
    case DType::kF16: f(Half{}); return;
    case DType::kI32: f(int32_t{}); return;
    case DType::kI64: f(int64_t{}); return;
    case DType::kU8: f(uint8_t{}); return;
  }
}

// Converts between element types, going through float for the 16-bit floats.
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace ska::cpu
