// SIMD fast paths of the f32 unary kernels whose scalar form calls libm (exp, erf, tanh) or
// branches on the sign (ReLU, squared ReLU): the same functions as pointwise_math.h, through
// vec_math.h. Used by pointwise.cpp on contiguous data.
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"

namespace ska::cpu {

// True when `op` has a fast f32 path below.
bool has_unary_f32_fast_path(UnaryOp op);
// y = op(x) over n contiguous elements (parallel). Only for ops with a fast path.
void unary_forward_f32(UnaryOp op, const float* x, float* y, int64_t n);
// dx = g * op'(x) over n contiguous elements (parallel). Only for ops with a fast path.
void unary_backward_f32(UnaryOp op, const float* g, const float* x, float* dx, int64_t n);

}  // namespace ska::cpu
