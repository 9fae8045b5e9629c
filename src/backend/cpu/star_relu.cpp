// CPU kernels: StarReLU (scale * relu(x)^2 + bias) forward, and its backward with the two
// parameter gradients summed in f64 over fixed chunks, combined in order (deterministic).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

constexpr int64_t kChunk = 16384;  // elements per partial sum of the parameter gradients

bool any_16bit(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined() && is_16bit_float(t->dtype())) return true;
  }
  return false;
}

}  // namespace

void star_relu_forward(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& y) {
  if (any_16bit({&x, &scale, &bias, &y})) {  // f32 math on widened copies, one rounding
    const Tensor result = f32_output(y);
    star_relu_forward(widen_f32(x), widen_f32(scale), widen_f32(bias), result);
    return round_into(result, y);
  }
  SKA_CHECK(x.dtype() == scale.dtype() && x.dtype() == y.dtype() && x.is_contiguous(), DTypeError,
            "star_relu_forward: x, scale and y must share one dtype, x contiguous");
  dispatch_floating(x.dtype(), "star_relu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const T s = scale.data<T>()[0], b = bias.data<T>()[0];
    parallel_for(x.numel(), [&](int64_t i) {
      const T r = xp[i] > T(0) ? xp[i] : T(0);
      yp[i] = s * (r * r) + b;
    });
  });
}

void star_relu_backward(const Tensor& grad_y, const Tensor& x, const Tensor& scale,
                        const Tensor& grad_x, const Tensor& grad_scale, const Tensor& grad_bias) {
  if (any_16bit({&grad_y, &x, &scale, &grad_x, &grad_scale, &grad_bias})) {
    const Tensor gx = f32_output(grad_x);
    const Tensor gs = grad_scale.defined() ? f32_output(grad_scale) : Tensor();
    const Tensor gb = grad_bias.defined() ? f32_output(grad_bias) : Tensor();
    star_relu_backward(widen_f32(grad_y), widen_f32(x), widen_f32(scale), gx, gs, gb);
    round_into(gx, grad_x);
    if (gs.defined()) round_into(gs, grad_scale);
    if (gb.defined()) round_into(gb, grad_bias);
    return;
  }
  SKA_CHECK(x.dtype() == grad_y.dtype() && x.dtype() == scale.dtype() && x.is_contiguous() &&
                grad_y.is_contiguous(),
            DTypeError, "star_relu_backward: operands must share one dtype and be contiguous");
  dispatch_floating(x.dtype(), "star_relu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* gxp = static_cast<T*>(grad_x.data_ptr());
    const T twice_s = T(2) * scale.data<T>()[0];
    const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part_s(static_cast<size_t>(chunks)), part_b(static_cast<size_t>(chunks));
    parallel_for(chunks, [&](int64_t c) {
      double acc_s = 0.0, acc_b = 0.0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        const T r = xp[i] > T(0) ? xp[i] : T(0);
        gxp[i] = gp[i] * twice_s * r;
        acc_s += static_cast<double>(gp[i]) * static_cast<double>(r * r);
        acc_b += static_cast<double>(gp[i]);
      }
      part_s[static_cast<size_t>(c)] = acc_s;
      part_b[static_cast<size_t>(c)] = acc_b;
    }, 1);
    double sum_s = 0.0, sum_b = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      sum_s += part_s[static_cast<size_t>(c)];
      sum_b += part_b[static_cast<size_t>(c)];
    }
    if (grad_scale.defined()) grad_scale.data<T>()[0] = static_cast<T>(sum_s);
    if (grad_bias.defined()) grad_bias.data<T>()[0] = static_cast<T>(sum_b);
  });
}

}  // namespace ska::cpu
