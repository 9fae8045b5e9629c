// 2-D convolution (NCHW), from dense to depthwise.
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"
#include "core/tensor.h"

namespace ska {

// x [N, C_in, H, W], weight [C_out, C_in / groups, kH, kW], bias [C_out] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);

}  // namespace ska
