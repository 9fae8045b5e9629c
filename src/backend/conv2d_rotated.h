// The backward-input pass of a stride-1 convolution as a forward convolution. For stride 1 and
// dilation 1, grad_x = conv2d(grad_y, rotated(w)) with padding k - 1 - pad on each axis, where
// rotated(w) swaps each group's input and output channels and reverses the kernel taps:
//   rotated[g * Cin_g + ci, co, a, b] = w[g * Cout_g + co, ci, kH - 1 - a, kW - 1 - b].
// cuDNN's backward-data kernels for grouped convolutions with many more output than input
// channels per group (CSKA's logit convolution: 16 to 64 channels in, one per key out, per head)
// are far slower than its forward kernels; the CUDA backend times both forms and keeps the faster
// (cuda/kernels/conv2d.cpp). Shared by both backends, so that the CPU checks the identity.
#pragma once

#include "backend/kernel_types.h"
#include "core/tensor.h"

namespace ska {

// Whether the backward-input pass of a convolution with weight shape `w` ([C_out, C_in / groups,
// kH, kW]) and params `p` has the forward form: stride 1, dilation 1, 0 <= pad <= k - 1.
bool conv2d_rotatable(const Shape& w, const Conv2dParams& p);
// The forward convolution's params: stride 1, padding k - 1 - pad, the same groups.
Conv2dParams conv2d_rotated_params(const Shape& w, const Conv2dParams& p);
// The rotated filter of `w` for `groups` groups: [C_in, C_out / groups, kH, kW], contiguous, on
// w's device (a copy and a gather: two small kernels).
Tensor conv2d_rotated_filter(const Tensor& w, int64_t groups);

}  // namespace ska
