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

// CSKA's convolutional logits (backend/kernels.inc, conv_logits_forward): the queries q
// [B, h, H*W, d] of each head laid out on the height x width grid, their logits over K keys from
// a "same" k x k convolution with one group per head, w [h, k*k, K, d] (k odd; conv2d's filters
// [h*K, d, k, k] reordered), bias [h, K] or undefined -> [B, h, H*W, K]. The same numbers as
// conv2d on q as an image [B, h*d, H, W], up to the order of the sums; computed without the image
// or a neighbourhood matrix. Autocast casts as conv2d's; gradients for q, w and bias.
// With `out` (that shape and the dtype the call computes in, a unit last-dim stride, not
// requiring grad: a view of the rows of a tensor the caller puts together, as cat(pieces, dim,
// out) does), the logits are written there and `out` is returned, recorded as their output.
Tensor grid_conv_logits(const Tensor& q, const Tensor& w, const Tensor& bias, int64_t height,
                        int64_t width, const Tensor& out = Tensor());

}  // namespace ska
