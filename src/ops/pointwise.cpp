// Pointwise ops with broadcasting and their gradients.
#include "ops/pointwise.h"

#include <optional>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/random.h"
#include "ops/reduce.h"

namespace ska {

namespace {

bool is_16bit(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

// The dtype a binary op computes and returns: the operands' own, or f32 for f32 with bf16/f16
// (mixed precision, read as they are by the kernels); other mixes are a DTypeError.
DType binary_dtype(const char* name, const Tensor& a, const Tensor& b) {
  const bool mixed = (a.dtype() == DType::kF32 && is_16bit(b.dtype())) ||
                     (b.dtype() == DType::kF32 && is_16bit(a.dtype()));
  if (mixed) {
    SKA_CHECK(a.device() == b.device(), DeviceError, name, ": operands on different devices (",
              a.device(), " and ", b.device(), ")");
    return DType::kF32;
  }
  detail::check_same_device_dtype(name, a, b);
  return a.dtype();
}

// `t` seen with its dims in `order` (a view without history).
Tensor reordered(const Tensor& t, const std::vector<int64_t>& order) {
  Shape shape(order.size()), strides(order.size());
  for (size_t j = 0; j < order.size(); ++j) {
    shape[j] = t.shape()[static_cast<size_t>(order[j])];
    strides[j] = t.strides()[static_cast<size_t>(order[j])];
  }
  return Tensor::make_view(t.storage(), shape, strides, t.offset(), t.dtype());
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  if (auto cast = autocast_inputs(name, {a, b})) return binary_raw(op, (*cast)[0], (*cast)[1]);
  const DType dtype = binary_dtype(name, a, b);
  detail::check_floating(name, a);
  detail::check_floating(name, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType out_dtype = binary_op_is_comparison(op) ? DType::kU8 : dtype;
  // Two operands of the output's shape lying in one dense order of dims other than row-major
  // (gradients of heads split from a token-major projection, summed by autograd): the output
  // takes that order too, so that what follows it (undoing the split) stays a view. The kernel
  // sees the three with their dims in memory order, the output contiguous.
  if (a.shape() == shape && b.shape() == shape && a.strides() == b.strides() &&
      !a.is_contiguous() && a.is_non_overlapping_and_dense()) {
    const Tensor out = detail::empty_in_stride_order(shape, a.strides(), out_dtype, a.device(),
                                                     /*last_innermost=*/false);
    const std::vector<int64_t> order = detail::dims_by_stride(a.strides(), false);
    SKA_KERNEL(a.device(), binary)
    (op, reordered(a, order), reordered(b, order), reordered(out, order));
    return out;
  }
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  SKA_KERNEL(a.device(), binary)(op, detail::broadcast_raw(a, shape), detail::broadcast_raw(b, shape), out);
  return out;
}

// Records a broadcasting binary op whose input grads are grad_a(g), grad_b(g) before reduction
// (g in the output's dtype; each input's gradient is returned in that input's dtype). The
// backward keeps a and b alive only where grad_a or grad_b hold them (mul, div, ...): add and
// sub keep their inputs' shapes and dtypes alone, so that a residual sum does not hold the
// branch it added until the backward pass (ViT-S: two [B, N, C] tensors a block).
template <typename GA, typename GB>
Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b, GA grad_a, GB grad_b) {
  Tensor out = binary_raw(op, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Shape a_shape = a.shape(), b_shape = b.shape();
  const DType a_dtype = a.dtype(), b_dtype = b.dtype();
  autograd::record_op(binary_op_name(op), {a, b}, {out}, [=](const TensorList& g) {
    return TensorList{need_a ? sum_to_shape(grad_a(g[0]), a_shape).to(a_dtype) : Tensor(),
                      need_b ? sum_to_shape(grad_b(g[0]), b_shape).to(b_dtype) : Tensor()};
  });
  return out;
}

Tensor unary_op(UnaryOp op, const Tensor& x, double a = 0.0, double b = 0.0) {
  if (auto cast = autocast_inputs(unary_op_name(op), {x})) return unary_op(op, (*cast)[0], a, b);
  detail::check_floating(unary_op_name(op), x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  SKA_KERNEL(x.device(), unary)(op, x, out, a, b);
  if (op == UnaryOp::kAffine || op == UnaryOp::kNeg) {
    // The derivative (a, or -1) does not depend on x, so x is not kept for the backward pass:
    // the kernel reads the gradient in its place.
    autograd::record_op(unary_op_name(op), {x}, {out}, [=](const TensorList& g) {
      const Tensor gc = g[0].contiguous();
      Tensor gx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
      SKA_KERNEL(gc.device(), unary_backward)(op, gc, gc, gx, a, b);
      return TensorList{gx};
    });
    return out;
  }
  autograd::record_op(unary_op_name(op), {x}, {out}, [=](const TensorList& g) {
    const Tensor xc = x.contiguous();
    Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
    SKA_KERNEL(x.device(), unary_backward)(op, g[0].contiguous(), xc, gx, a, b);
    return TensorList{gx};
  });
  return out;
}

// Share of the gradient of max/min going to `a`: 1 where a wins, 1/2 on ties, else 0.
Tensor winner_share(const Tensor& a, const Tensor& b, BinaryOp wins) {
  const Tensor w = binary_raw(wins, a, b).to(a.dtype());
  const Tensor tie = binary_raw(BinaryOp::kEq, a, b).to(a.dtype());
  return w + tie * 0.5;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("add", {a, b})) return add((*cast)[0], (*cast)[1]);
  return binary_op(BinaryOp::kAdd, a, b, [](const Tensor& g) { return g; },
                   [](const Tensor& g) { return g; });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("sub", {a, b})) return sub((*cast)[0], (*cast)[1]);
  return binary_op(BinaryOp::kSub, a, b, [](const Tensor& g) { return g; },
                   [](const Tensor& g) { return neg(g); });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("mul", {a, b})) return mul((*cast)[0], (*cast)[1]);
  return binary_op(BinaryOp::kMul, a, b, [b](const Tensor& g) { return mul(g, b); },
                   [a](const Tensor& g) { return mul(g, a); });
}
Tensor div(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("div", {a, b})) return div((*cast)[0], (*cast)[1]);
  // b * b in the gradient's dtype (f32 when b is the 16-bit side of a mixed pair).
  return binary_op(BinaryOp::kDiv, a, b, [b](const Tensor& g) { return div(g, b); },
                   [a, b](const Tensor& g) {
                     const Tensor wide_b = b.to(g.dtype());
                     return neg(div(mul(g, a), mul(wide_b, wide_b)));
                   });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("maximum", {a, b})) return maximum((*cast)[0], (*cast)[1]);
  return binary_op(BinaryOp::kMaximum, a, b,
                   [a, b](const Tensor& g) { return g * winner_share(a, b, BinaryOp::kGt); },
                   [a, b](const Tensor& g) { return g * winner_share(b, a, BinaryOp::kGt); });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("minimum", {a, b})) return minimum((*cast)[0], (*cast)[1]);
  return binary_op(BinaryOp::kMinimum, a, b,
                   [a, b](const Tensor& g) { return g * winner_share(a, b, BinaryOp::kLt); },
                   [a, b](const Tensor& g) { return g * winner_share(b, a, BinaryOp::kLt); });
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::kGe, a, b); }

