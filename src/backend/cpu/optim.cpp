// CPU kernels: fused in-place optimizer updates (Adam family, SGD). Twins of
// cuda/kernels/optim.cu; the math runs in the parameter's dtype (f32 or f64), as PyTorch does.
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

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

}  // namespace

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& grad_divisor,
               const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& update, double lr,
               double beta1, double beta2, double eps, double bias_correction1,
               double bias_correction2, double l2_decay, double decoupled_decay) {
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
    const T wd = static_cast<T>(decoupled_decay), step = static_cast<T>(lr);
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

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
              double momentum, double weight_decay, bool nesterov) {
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = momentum_buf.defined() ? momentum_buf.data<T>() : nullptr;
    const T mu = static_cast<T>(momentum), wd = static_cast<T>(weight_decay);
    const T step = static_cast<T>(lr);
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

}  // namespace ska::cpu
