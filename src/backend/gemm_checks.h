// GemmArgs::a_row_sums, checked alike by the CPU twin and the CUDA kernel.
#pragma once

#include "backend/kernel_types.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ska {

// Undefined, or a contiguous [M] tensor of c's dtype on c's device, for one matrix (c [M, N] or
// [1, M, N]) without a bias.
inline void check_gemm_row_sums(const char* kernel, const GemmArgs& args) {
  const Tensor& s = args.a_row_sums;
  if (!s.defined()) return;
  const Tensor& c = args.c;
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1, m = c.size(-2);
  SKA_CHECK(batch == 1 && !args.bias.defined(), ValueError, kernel,
            ": a_row_sums needs one matrix and no bias, got c ", shape_str(c.shape()),
            args.bias.defined() ? " with a bias" : "");
  SKA_CHECK(s.numel() == m && s.is_contiguous() && s.dtype() == c.dtype(), ShapeError, kernel,
            ": a_row_sums must be a contiguous [", m, "] tensor of c's dtype ",
            dtype_name(c.dtype()), ", got ", s.str());
  SKA_CHECK(s.device() == c.device(), DeviceError, kernel, ": a_row_sums on ", s.device(),
            ", c on ", c.device());
}

}  // namespace ska
