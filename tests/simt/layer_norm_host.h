// The fused residual add + layer norm's forward kernels (cuda/kernels/layer_norm.cu,
// add_layer_norm_forward) on host memory, run by tests/simt (tests/simt/layer_norm_host.cpp
// builds the kernel file for the host). Rows of `cols` contiguous elements: sum = x + the branch y
// (through its dropout where `bits` is set: the mask written there, a bit an element) times the
// per-column scale ys where set (CaiT's LayerScale), then its layer norm with weight w and bias b
// into `normed`, and each row's mean and rstd. T: the stream (float, or a 16-bit type), TR: the
// branch, TY: the normed output; the parameters f32.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/simt/values.h"

namespace ska::simt::layer_norm {

// held: the kernel that holds a row in registers (train.norm_forward: held) where it applies.
template <typename T, typename TR, typename TY>
void add_layer_norm_forward(const T* x, const TR* y, const Dropout& drop, const T* ys,
                            const float* w, const float* b, T* sum, TY* normed, float* mean,
                            float* rstd, int64_t rows, int64_t cols, float eps, bool held);

// The plain layer norm's forward (layer_norm_forward_kernel, or its held-row form): y = the
// normed rows of x, weight and bias in x's dtype (f32 here).
template <typename TY>
void layer_norm_forward(const float* x, const float* w, const float* b, TY* y, float* mean,
                        float* rstd, int64_t rows, int64_t cols, float eps, bool held);

// The fused backward (rows of at most 768 columns) of that forward, as add_layer_norm_backward
// launches it: from grad_y (the normed output's gradient, TY) and grad_sum (the sum's gradient
// from further on, T; null: none), grad_x (the stream's), grad_branch (TB where the branch is
// 16-bit in an f32 stream, else T; null: not wanted) through ys and the dropout's mask in
// drop.bits, grad_w, grad_b and grad_scale (the LayerScale's; needs ys and y, the branch as the
// forward read it). x is the sum (the norm's input), mean and rstd the forward's.
template <typename T, typename TY, typename TB>
void add_layer_norm_backward(const TY* grad_y, const T* grad_sum, const T* x, const float* w,
                             const float* mean, const float* rstd, const Dropout& drop,
                             const void* y, bool low_branch, const T* ys, T* grad_x,
                             void* grad_branch, float* grad_w, float* grad_b, T* grad_scale,
                             int64_t rows, int64_t cols);

}  // namespace ska::simt::layer_norm
