// Internal to the CPU optimizer kernels (optim.cpp, multi_tensor.cpp): the skip flag and the
// learning rate of an update, which the kernels read from tensors (see kernels.inc).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ska::cpu {

// True when `skip` (undefined, or one u8 element) asks to leave the parameters alone.
inline bool read_skip(const Tensor& skip, const char* who) {
  if (!skip.defined()) return false;
  SKA_CHECK(skip.numel() == 1 && skip.dtype() == DType::kU8, DTypeError, who,
            ": skip must be one u8 element, got ", skip.str());
  return *static_cast<const uint8_t*>(skip.data_ptr()) != 0;
}

// The learning rate held by `lr` (one f64 element).
inline double read_lr(const Tensor& lr, const char* who) {
  SKA_CHECK(lr.defined() && lr.numel() == 1 && lr.dtype() == DType::kF64, DTypeError, who,
            ": lr must be one f64 element, got ", lr.defined() ? lr.str() : "an undefined tensor");
  return *static_cast<const double*>(lr.data_ptr());
}

}  // namespace ska::cpu
