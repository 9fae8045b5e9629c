// Cross-entropy with label smoothing and class-index or soft targets, and its gradients.
// The fused kernel gives one loss per row; the batch mean is an ordinary (differentiable) mean.
#include "ops/loss.h"

#include <cstdint>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/pointwise.h"
#include "ops/reduce.h"

namespace ska {

namespace {

// Per-row losses and log-sum-exps are f32, or f64 for f64 logits (exact gradient checks).
DType loss_dtype(DType logits_dtype) {
  return logits_dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

void check_target(const Tensor& logits, const Tensor& target) {
  const int64_t rows = logits.shape()[0];
  SKA_CHECK(target.device() == logits.device(), DeviceError, "cross_entropy: target on ",
            target.device(), ", logits on ", logits.device());
  if (target.dtype() == DType::kI64) {
    SKA_CHECK(target.dim() == 1 && target.shape()[0] == rows, ShapeError,
              "cross_entropy: class targets must be [", rows, "] for logits ",
              shape_str(logits.shape()), ", got ", shape_str(target.shape()));
    return;
  }
  SKA_CHECK(target.is_floating(), DTypeError,
            "cross_entropy: target must be i64 class indices or floating probabilities, got ",
            dtype_name(target.dtype()));
  detail::check_same_device_dtype("cross_entropy", logits, target);
  SKA_CHECK(target.shape() == logits.shape(), ShapeError,
            "cross_entropy: soft targets must have the logits' shape ", shape_str(logits.shape()),
            ", got ", shape_str(target.shape()));
}

// Gradient of the per-row losses w.r.t. soft targets: -(1 - eps) * g_n * log_softmax(x)_nj.
Tensor soft_target_grad(const Tensor& logits, const Tensor& lse, const Tensor& grad_rows,
                        double smoothing) {
  const Tensor log_probs = sub(logits, lse.to(logits.dtype()).unsqueeze(1));
  return mul(mul(log_probs, grad_rows.to(logits.dtype()).unsqueeze(1)), -(1.0 - smoothing));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing) {
  if (auto cast = autocast_inputs("cross_entropy", {logits, target})) {
    return cross_entropy((*cast)[0], (*cast)[1], label_smoothing);
  }
  detail::check_floating("cross_entropy", logits);
  detail::check_dim("cross_entropy", logits, 2, "logits");
  SKA_CHECK(logits.shape()[1] > 0, ShapeError, "cross_entropy: logits ",
            shape_str(logits.shape()), " have no classes");
  SKA_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
            "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  check_target(logits, target);

  const Tensor x = logits.contiguous().detach(), t = target.contiguous().detach();
  const int64_t rows = logits.shape()[0];
  const DType dt = loss_dtype(logits.dtype());
  Tensor row_loss = Tensor::empty({rows}, dt, logits.device());
  const Tensor lse = Tensor::empty({rows}, dt, logits.device());
  SKA_KERNEL(x.device(), cross_entropy_forward)(x, t, label_smoothing, row_loss, lse);

  const bool soft = target.dtype() != DType::kI64;
  const bool need_target = soft && target.requires_grad();
  const Tensor target_input = soft ? target : Tensor();
  autograd::record_op("cross_entropy", {logits, target_input}, {row_loss},
                      [=](const TensorList& g) {
    const Tensor grad_rows = g[0].contiguous();
    Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
    SKA_KERNEL(x.device(), cross_entropy_backward)(x, lse, t, label_smoothing, grad_rows, gx);
    const Tensor gt = need_target ? soft_target_grad(x, lse, grad_rows, label_smoothing) : Tensor();
    return TensorList{gx, gt};
  });
  return mean(row_loss);
}

}  // namespace ska
