// Random tensors, dropout and drop-path.
#include "ops/random.h"

#include <cstdint>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/pointwise.h"

namespace ska {

namespace {
Generator& pick(Generator* gen, Device device) { return gen ? *gen : default_generator(device); }
}  // namespace

// Under a CUDA Graph capture the generator hands out offsets relative to its capture base, which
// the kernels add, so that each replay draws new numbers (Generator::begin_capture).
Tensor rand(const Shape& shape, DType dtype, Device device, Generator* gen) {
  Tensor out = Tensor::empty(shape, dtype, device);
  Generator& g = pick(gen, device);
  const uint64_t offset = g.advance(static_cast<uint64_t>(out.numel()));
  SKA_KERNEL(device, random_uniform)(out, g.seed(), offset, 0.0, 1.0, g.capture_base());
  return out;
}

Tensor randn(const Shape& shape, DType dtype, Device device, Generator* gen) {
  Tensor out = Tensor::empty(shape, dtype, device);
  Generator& g = pick(gen, device);
  const uint64_t offset = g.advance(static_cast<uint64_t>(out.numel()));
  SKA_KERNEL(device, random_normal)(out, g.seed(), offset, 0.0, 1.0, g.capture_base());
  return out;
}

// Dropout draws its mask in the kernel as it multiplies. When autograd records the op, the
// kernel also keeps the mask as bits (one per element: 1/16 of a bf16 activation), so that the
// backward pass reads them instead of drawing the mask again; without a graph nothing is kept.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return x;
  SKA_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  detail::check_floating("dropout", x);
  const double keep = 1.0 - p, scale = 1.0 / keep;
  Generator& g = pick(gen, x.device());
  const uint64_t seed = g.seed(), offset = g.advance(static_cast<uint64_t>(x.numel()));
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (!autograd::needs_grad({x})) {
    SKA_KERNEL(x.device(), dropout_apply)(xc, seed, offset, keep, scale, g.capture_base(), out);
    return out;
  }
  const Tensor bits = Tensor::empty({(x.numel() + 7) / 8}, DType::kU8, x.device());
  SKA_KERNEL(x.device(), dropout_forward)(xc, seed, offset, keep, scale, g.capture_base(), out,
                                          bits);
  autograd::record_op("dropout", {x}, {out}, [=](const TensorList& grad) {
    const Tensor gc = grad[0].contiguous();
    Tensor gx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    SKA_KERNEL(gc.device(), dropout_backward)(gc, bits, scale, gx);
    return TensorList{gx};
  });
  return out;
}

Tensor gelu_dropout(const Tensor& x, double p, bool training, bool tanh_approximation,
                    Generator* gen) {
  const char* name = tanh_approximation ? "gelu_tanh" : "gelu";
  if (auto cast = autocast_inputs(name, {x})) {
    return gelu_dropout((*cast)[0], p, training, tanh_approximation, gen);
  }
  if (!training || p == 0.0 || !autograd::needs_grad({x})) {
    return dropout(gelu(x, tanh_approximation), p, training, gen);
  }
  SKA_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  detail::check_floating(name, x);
  const UnaryOp op = tanh_approximation ? UnaryOp::kGeluTanh : UnaryOp::kGelu;
  const double keep = 1.0 - p, scale = 1.0 / keep;
  Generator& g = pick(gen, x.device());
  const uint64_t seed = g.seed(), offset = g.advance(static_cast<uint64_t>(x.numel()));
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor bits = Tensor::empty({(x.numel() + 7) / 8}, DType::kU8, x.device());
  SKA_KERNEL(x.device(), unary_dropout_forward)(op, xc, 0.0, 0.0, seed, offset, keep, scale,
                                                g.capture_base(), out, bits);
  autograd::record_op("gelu_dropout", {x}, {out}, [=](const TensorList& grad) {
    const Tensor gc = grad[0].contiguous();
    Tensor gx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    SKA_KERNEL(gc.device(), unary_dropout_backward)(op, gc, bits, scale, xc, 0.0, 0.0, gx);
    return TensorList{gx};
  });
  return out;
}

