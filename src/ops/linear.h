// Matrix products: batched matmul with broadcasting and the fully connected layer.
#pragma once

#include "core/tensor.h"

namespace ska {

// torch.matmul for operands of 2 or more dims (batch dims broadcast); 1-D operands are promoted.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x @ weight^T + bias, x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Under autocast, how an f32 weight and bias get their gradients (`train.linear_grads`): off
// (the default), through their casts as torch.autocast gives them: a 16-bit gradient, rounded,
// then cast to f32; on, written in f32 by the backward GEMM and column sum themselves (their sums
// not rounded to 16 bits; no cast and one launch fewer per tensor). The forward pass and the
// input's gradient are the same either way. Process-wide.
void set_linear_f32_grads(bool enabled);
bool linear_f32_grads_enabled();

}  // namespace ska
