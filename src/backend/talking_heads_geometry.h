// The operands of the talking-heads softmax kernels (talking_heads_softmax_forward / _backward in
// backend/kernels.inc), checked alike by the CPU twin, the CUDA kernels and the op layer.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace ska {

struct TalkingHeadsGeometry {
  int64_t outer, heads, queries, keys;  // logits [outer, heads, queries, keys]
  int64_t rows() const { return outer * queries; }
};

// The dtype of the mixes and the log-sum-exps for logits of `dtype`: f64 for f64, else f32.
inline DType talking_heads_math_dtype(DType dtype) {
  return dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

// logits [R, h, Nq, Nk] contiguous, floating; `out` (the weights, or their gradient in the
// backward pass) and the optional `like_logits` (the logits' gradient) of its shape and dtype,
// contiguous; w_pre, w_post contiguous [h, h] of the math dtype; lse contiguous [R, h, Nq] of the
// math dtype; grad_pre / grad_post [h, h] of the math dtype, contiguous, or undefined; one
// device. ShapeError / DTypeError / DeviceError naming `kernel` and the operand otherwise.
inline TalkingHeadsGeometry talking_heads_geometry(const char* kernel, const Tensor& logits,
                                                   const Tensor& w_pre, const Tensor& w_post,
                                                   const Tensor& out, const Tensor& lse,
                                                   const Tensor& like_logits = Tensor(),
                                                   const Tensor& grad_pre = Tensor(),
                                                   const Tensor& grad_post = Tensor()) {
  SKA_CHECK(
      logits.defined() && w_pre.defined() && w_post.defined() && out.defined() && lse.defined(),
      ValueError, kernel, ": logits, w_pre, w_post, the weights and lse are required");
  SKA_CHECK(logits.dim() == 4 && logits.is_contiguous(), ShapeError, kernel,
            ": logits must be a contiguous [R, heads, queries, keys] tensor, got ", logits.str());
  const TalkingHeadsGeometry geo{logits.size(0), logits.size(1), logits.size(2), logits.size(3)};
  const DType math = talking_heads_math_dtype(logits.dtype());
  SKA_CHECK(logits.dtype() == DType::kF64 || logits.dtype() == DType::kF32 ||
                logits.dtype() == DType::kBF16 || logits.dtype() == DType::kF16,
            DTypeError, kernel, ": logits must be floating, got ", logits.str());
  for (const Tensor* t : {&out, &like_logits}) {
    if (!t->defined()) continue;
    SKA_CHECK(t->shape() == logits.shape() && t->is_contiguous() && t->dtype() == logits.dtype(),
              ShapeError, kernel, ": the weights and their gradients must be contiguous ",
              dtype_name(logits.dtype()), " ", shape_str(logits.shape()), ", got ", t->str());
  }
  for (const Tensor* t : {&w_pre, &w_post, &grad_pre, &grad_post}) {
    if (!t->defined()) continue;
    SKA_CHECK(t->dim() == 2 && t->size(0) == geo.heads && t->size(1) == geo.heads &&
                  t->is_contiguous() && t->dtype() == math,
              ShapeError, kernel, ": the head mixes and their gradients must be contiguous ",
              dtype_name(math), " [", geo.heads, ", ", geo.heads, "], got ", t->str());
  }
  SKA_CHECK(lse.shape() == Shape({geo.outer, geo.heads, geo.queries}) && lse.is_contiguous() &&
                lse.dtype() == math,
            ShapeError, kernel, ": lse must be a contiguous ", dtype_name(math), " [", geo.outer,
            ", ", geo.heads, ", ", geo.queries, "], got ", lse.str());
  for (const Tensor* t : {&w_pre, &w_post, &out, &lse, &like_logits, &grad_pre, &grad_post}) {
    SKA_CHECK(!t->defined() || t->device() == logits.device(), DeviceError, kernel,
              ": every operand must be on ", logits.device(), ", got ", t->str());
  }
  return geo;
}

// The backward kernels' operands: as above, with grad_out in the weights' place and grad_logits
// required.
inline TalkingHeadsGeometry talking_heads_backward_geometry(
    const char* kernel, const Tensor& grad_out, const Tensor& logits, const Tensor& w_pre,
    const Tensor& w_post, const Tensor& lse, const Tensor& grad_logits, const Tensor& grad_pre,
    const Tensor& grad_post) {
  SKA_CHECK(grad_logits.defined(), ValueError, kernel, ": grad_logits is required");
  return talking_heads_geometry(kernel, logits, w_pre, w_post, grad_out, lse, grad_logits, grad_pre,
                                grad_post);
}

}  // namespace ska
