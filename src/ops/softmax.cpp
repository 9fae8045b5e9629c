// Softmax and log-softmax over the last dim with scale and additive mask, and their gradients.
// The mask gets dL/dz (z = scale * x + mask) summed over the dims it was broadcast along.
#include "ops/softmax.h"

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/pointwise.h"
#include "ops/reduce.h"

namespace ska {

namespace {

// The mask as a stride-0 view with x's shape; it must broadcast to x without growing x.
Tensor mask_view(const char* name, const Tensor& x, const Tensor& mask) {
  if (!mask.defined()) return Tensor();
  detail::check_same_device_dtype(name, x, mask);
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), name);
  SKA_CHECK(shape == x.shape(), ShapeError, name, ": mask ", shape_str(mask.shape()),
            " does not broadcast to the input ", shape_str(x.shape()));
  return detail::broadcast_raw(mask.detach(), x.shape());
}

Tensor softmax_op(const char* name, bool log, const Tensor& x, double scale, const Tensor& mask) {
  if (auto cast = autocast_inputs(name, {x, mask})) {
    return softmax_op(name, log, (*cast)[0], scale, (*cast)[1]);
  }
  detail::check_floating(name, x);
  SKA_CHECK(x.dim() >= 1, ShapeError, name, ": expected at least 1 dim, got a 0-d tensor");
  const Tensor xc = x.contiguous().detach();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  SKA_KERNEL(x.device(), softmax_forward)(xc, mask_view(name, x, mask), scale, log, y);

  const bool need_x = x.requires_grad();
  const bool need_mask = mask.defined() && mask.requires_grad();
  const Shape mask_shape = mask.defined() ? mask.shape() : Shape();
  const Tensor saved_y = y.detach();
  autograd::record_op(name, {x, mask}, {y}, [=](const TensorList& g) {
    const Tensor gy = g[0].contiguous();
    Tensor dz = Tensor::empty(saved_y.shape(), saved_y.dtype(), saved_y.device());
    // Without a mask gradient, fold the scale into the kernel and skip a pass.
    const double kernel_scale = need_mask ? 1.0 : scale;
    SKA_KERNEL(saved_y.device(), softmax_backward)(saved_y, gy, kernel_scale, log, dz);
    if (!need_mask) return TensorList{dz, Tensor()};
    return TensorList{need_x ? mul(dz, scale) : Tensor(), sum_to_shape(dz, mask_shape)};
  });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, double scale, const Tensor& mask) {
  return softmax_op("softmax", false, x, scale, mask);
}

Tensor log_softmax(const Tensor& x, double scale, const Tensor& mask) {
  return softmax_op("log_softmax", true, x, scale, mask);
}

}  // namespace ska
