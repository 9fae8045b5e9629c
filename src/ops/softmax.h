// Softmax and log-softmax over the last dim, with an optional scale and additive mask.
// Attention is composed from matmul + softmax for now; a fused attention op would live beside.
#pragma once

#include "core/tensor.h"

namespace ska {

// softmax(scale * x + mask); mask undefined or broadcastable to x (it receives a gradient if it
// requires one, e.g. a relative position bias).
Tensor softmax(const Tensor& x, double scale = 1.0, const Tensor& mask = Tensor());
Tensor log_softmax(const Tensor& x, double scale = 1.0, const Tensor& mask = Tensor());

}  // namespace ska
