// Internal to the CPU optimizer kernels (optim.cpp, multi_tensor.cpp): the skip flag of an update.
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

}  // namespace ska::cpu
