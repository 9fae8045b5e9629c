// The operands of add_layer_norm_forward / _backward (backend/kernels.inc) that the CPU twin and
// the CUDA kernels check alike: the branch's dropout and the branch's gradient.
#pragma once

#include "backend/dropout_checks.h"
#include "backend/kernel_types.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ska {

// An active dropout of the branch: x of f32, bf16 or f16 with rows of a multiple of 8 elements
// (a byte of the mask never spans two rows), and the draw as check_dropout_draw checks it for
// `branch`'s elements (y in the forward pass, grad_branch in the backward).
inline void check_add_layer_norm_drop(const char* kernel, const DropoutDraw& drop, const Tensor& x,
                                      const Tensor& branch) {
  const DType dt = x.dtype();
  SKA_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16, DTypeError, kernel,
            ": a dropout of the branch needs x of f32, bf16 or f16, got ", dtype_name(dt));
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  SKA_CHECK(cols % 8 == 0, ShapeError, kernel,
            ": a dropout of the branch needs rows of a multiple of 8 elements, got x ", x.str());
  SKA_CHECK(branch.defined() && branch.numel() == x.numel(), ShapeError, kernel,
            ": a dropout of the branch needs the branch (its gradient) of x's size ",
            shape_str(x.shape()), ", got ", branch.defined() ? branch.str() : "none");
  check_dropout_draw(kernel, drop, branch);
}

// The dtype of the branch (or its gradient) beside x and grad_y: x's, or for an f32 x grad_y's
// bf16/f16 dtype or, with an f32 grad_y, bf16/f16.
inline void check_branch_dtype(const char* kernel, const char* what, DType branch, const Tensor& x,
                               const Tensor& grad_y) {
  const bool low = x.dtype() == DType::kF32 && (branch == DType::kBF16 || branch == DType::kF16) &&
                   (grad_y.dtype() == branch || grad_y.dtype() == DType::kF32);
  SKA_CHECK(branch == x.dtype() || low, DTypeError, kernel, ": ", what, " of dtype ",
            dtype_name(branch), " for x ", dtype_name(x.dtype()), " and grad_y ",
            dtype_name(grad_y.dtype()),
            "; expected x's dtype, or with an f32 x grad_y's bf16/f16 dtype or (an f32 grad_y) "
            "bf16/f16");
}

// grad_branch (undefined, or y's gradient) beside grad_x: contiguous, of x's size, in x's dtype or,
// for an f32 x, in grad_y's bf16/f16 dtype or (an f32 grad_y) in bf16/f16.
inline void check_add_layer_norm_grads(const char* kernel, const Tensor& x, const Tensor& grad_y,
                                       const Tensor& grad_x, const Tensor& grad_branch) {
  if (!grad_branch.defined()) return;
  SKA_CHECK(grad_branch.device() == x.device(), DeviceError, kernel, ": grad_branch on ",
            grad_branch.device(), ", x on ", x.device());
  SKA_CHECK(grad_x.defined() && grad_branch.is_contiguous() && grad_branch.numel() == x.numel(),
            ValueError, kernel, ": grad_branch needs grad_x and must be contiguous, of x's size ",
            shape_str(x.shape()), ", got ", grad_branch.str());
  check_branch_dtype(kernel, "grad_branch", grad_branch.dtype(), x, grad_y);
}

// grad_scale (undefined, or the gradient of the branch's scale, backend/kernels.inc): with the
// scale, grad_x and the branch y (contiguous, of x's size, in x's dtype or, for an f32 x, in
// grad_y's bf16/f16 dtype or, with an f32 grad_y, in bf16/f16); contiguous [C] of x's dtype.
inline void check_add_layer_norm_scale_grad(const char* kernel, const Tensor& x,
                                            const Tensor& grad_y, const Tensor& y,
                                            const Tensor& y_scale, const Tensor& grad_x,
                                            const Tensor& grad_scale) {
  if (!grad_scale.defined()) return;
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  SKA_CHECK(y_scale.defined() && grad_x.defined() && y.defined(), ValueError, kernel,
            ": the branch scale's gradient needs the scale, grad_x and the branch");
  SKA_CHECK(y.device() == x.device() && y.is_contiguous() && y.numel() == x.numel(), ValueError,
            kernel, ": the branch must be contiguous, of x's size ", shape_str(x.shape()), " on ",
            x.device(), ", got ", y.str());
  check_branch_dtype(kernel, "the branch", y.dtype(), x, grad_y);
  SKA_CHECK(grad_scale.device() == x.device() && grad_scale.dtype() == x.dtype() &&
                grad_scale.numel() == cols && grad_scale.is_contiguous(),
            ValueError, kernel, ": the branch scale's gradient must be a contiguous [", cols, "] ",
            dtype_name(x.dtype()), " tensor on ", x.device(), ", got ", grad_scale.str());
}

// The dtype of a norm's parameters: weight's, else bias's, else x's.
inline DType norm_param_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return weight.defined() ? weight.dtype() : bias.defined() ? bias.dtype() : x.dtype();
}

// The branch's scale (undefined for none): a contiguous [C] tensor of x's dtype on x's device, C
// x's last dim, with parameters of x's dtype (not autocast's 16-bit stream).
inline void check_add_layer_norm_scale(const char* kernel, const Tensor& y_scale, const Tensor& x,
                                       DType param_dtype) {
  if (!y_scale.defined()) return;
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  SKA_CHECK(y_scale.device() == x.device() && y_scale.dtype() == x.dtype() && y_scale.dim() == 1 &&
                y_scale.size(0) == cols && y_scale.is_contiguous(),
            ValueError, kernel, ": the branch's scale must be a contiguous [", cols, "] ",
            dtype_name(x.dtype()), " tensor on ", x.device(), ", got ", y_scale.str());
  SKA_CHECK(param_dtype == x.dtype(), DTypeError, kernel, ": a branch scale with ",
            dtype_name(param_dtype), " parameters for a ", dtype_name(x.dtype()),
            " x; expected parameters of x's dtype");
}

}  // namespace ska
