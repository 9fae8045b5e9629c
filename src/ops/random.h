// Random tensors and stochastic regularisers, drawn from the per-device generators.
#pragma once

#include "backend/kernel_types.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ska {

Tensor rand(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu(),
            Generator* gen = nullptr);
Tensor randn(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu(),
             Generator* gen = nullptr);
// Zeroes elements with probability p and scales the rest by 1 / (1 - p); identity unless training.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
// dropout(gelu(x, tanh_approximation), p, training): an MLP's hidden activation and its dropout.
// In training, with a gradient to compute, one kernel each way (the two ops' values, draws and
// gradient, bit for bit: the forward stores no GELU output, the backward writes no dropped
// gradient); otherwise the two ops.
Tensor gelu_dropout(const Tensor& x, double p, bool training, bool tanh_approximation = false,
                    Generator* gen = nullptr);
// x + dropout(y, p, training): the residual sum of a branch that ends in dropout. In training,
// with y needing a gradient, one kernel each way where x and y have one shape and x's dtype is
// y's or f32 with a 16-bit y (autocast's branch into an f32 residual stream): the values, draws
// and gradients of the two ops, bit for bit, without writing the dropped branch, and its gradient
// read once; otherwise the two ops.
Tensor dropout_add(const Tensor& x, const Tensor& y, double p, bool training,
                   Generator* gen = nullptr);
// The draws of a training dropout of `like` with probability p (in [0, 1)) that another op's
// kernels apply (kernel_types.h's DropoutDraw: scaled_residual, add_layer_norm): the generator
// offsets the dropout op would take, and the mask's bits to fill.
DropoutDraw dropout_draw(const Tensor& like, double p, Generator* gen = nullptr);
// Drops whole samples (dim 0) with probability p, scaling survivors by 1 / (1 - p).
Tensor drop_path(const Tensor& x, double p, bool training, Generator* gen = nullptr);
// x times per-sample factors (drop_path_factors; undefined: x itself), broadcast over every dim
// but the first: what drop_path computes from its factors.
Tensor apply_drop_path_factors(const Tensor& x, const Tensor& factors);
// drop_path's factors for `batch` samples: [batch] of `dtype` on `device`, each 0 or 1 / (1 - p),
// drawn as drop_path draws them (the same generator offsets), or undefined when not training or
// p == 0 (nothing drawn). drop_path(x) is x times them, broadcast over the other dims
// (scaled_residual takes them as its y_keep).
Tensor drop_path_factors(int64_t batch, double p, bool training, DType dtype, Device device,
                         Generator* gen = nullptr);

}  // namespace ska
