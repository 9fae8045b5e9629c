// Direct CUDA kernels for channels-last depthwise convolutions (MetaFormer's 7x7 separable
// convolutions, CvT's 3x3 projections): what conv2d.cpp hands them and when.
#pragma once

#include <functional>

#include "backend/kernel_types.h"
#include "core/tensor.h"

namespace ska::cuda {

// Whether the direct kernels take a call: x, y (or their gradients) channels-last views of
// [N, C, H, W], one K x K filter per channel (w [C, 1, K, K], groups == C) with K = 3, 5 or 7,
// stride 1, dilation 1, padding below K, C a multiple of 16 bytes' worth of elements, the
// activations 16-byte aligned, f32/bf16/f16, and at most 2^31 - 1 elements per operand.
bool depthwise_direct_supported(const Tensor& a, const Tensor& b, const Tensor& w,
                                const Conv2dParams& p);

// Whether conv2d.cpp runs a call of pass `pass` (0 forward, 1 input gradient, 2 weight gradient)
// on the direct kernels, per set_cuda_depthwise_conv (backend/device_runtime.h): never for a call
// the check above refuses; under kTimed, the first call of a shape and pass (with
// cudnn_benchmark, outside a graph capture) runs `direct` and `cudnn` once each to warm up, then
// three times each timed, and the faster is kept for that shape. Both write the same output.
bool depthwise_direct_chosen(int pass, const Tensor& a, const Tensor& b, const Tensor& w,
                             const Conv2dParams& p, const std::function<void()>& direct,
                             const std::function<void()>& cudnn);

// The kernel contract's three passes (backend/kernels.inc), for calls the check above accepts.
void depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                       const Tensor& y);
void depthwise_backward_input(const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                              const Tensor& grad_x);
void depthwise_backward_weight(const Tensor& grad_y, const Tensor& x, const Conv2dParams& p,
                               const Tensor& grad_w);

}  // namespace ska::cuda
