// The dropout kernels with a bit mask (cuda/kernels/random.cu) on host memory, run by tests/simt
// (tests/simt/random_host.cpp builds the kernel file for the host), launched as dropout_forward,
// unary_dropout_forward (GELU), dropout_backward, unary_dropout_backward, dropout_add_forward
// and dropout_add_backward launch them: 16-byte accesses where the pointers allow, as there.
#pragma once

#include <cstdint>

#include "tests/simt/values.h"

namespace ska::simt::dropout {

// out = dropout(x), or dropout(gelu(x)); the mask into d.bits.
template <typename T>
void forward(const T* x, T* out, int64_t n, const Dropout& d, bool gelu);

// grad_x = grad through the mask `bits` (scale d.scale), then GELU's derivative at x where x is
// not null.
template <typename T>
void backward(const T* grad, const uint8_t* bits, T* grad_x, int64_t n, float scale, const T* x);

// out = x + dropout(y), the mask into d.bits. TX: x's and out's dtype; TY: y's (TX, or 16-bit
// with an f32 TX).
template <typename TX, typename TY>
void add_forward(const TX* x, const TY* y, TX* out, int64_t n, const Dropout& d);

// grad_y = grad (TX, rounded to TY first) through the mask.
template <typename TX, typename TY>
void add_backward(const TX* grad, const uint8_t* bits, TY* grad_y, int64_t n, float scale);

}  // namespace ska::simt::dropout
