// The operands of multi_cast (backend/kernels.inc), checked alike by the CPU twin and the CUDA
// kernel.
#pragma once

#include <cstddef>

#include "core/error.h"
#include "core/tensor.h"

namespace ska {

// src and dst of one length; each list contiguous tensors of one dtype (f32, bf16 or f16) on one
// device; dst[i] of src[i]'s size and device. ShapeError / DTypeError naming `kernel` and the
// tensor.
inline void check_multi_cast(const char* kernel, const TensorList& src, const TensorList& dst) {
  SKA_CHECK(src.size() == dst.size(), ShapeError, kernel, ": lists of ", src.size(), " and ",
            dst.size(), " tensors");
  for (const TensorList* list : {&src, &dst}) {
    for (const Tensor& t : *list) {
      const DType dt = t.dtype();
      SKA_CHECK(t.is_contiguous() &&
                    (dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16) &&
                    dt == list->front().dtype() && t.device() == list->front().device(),
                DTypeError, kernel, ": tensors must be contiguous, f32, bf16 or f16, of one dtype ",
                "and device; got ", t.str(), " after ", list->front().str());
    }
  }
  for (size_t i = 0; i < src.size(); ++i) {
    SKA_CHECK(dst[i].numel() == src[i].numel() && dst[i].device() == src[i].device(), ShapeError,
              kernel, ": tensor ", i, " is ", dst[i].str(), ", expected the size and device of ",
              src[i].str());
  }
}

}  // namespace ska