namespace {

// The dtype scaled_residual's kernels would give x * xs + y * ys, or nullopt where they do not
// take the operands: x and y of one shape, contiguous, on one device; the result's dtype T the
// widest of them and the scales; x and y of T or (T f32) 16-bit; the scales [C] of T. No
// autocast cast is due (mul and add read such f32 / 16-bit mixes as they are).
std::optional<DType> scaled_residual_dtype(const Tensor& x, const Tensor& xs, const Tensor& y,
                                           const Tensor& ys, const Tensor& yk) {
  if (!x.defined() || !y.defined() || !x.is_floating() || !y.is_floating() || x.dim() == 0 ||
      x.shape() != y.shape() || x.device() != y.device() || !x.is_contiguous() ||
      !y.is_contiguous()) {
    return std::nullopt;
  }
  if (yk.defined() && (y.dim() < 2 || yk.dim() != 1 || yk.size(0) != y.size(0) ||
                       yk.dtype() != y.dtype() || yk.device() != y.device())) {
    return std::nullopt;
  }
  DType out = x.dtype();
  const auto widen = [&](DType d) {
    if (d == DType::kF64 || (d == DType::kF32 && is_16bit(out))) out = d;
  };
  widen(y.dtype());
  for (const Tensor* s : {&xs, &ys}) {
    if (!s->defined()) continue;
    if (s->dim() != 1 || s->size(0) != x.size(-1) || s->device() != x.device()) return std::nullopt;
    widen(s->dtype());
  }
  const auto fits = [&](DType d) { return d == out || (out == DType::kF32 && is_16bit(d)); };
  if (!fits(x.dtype()) || !fits(y.dtype())) return std::nullopt;
  if ((xs.defined() && xs.dtype() != out) || (ys.defined() && ys.dtype() != out)) {
    return std::nullopt;
  }
  if (out == DType::kF64 && x.device().is_cuda()) return std::nullopt;  // no f64 CUDA kernels
  return out;
}

}  // namespace

