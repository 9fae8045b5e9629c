// Random tensors, dropout and drop-path.
#include "ops/random.h"

#include <cstdint>

#include "backend/backend.h"
#include "ops/detail.h"
#include "ops/pointwise.h"

namespace ska {

namespace {
Generator& pick(Generator* gen, Device device) { return gen ? *gen : default_generator(device); }
}  // namespace

Tensor rand(const Shape& shape, DType dtype, Device device, Generator* gen) {
  Tensor out = Tensor::empty(shape, dtype, device);
  const uint64_t offset = pick(gen, device).advance(static_cast<uint64_t>(out.numel()));
  SKA_KERNEL(device, random_uniform)(out, pick(gen, device).seed(), offset, 0.0, 1.0);
  return out;
}

Tensor randn(const Shape& shape, DType dtype, Device device, Generator* gen) {
  Tensor out = Tensor::empty(shape, dtype, device);
  const uint64_t offset = pick(gen, device).advance(static_cast<uint64_t>(out.numel()));
  SKA_KERNEL(device, random_normal)(out, pick(gen, device).seed(), offset, 0.0, 1.0);
  return out;
}

namespace {

// x * mask where mask has `mask_shape` (broadcast to x) and holds 0 or 1 / keep.
Tensor apply_keep_mask(const Tensor& x, const Shape& mask_shape, double p, Generator* gen) {
  SKA_CHECK(p >= 0.0 && p < 1.0, ValueError, "dropout probability must be in [0, 1), got ", p);
  detail::check_floating("dropout", x);
  const double keep = 1.0 - p;
  Tensor mask = Tensor::empty(mask_shape, x.dtype(), x.device());
  Generator& g = pick(gen, x.device());
  const uint64_t offset = g.advance(static_cast<uint64_t>(mask.numel()));
  SKA_KERNEL(x.device(), random_bernoulli)(mask, g.seed(), offset, keep, 1.0 / keep,
                                           g.capture_base());
  return mul(x, mask);
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return x;
  return apply_keep_mask(x, x.shape(), p, gen);
}

Tensor drop_path(const Tensor& x, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return x;
  Shape mask_shape(static_cast<size_t>(x.dim()), 1);
  mask_shape[0] = x.size(0);
  return apply_keep_mask(x, mask_shape, p, gen);
}

}  // namespace ska
