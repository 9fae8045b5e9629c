// Matrix products: batched matmul with broadcasting and the fully connected layer.
#pragma once

#include "core/tensor.h"

namespace ska {

// torch.matmul for operands of 2 or more dims (batch dims broadcast); 1-D operands are promoted.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x @ weight^T + bias, x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace ska