Tensor scaled_residual(const Tensor& x, const Tensor& x_scale, const Tensor& y,
                       const Tensor& y_scale, const Tensor& y_keep, double y_drop, Generator* gen) {
  if (!x_scale.defined() && !y_scale.defined() && !y_keep.defined()) {
    return y_drop > 0.0 ? dropout_add(x, y, y_drop, true, gen) : add(x, y);
  }
  const std::optional<DType> dtype = scaled_residual_dtype(x, x_scale, y, y_scale, y_keep);
  if (!dtype) {
    const Tensor kept = apply_drop_path_factors(dropout(y, y_drop, true, gen), y_keep);
    return add(x_scale.defined() ? mul(x, x_scale) : x,
               y_scale.defined() ? mul(kept, y_scale) : kept);
  }
  const Tensor xs = x_scale.defined() ? x_scale.detach().contiguous() : Tensor();
  const Tensor ys = y_scale.defined() ? y_scale.detach().contiguous() : Tensor();
  const Tensor yk = y_keep.defined() ? y_keep.detach().contiguous() : Tensor();
  // The dropout's draws as the dropout op takes them (the same generator offsets).
  const DropoutDraw drop = y_drop > 0.0 ? dropout_draw(y, y_drop, gen) : DropoutDraw();
  Tensor out = Tensor::empty(x.shape(), *dtype, x.device());
  SKA_KERNEL(x.device(), scaled_residual_forward)(x.detach(), xs, y.detach(), ys, yk, drop, out);
  const bool need_x = x.requires_grad(), need_y = y.requires_grad();
  const bool need_xs = x_scale.defined() && x_scale.requires_grad();
  const bool need_ys = y_scale.defined() && y_scale.requires_grad();
  // x and y stay alive for the backward pass only where a scale's gradient reads them.
  const Tensor xd = need_xs ? x.detach() : Tensor(), yd = need_ys ? y.detach() : Tensor();
  const DType out_dtype = *dtype, x_dtype = x.dtype(), y_dtype = y.dtype();
  autograd::record_op("scaled_residual", {x, x_scale, y, y_scale}, {out}, [=](const TensorList& g) {
    const Tensor gc = g[0].to(out_dtype).contiguous();
    const auto grad = [&](bool need, DType dtype) {
      return need ? Tensor::empty(gc.shape(), dtype, gc.device()) : Tensor();
    };
    const auto scale_grad = [&](bool need) {
      return need ? Tensor::empty({gc.size(-1)}, out_dtype, gc.device()) : Tensor();
    };
    const Tensor gx = grad(need_x, x_dtype), gy = grad(need_y, y_dtype);
    const Tensor gxs = scale_grad(need_xs), gys = scale_grad(need_ys);
    SKA_KERNEL(gc.device(), scaled_residual_backward)
    (gc, xd, xs, yd, ys, yk, drop, gx, gy, gxs, gys);
    return TensorList{gx, gxs.defined() ? gxs.view(x_scale.shape()) : Tensor(), gy,
                      gys.defined() ? gys.view(y_scale.shape()) : Tensor()};
  });
  return out;
}