Tensor dropout_add(const Tensor& x, const Tensor& y, double p, bool training, Generator* gen) {
  // No autocast cast here: the pairs the kernels take are ones add's autocast leaves alone, and
  // for the others the ops below cast after the dropout, as the two ops do.
  const auto is_16bit = [](DType d) { return d == DType::kBF16 || d == DType::kF16; };
  const bool dtypes =
      (x.dtype() == y.dtype() && (x.dtype() == DType::kF32 || is_16bit(x.dtype()))) ||
      (x.dtype() == DType::kF32 && is_16bit(y.dtype()));
  if (!training || p == 0.0 || !autograd::needs_grad({y}) || !dtypes || x.shape() != y.shape() ||
      x.device() != y.device()) {
    return add(x, dropout(y, p, training, gen));
  }
  SKA_CHECK(p > 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  const double keep = 1.0 - p, scale = 1.0 / keep;
  Generator& g = pick(gen, y.device());
  const uint64_t seed = g.seed(), offset = g.advance(static_cast<uint64_t>(y.numel()));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor bits = Tensor::empty({(y.numel() + 7) / 8}, DType::kU8, y.device());
  SKA_KERNEL(x.device(), dropout_add_forward)
  (x.detach().contiguous(), y.detach().contiguous(), seed, offset, keep, scale, g.capture_base(),
   out, bits);
  const bool need_x = x.requires_grad();
  const DType out_dtype = out.dtype(), y_dtype = y.dtype();
  const Shape y_shape = y.shape();
  autograd::record_op("dropout_add", {x, y}, {out}, [=](const TensorList& grad) {
    const Tensor gc = grad[0].to(out_dtype).contiguous();
    Tensor gy = Tensor::empty(y_shape, y_dtype, gc.device());
    SKA_KERNEL(gc.device(), dropout_add_backward)(gc, bits, scale, gy);
    return TensorList{need_x ? gc : Tensor(), gy};
  });
  return out;
}

DropoutDraw dropout_draw(const Tensor& like, double p, Generator* gen) {
  SKA_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  Generator& g = pick(gen, like.device());
  DropoutDraw drop;
  drop.seed = g.seed();
  drop.offset = g.advance(static_cast<uint64_t>(like.numel()));
  drop.keep_prob = 1.0 - p;
  drop.scale = 1.0 / drop.keep_prob;
  drop.offset_base = g.capture_base();
  drop.bits = Tensor::empty({(like.numel() + 7) / 8}, DType::kU8, like.device());
  return drop;
}

Tensor drop_path(const Tensor& x, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return x;
  detail::check_floating("drop_path", x);
  SKA_CHECK(x.dim() >= 1, ShapeError, "drop_path: x needs a batch dim, got ", x.str());
  return apply_drop_path_factors(
      x, drop_path_factors(x.size(0), p, training, x.dtype(), x.device(), gen));
}

Tensor apply_drop_path_factors(const Tensor& x, const Tensor& factors) {
  if (!factors.defined()) return x;
  Shape per_sample(static_cast<size_t>(x.dim()), 1);
  per_sample[0] = factors.numel();
  return mul(x, factors.view(per_sample));
}

Tensor drop_path_factors(int64_t batch, double p, bool training, DType dtype, Device device,
                         Generator* gen) {
  if (!training || p == 0.0) return Tensor();
  SKA_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  const double keep = 1.0 - p;
  Tensor factors = Tensor::empty({batch}, dtype, device);
  Generator& g = pick(gen, device);
  const uint64_t offset = g.advance(static_cast<uint64_t>(batch));
  SKA_KERNEL(device, random_bernoulli)
  (factors, g.seed(), offset, keep, 1.0 / keep, g.capture_base());
  return factors;
}

}  // namespace ska
