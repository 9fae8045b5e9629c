// Differentiable pointwise ops: arithmetic with broadcasting, activations, where/masked_fill.
#pragma once

#include <optional>

#include "core/random.h"
#include "core/tensor.h"

namespace ska {

// Binary arithmetic with NumPy broadcasting. Both operands must share dtype and device.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// x * x_scale + drop_path(y) * y_scale with per-channel scales ([C], C = the last dim; either
// undefined for none): a residual sum with MetaFormer's res_scale on the stream or CaiT's
// LayerScale on the branch. y_keep: drop path's per-sample factors for y (drop_path_factors,
// ops/random.h: [B] of y's dtype, B = y's dim 0), or undefined for none. Where x and y have one
// shape and are contiguous, one kernel forward and one backward, with the values and the x and y
// gradients of those ops (mul by the factors, mul, mul, add), bit for bit, and the scales'
// gradients their sums over the rows (the same bits on the CPU, another order of the same sums on
// CUDA); otherwise those ops. Dtypes as those ops give them: an f32 x or scale with a bf16/f16 y
// comes out f32. y_drop > 0: y is dropout(y, y_drop, true) first (a branch that ends in dropout,
// in training; its draws from `gen` or the device's generator), in the same kernels where they
// run (the bits of the ops, dropout's draws included), else the dropout op first.
Tensor scaled_residual(const Tensor& x, const Tensor& x_scale, const Tensor& y,
                       const Tensor& y_scale, const Tensor& y_keep = Tensor(), double y_drop = 0.0,
                       Generator* gen = nullptr);
// Scalar forms.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(double a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
// Comparisons (no grad): u8 0/1 with broadcasting.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor quick_gelu(const Tensor& x);    // x * sigmoid(1.702 x)
Tensor squared_relu(const Tensor& x);  // relu(x)^2
Tensor silu(const Tensor& x);
// scale * relu(x)^2 + bias with learnable one-element `scale` and `bias` (MetaFormer StarReLU),
// in the dtype the binary ops would give (f32 for a 16-bit x with f32 parameters), or in x's own
// dtype when `out_dtype` says so: the f32 result rounded once, the bits a cast after would give
// (for an activation that only a matrix product or a convolution reads under autocast).
Tensor star_relu(const Tensor& x, const Tensor& scale, const Tensor& bias,
                 std::optional<DType> out_dtype = std::nullopt);

// cond (u8) ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask (u8, broadcastable to x) is nonzero.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// Operators for readable model code.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace ska