Tensor add(const Tensor& a, double b) { return unary_op(UnaryOp::kAffine, a, 1.0, b); }
Tensor sub(const Tensor& a, double b) { return unary_op(UnaryOp::kAffine, a, 1.0, -b); }
Tensor rsub(double a, const Tensor& b) { return unary_op(UnaryOp::kAffine, b, -1.0, a); }
Tensor mul(const Tensor& a, double b) { return unary_op(UnaryOp::kAffine, a, b, 0.0); }
Tensor div(const Tensor& a, double b) { return unary_op(UnaryOp::kAffine, a, 1.0 / b, 0.0); }
Tensor pow(const Tensor& a, double exponent) { return unary_op(UnaryOp::kPow, a, exponent); }

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::kNeg, x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::kAbs, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::kExp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::kLog, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::kSqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::kRsqrt, x); }
Tensor reciprocal(const Tensor& x) { return unary_op(UnaryOp::kReciprocal, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::kSigmoid, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::kTanh, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::kRelu, x); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return unary_op(tanh_approximation ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x);
}
Tensor quick_gelu(const Tensor& x) { return unary_op(UnaryOp::kQuickGelu, x); }
Tensor squared_relu(const Tensor& x) { return unary_op(UnaryOp::kSquaredRelu, x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::kSilu, x); }

Tensor star_relu(const Tensor& x, const Tensor& scale, const Tensor& bias,
                 std::optional<DType> out_dtype) {
  SKA_CHECK(scale.numel() == 1 && bias.numel() == 1, ShapeError,
            "star_relu: scale and bias must have one element, got ", shape_str(scale.shape()),
            " and ", shape_str(bias.shape()));
  detail::check_floating("star_relu", x);
  detail::check_same_device_dtype("star_relu", scale, bias);
  // The dtype of scale * relu(x)^2 + bias as the binary ops would give it: x's, or f32 for a
  // 16-bit x with f32 parameters (autocast), one kernel instead of three either way.
  const DType wide = binary_dtype("star_relu", x, scale);
  SKA_CHECK(!out_dtype || *out_dtype == wide || *out_dtype == x.dtype(), DTypeError,
            "star_relu: out_dtype ", dtype_name(out_dtype.value_or(wide)), " must be ",
            dtype_name(wide), " or x's ", dtype_name(x.dtype()));
  const DType dtype = out_dtype.value_or(wide);
  const Tensor xc = x.detach().contiguous();
  const Tensor s = scale.detach().contiguous(), b = bias.detach().contiguous();
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  SKA_KERNEL(x.device(), star_relu_forward)(xc, s, b, y);
  const bool need_x = x.requires_grad(), need_s = scale.requires_grad();
  const bool need_b = bias.requires_grad();
  autograd::record_op("star_relu", {x, scale, bias}, {y}, [=](const TensorList& g) {
    Tensor gx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    Tensor gs = need_s ? Tensor::empty({1}, s.dtype(), s.device()) : Tensor();
    Tensor gb = need_b ? Tensor::empty({1}, s.dtype(), s.device()) : Tensor();
    SKA_KERNEL(xc.device(), star_relu_backward)(g[0].contiguous(), xc, s, gx, gs, gb);
    return TensorList{need_x ? gx : Tensor(), need_s ? gs.reshape(scale.shape()) : Tensor(),
                      need_b ? gb.reshape(bias.shape()) : Tensor()};
  });
  return y;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("where", {a, b})) return where(cond, (*cast)[0], (*cast)[1]);
  detail::check_same_device_dtype("where", a, b);
  SKA_CHECK(cond.dtype() == DType::kU8, DTypeError, "where: condition must be u8, got ",
            dtype_name(cond.dtype()));
  SKA_CHECK(cond.device() == a.device(), DeviceError, "where: condition on ", cond.device(),
            ", values on ", a.device());
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"),
                                       b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  SKA_KERNEL(a.device(), where)(detail::broadcast_raw(cond, shape), detail::broadcast_raw(a, shape),
                                detail::broadcast_raw(b, shape), out);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Shape a_shape = a.shape(), b_shape = b.shape();  // the values are not needed
  autograd::record_op("where", {a, b}, {out}, [=](const TensorList& g) {
    const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
    return TensorList{need_a ? sum_to_shape(where(cond, g[0], zero), a_shape) : Tensor(),
                      need_b ? sum_to_shape(where(cond, zero, g[0]), b_shape) : Tensor()};
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  SKA_CHECK(shape == x.shape(), ShapeError, "masked_fill: mask ", shape_str(mask.shape()),
            " does not broadcast to the input ", shape_str(x.shape()));
  return where(mask, Tensor::full({}, value, x.dtype(), x.device()), x);
}

}  // namespace ska
