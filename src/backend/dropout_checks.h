// The operands of the kernels with a dropout inside (dropout_add_forward / _backward, and
// scaled_residual's DropoutDraw; backend/kernels.inc), checked alike by the CPU twins and the CUDA
// kernels.
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ska {

namespace detail {

inline bool dropout_add_pair(DType wide, DType narrow) {
  const bool wide_ok = wide == DType::kF32 || wide == DType::kBF16 || wide == DType::kF16;
  return wide_ok && (narrow == wide ||
                     (wide == DType::kF32 && (narrow == DType::kBF16 || narrow == DType::kF16)));
}

}  // namespace detail

// A dropout mask's bits for `like`'s elements: (n + 7) / 8 contiguous u8 bytes on its device.
inline void check_dropout_bits(const char* kernel, const Tensor& bits, const Tensor& like) {
  SKA_CHECK(bits.dtype() == DType::kU8 && bits.is_contiguous() &&
                bits.numel() == (like.numel() + 7) / 8 && bits.device() == like.device(),
            ValueError, kernel, ": bits must be ", (like.numel() + 7) / 8,
            " contiguous u8 bytes on ", like.device(), ", got ", bits.str());
}

// An active DropoutDraw of `like`'s elements: its bits as check_dropout_bits checks them, and an
// offset_base (a CUDA Graph capture's) undefined or one i64 element on like's device.
inline void check_dropout_draw(const char* kernel, const DropoutDraw& drop, const Tensor& like) {
  check_dropout_bits(kernel, drop.bits, like);
  if (drop.offset_base.defined()) {
    SKA_CHECK(drop.offset_base.device() == like.device(), DeviceError, kernel, ": offset_base on ",
              drop.offset_base.device(), ", expected ", like.device());
    SKA_CHECK(drop.offset_base.numel() == 1 && drop.offset_base.dtype() == DType::kI64, DTypeError,
              kernel, ": offset_base must be one i64 element, got ", drop.offset_base.str());
  }
  SKA_CHECK(drop.keep_prob > 0.0 && drop.keep_prob <= 1.0, ValueError, kernel,
            ": keep_prob must be in (0, 1], got ", drop.keep_prob);
}

// x, y and out contiguous, of one shape and device; out of x's dtype (f32, bf16 or f16), y of it
// or bf16/f16 with f32; bits as dropout_forward's for y. ShapeError / DTypeError / DeviceError /
// ValueError naming `kernel` and the operand otherwise.
inline void check_dropout_add_forward(const char* kernel, const Tensor& x, const Tensor& y,
                                      const Tensor& out, const Tensor& bits) {
  SKA_CHECK(x.shape() == y.shape() && out.shape() == x.shape() && x.is_contiguous() &&
                y.is_contiguous() && out.is_contiguous(),
            ShapeError, kernel, ": x ", x.str(), ", y ", y.str(), " and out ", out.str(),
            " must be contiguous, of one shape");
  SKA_CHECK(x.device() == y.device() && out.device() == x.device(), DeviceError, kernel,
            ": x, y and out on different devices (", x.device(), ", ", y.device(), ", ",
            out.device(), ")");
  SKA_CHECK(out.dtype() == x.dtype() && detail::dropout_add_pair(x.dtype(), y.dtype()), DTypeError,
            kernel, ": x ", dtype_name(x.dtype()), ", y ", dtype_name(y.dtype()), ", out ",
            dtype_name(out.dtype()),
            "; expected out of x's dtype (f32, bf16 or f16) and y of it, or bf16/f16 with f32");
  check_dropout_bits(kernel, bits, y);
}

// grad and grad_y contiguous, of one size and device; grad_y of grad's dtype (f32, bf16 or f16),
// or bf16/f16 with an f32 grad; bits for grad's elements.
inline void check_dropout_add_backward(const char* kernel, const Tensor& grad, const Tensor& bits,
                                       const Tensor& grad_y) {
  SKA_CHECK(grad.numel() == grad_y.numel() && grad.is_contiguous() && grad_y.is_contiguous(),
            ShapeError, kernel, ": grad ", grad.str(), " and grad_y ", grad_y.str(),
            " must be contiguous, of one size");
  SKA_CHECK(grad.device() == grad_y.device(), DeviceError, kernel, ": grad on ", grad.device(),
            ", grad_y on ", grad_y.device());
  SKA_CHECK(detail::dropout_add_pair(grad.dtype(), grad_y.dtype()), DTypeError, kernel, ": grad ",
            dtype_name(grad.dtype()), ", grad_y ", dtype_name(grad_y.dtype()),
            "; expected grad_y of grad's dtype (f32, bf16 or f16), or bf16/f16 with f32");
  check_dropout_bits(kernel, bits, grad);
}

}  // namespace ska
