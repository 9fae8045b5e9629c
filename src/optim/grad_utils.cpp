// Gradient zeroing, clipping and the non-finite flag, on the grads' device without host round
// trips: one multi-tensor sweep (backend multi_grad_stats / multi_scale) over grads of one
// 16- or 32-bit dtype, the library's ops per tensor otherwise (f64, mixed dtypes).
#include "optim/grad_utils.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "backend/backend.h"
#include "ops/ops.h"

namespace ska::optim {

namespace {

TensorList defined_grads(const TensorList& params) {
  TensorList grads;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    SKA_CHECK(grads.empty() || g.device() == grads.front().device(), DeviceError,
              "gradient utilities need every grad on one device; got ", grads.front().device(),
              " and ", g.device());
    grads.push_back(g);
  }
  return grads;
}

DType accumulation_dtype(const Tensor& g) {
  return g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
}

// True when the multi-tensor kernels take these grads: one dtype, f32 or narrower, contiguous.
bool multi_tensor_ok(const TensorList& grads) {
  for (const Tensor& g : grads) {
    if (g.dtype() != grads.front().dtype() || g.dtype() == DType::kF64 || !g.is_contiguous()) {
      return false;
    }
  }
  return !grads.empty();
}

// {sum of squares, sum of 0 * x} (f32 [2] on the grads' device) after grads *= scale.
Tensor grad_stats(const TensorList& grads, double scale) {
  const Tensor stats = Tensor::empty({2}, DType::kF32, grads.front().device());
  SKA_KERNEL(stats.device(), multi_grad_stats)(grads, scale, stats);
  return stats;
}

Tensor element(const Tensor& t, int64_t i) { return t.narrow(0, i, 1).reshape({}); }

// grads *= min(max_norm / (norm + 1e-6), 1), on the device.
void scale_to_norm(const TensorList& grads, const Tensor& norm, double max_norm,
                   bool multi_tensor) {
  const Tensor one = Tensor::ones({}, norm.dtype(), norm.device());
  const Tensor coef = minimum(mul(reciprocal(add(norm, 1e-6)), max_norm), one);
  if (multi_tensor) {
    SKA_KERNEL(coef.device(), multi_scale)(grads, coef.to(DType::kF32));
    return;
  }
  for (Tensor g : grads) g.copy_(mul(g, coef.to(g.dtype())));
}

}  // namespace

Tensor nonfinite_flag(const Tensor& x) {
  NoGradGuard no_grad;
  const Tensor zero = mul(x, 0.0);  // NaN exactly where x is inf or NaN
  return ne(zero, zero);
}

void zero_grad(const TensorList& params, bool set_to_none) {
  for (const Tensor& p : params) {
    if (set_to_none) {
      p.zero_grad();
    } else if (p.grad().defined()) {
      p.grad().fill_(0.0);
    }
  }
}

Tensor grad_norm(const TensorList& params) {
  NoGradGuard no_grad;
  const TensorList grads = defined_grads(params);
  if (grads.empty()) return Tensor::zeros({}, DType::kF32);
  if (multi_tensor_ok(grads)) return sqrt(element(grad_stats(grads, 1.0), 0));
  const DType acc = accumulation_dtype(grads.front());
  Tensor total;
  for (const Tensor& g : grads) {
    const Tensor x = g.to(acc);
    const Tensor squares = sum(mul(x, x));
    total = total.defined() ? add(total, squares) : squares;
  }
  return sqrt(total);
}

Tensor clip_grad_norm(const TensorList& params, double max_norm) {
  SKA_CHECK(max_norm > 0, ValueError, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  NoGradGuard no_grad;
  const Tensor norm = grad_norm(params);
  const TensorList grads = defined_grads(params);
  if (!grads.empty()) scale_to_norm(grads, norm, max_norm, multi_tensor_ok(grads));
  return norm;
}

void clip_grad_value(const TensorList& params, double clip_value) {
  SKA_CHECK(clip_value > 0, ValueError, "clip_grad_value: clip_value must be > 0, got ",
            clip_value);
  NoGradGuard no_grad;
  for (Tensor g : defined_grads(params)) {
    const Tensor hi = Tensor::full({}, clip_value, g.dtype(), g.device());
    const Tensor lo = Tensor::full({}, -clip_value, g.dtype(), g.device());
    g.copy_(minimum(maximum(g, lo), hi));
  }
}

namespace {

// Multiplies each grad by inv_scale in place (unless it is 1) and flags non-finite results.
Tensor scaled_grads_nonfinite(const TensorList& params, double inv_scale) {
  NoGradGuard no_grad;
  const TensorList grads = defined_grads(params);
  if (grads.empty()) return Tensor::zeros({}, DType::kU8);
  if (multi_tensor_ok(grads)) return nonfinite_flag(element(grad_stats(grads, inv_scale), 1));
  // 0 * x is NaN exactly for inf and NaN, so the sum of the zeros is NaN iff one was non-finite.
  const DType acc = accumulation_dtype(grads.front());
  Tensor total;
  for (Tensor g : grads) {
    if (inv_scale != 1.0) g.copy_(mul(g, inv_scale));
    const Tensor zeros = sum(mul(g.to(acc), 0.0));
    total = total.defined() ? add(total, zeros) : zeros;
  }
  return ne(total, total);
}

}  // namespace

Tensor grads_nonfinite(const TensorList& params) { return scaled_grads_nonfinite(params, 1.0); }

Tensor unscale_grads_nonfinite(const TensorList& params, double inv_scale) {
  SKA_CHECK(std::isfinite(inv_scale) && inv_scale > 0.0, ValueError,
            "unscale_grads_nonfinite: inv_scale must be positive and finite, got ", inv_scale);
  return scaled_grads_nonfinite(params, inv_scale);
}

Tensor unscale_check_clip(const TensorList& params, double inv_scale, double max_norm) {
  SKA_CHECK(std::isfinite(inv_scale) && inv_scale > 0.0, ValueError,
            "unscale_check_clip: inv_scale must be positive and finite, got ", inv_scale);
  SKA_CHECK(max_norm >= 0, ValueError, "unscale_check_clip: max_norm must be >= 0, got ",
            max_norm);
  NoGradGuard no_grad;
  const TensorList grads = defined_grads(params);
  if (grads.empty()) return Tensor::zeros({}, DType::kU8);
  if (!multi_tensor_ok(grads)) {  // the per-tensor ops
    const Tensor flag = scaled_grads_nonfinite(params, inv_scale);
    if (max_norm == 0) return flag;
    const Tensor norm_flag = nonfinite_flag(clip_grad_norm(params, max_norm));
    return where(flag, flag, norm_flag.to(flag.device()));
  }
  const Tensor stats = grad_stats(grads, inv_scale);
  if (max_norm == 0) return nonfinite_flag(element(stats, 1));
  // With clipping an overflowing norm skips the update too (its coefficient would be 0).
  scale_to_norm(grads, sqrt(element(stats, 0)), max_norm, true);
  return nonfinite_flag(sum(stats));
}

}  // namespace ska::optim
