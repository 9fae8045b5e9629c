// CPU kernels: fused in-place optimizer updates (Adam family, SGD). Twins of
// cuda/kernels/optim.cu; the math runs in the parameter's dtype (f32 or f64), as PyTorch does.
// The step count and the skip flag are read from their (host) tensors, as the CUDA kernels read
// them on the device.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/skip_flag.h"

namespace ska::cpu {

namespace {

// The divisor of the gradient: 1 when `divisor` is undefined, else its single value.
double read_divisor(const Tensor& divisor) {
  if (!divisor.defined()) return 1.0;
  SKA_CHECK(divisor.numel() == 1, ShapeError, "adam_step: grad_divisor must have one element, got ",
            shape_str(divisor.shape()));
  double value = 1.0;
  dispatch_floating(divisor.dtype(), "adam_step", [&](auto tag) {
    using T = decltype(tag);
    value = static_cast<double>(*static_cast<const T*>(divisor.data_ptr()));
  });
  return value;
}

// The update count `step` (one i64 element, >= 1).
int64_t read_step(const Tensor& step) {
  SKA_CHECK(step.numel() == 1 && step.dtype() == DType::kI64, DTypeError,
            "adam_step: step must be one i64 element, got ", step.str());
  const int64_t value = *static_cast<const int64_t*>(step.data_ptr());
  SKA_CHECK(value >= 1, ValueError, "adam_step: step must be >= 1, got ", value);
  return value;
}

}  // namespace

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& grad_divisor,
               const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& update,
               const Tensor& step, const Tensor& skip, const Tensor& lr, double beta1,
               double beta2, double eps, double l2_decay, double decoupled_decay) {
  if (read_skip(skip, "adam_step")) {
    if (update.defined()) Tensor(update).fill_(0.0);
    return;
  }
  const double lr_value = update.defined() ? 0.0 : read_lr(lr, "adam_step");
  const double t = static_cast<double>(read_step(step));
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const double inv_divisor = 1.0 / read_divisor(grad_divisor);
  dispatch_floating(param.dtype(), "adam_step", [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    T* u_out = update.defined() ? update.data<T>() : nullptr;
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
    const T bc1 = static_cast<T>(bias_correction1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T e = static_cast<T>(eps), l2 = static_cast<T>(l2_decay);
    const T wd = static_cast<T>(decoupled_decay), step = static_cast<T>(lr_value);
    const T scale = static_cast<T>(inv_divisor);
    parallel_for(param.numel(), [&](int64_t i) {
      const T gi = g[i] * scale + l2 * p[i];
      m[i] = b1 * m[i] + (T(1) - b1) * gi;
      v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
      const T u = (m[i] / bc1) / (std::sqrt(v[i]) / bc2_sqrt + e) + wd * p[i];
      if (u_out != nullptr) {
        u_out[i] = u;
      } else {
        p[i] -= step * u;
      }
    });
  });
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const Tensor& skip, const Tensor& lr, double momentum, double weight_decay,
              bool nesterov) {
  if (read_skip(skip, "sgd_step")) return;
  const double lr_value = read_lr(lr, "sgd_step");
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = momentum_buf.defined() ? momentum_buf.data<T>() : nullptr;
    const T mu = static_cast<T>(momentum), wd = static_cast<T>(weight_decay);
    const T step = static_cast<T>(lr_value);
    parallel_for(param.numel(), [&](int64_t i) {
      T d = g[i] + wd * p[i];
      if (buf != nullptr) {
        buf[i] = mu * buf[i] + d;
        d = nesterov ? d + mu * buf[i] : buf[i];
      }
      p[i] -= step * d;
    });
  });
}

void advance_counts(const Tensor& counts, const Tensor& skip) {
  SKA_CHECK(counts.dtype() == DType::kI64 && counts.is_contiguous(), DTypeError,
            "advance_counts: counts must be a contiguous i64 tensor, got ", counts.str());
  if (read_skip(skip, "advance_counts")) return;
  int64_t* c = counts.data<int64_t>();
  for (int64_t i = 0; i < counts.numel(); ++i) ++c[i];
}

void record_update(const Tensor& stats, const Tensor& loss, const Tensor& skip) {
  SKA_CHECK(stats.dtype() == DType::kF32 && stats.numel() == 5 && stats.is_contiguous(),
            DTypeError, "record_update: stats must be 5 contiguous f32 values, got ", stats.str());
  SKA_CHECK(loss.dtype() == DType::kF32 && loss.numel() == 1, DTypeError,
            "record_update: loss must be one f32 element, got ", loss.str());
  SKA_CHECK(skip.defined(), ValueError, "record_update: skip must be defined");
  float* s = stats.data<float>();
  if (read_skip(skip, "record_update")) {
    s[2] += 1.0f;
    s[3] += 1.0f;
    s[4] = std::max(s[4], s[3]);
  } else {
    s[0] += *static_cast<const float*>(loss.data_ptr());
    s[1] += 1.0f;
    s[3] = 0.0f;
  }
}

}  // namespace ska::cpu
