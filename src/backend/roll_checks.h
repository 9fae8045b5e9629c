// The roll kernel's operand checks, shared by its CPU twin and its CUDA kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace ska {

inline void check_roll(const char* kernel, const Tensor& x, const std::vector<int64_t>& shifts,
                       const Tensor& out) {
  SKA_CHECK(static_cast<int64_t>(shifts.size()) == x.dim(), ValueError, kernel, ": ", shifts.size(),
            " shifts for a ", x.dim(), "-d input ", shape_str(x.shape()));
  for (size_t d = 0; d < shifts.size(); ++d) {
    SKA_CHECK(shifts[d] >= 0 && (shifts[d] < x.shape()[d] || (shifts[d] == 0 && x.shape()[d] == 0)),
              ValueError, kernel, ": shift ", shifts[d], " of dim ", d, " is outside [0, ",
              x.shape()[d], ") for input ", shape_str(x.shape()));
  }
  SKA_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype() && out.is_contiguous(), ShapeError,
            kernel, ": out ", shape_str(out.shape()), " ", dtype_name(out.dtype()),
            " must be a contiguous tensor of x's shape ", shape_str(x.shape()), " and dtype ",
            dtype_name(x.dtype()));
  SKA_CHECK(out.device() == x.device(), DeviceError, kernel, ": out on ", out.device(), ", x on ",
            x.device());
}

}  // namespace ska
