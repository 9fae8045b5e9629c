// CPU kernels: copy, fill, unary (+ backward), binary, where.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/pointwise_f32.h"
#include "backend/cpu/widen.h"
#include "backend/pointwise_math.h"

namespace ska::cpu {

void copy(const Tensor& src, const Tensor& dst) {
  SKA_CHECK(src.shape() == dst.shape(), ShapeError, "copy: source ", shape_str(src.shape()),
            " and destination ", shape_str(dst.shape()), " differ");
  dispatch_all(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_all(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      if (src.is_contiguous() && dst.is_contiguous()) {
        parallel_for(dst.numel(), [&](int64_t i) { d[i] = convert<D>(s[i]); });
        return;
      }
      for_each_row<2>(dst.shape(), {src.strides(), dst.strides()},
                      [&](const auto& off, int64_t n, const auto& st) {
                        const S* sp = s + off[0];
                        D* dp = d + off[1];
                        if (st[0] == 1 && st[1] == 1) {  // rows contiguous on both sides (head
                          if constexpr (std::is_same_v<S, D>) {  // split/merge copies)
                            std::memcpy(dp, sp, static_cast<size_t>(n) * sizeof(D));
                          } else {
                            for (int64_t j = 0; j < n; ++j) dp[j] = convert<D>(sp[j]);
                          }
                          return;
                        }
                        for (int64_t j = 0; j < n; ++j) dp[j * st[1]] = convert<D>(sp[j * st[0]]);
                      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    T* d = static_cast<T*>(dst.data_ptr());
    if (dst.is_contiguous()) {
      parallel_for(dst.numel(), [&](int64_t i) { d[i] = v; });
      return;
    }
    for_each_row<1>(dst.shape(), {dst.strides()}, [&](const auto& off, int64_t n, const auto& st) {
      for (int64_t j = 0; j < n; ++j) d[off[0] + j * st[0]] = v;
    });
  });
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b) {
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(out);
    unary(op, widen_f32(x), result, a, b);
    return round_into(result, out);
  }
  if (x.dtype() == DType::kF32 && x.is_contiguous() && has_unary_f32_fast_path(op)) {
    unary_forward_f32(op, x.data<float>(), out.data<float>(), x.numel());
    return;
  }
  dispatch_floating(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      const T* xp = static_cast<const T*>(x.data_ptr());
      T* yp = static_cast<T*>(out.data_ptr());
      const T ta = static_cast<T>(a), tb = static_cast<T>(b);
      if (x.is_contiguous()) {
        parallel_for(x.numel(), [&](int64_t i) { yp[i] = pm::unary_forward<kOp, T>(xp[i], ta, tb); });
        return;
      }
      for_each_row<2>(x.shape(), {x.strides(), out.strides()},
                      [&](const auto& off, int64_t n, const auto& st) {
                        for (int64_t j = 0; j < n; ++j) {
                          yp[off[1] + j] = pm::unary_forward<kOp, T>(xp[off[0] + j * st[0]], ta, tb);
                        }
                      });
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& x, const Tensor& grad_x,
                    double a, double b) {
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(grad_x);
    unary_backward(op, widen_f32(grad_out), widen_f32(x), result, a, b);
    return round_into(result, grad_x);
  }
  if (x.dtype() == DType::kF32 && has_unary_f32_fast_path(op)) {
    unary_backward_f32(op, grad_out.data<float>(), x.data<float>(), grad_x.data<float>(),
                       x.numel());
    return;
  }
  dispatch_floating(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      const T* gp = static_cast<const T*>(grad_out.data_ptr());
      const T* xp = static_cast<const T*>(x.data_ptr());
      T* dp = static_cast<T*>(grad_x.data_ptr());
      const T ta = static_cast<T>(a), tb = static_cast<T>(b);
      parallel_for(x.numel(),
                   [&](int64_t i) { dp[i] = gp[i] * pm::unary_derivative<kOp, T>(xp[i], ta, tb); });
    });
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (is_16bit_float(a.dtype())) {
    const Tensor result = f32_output(out);  // comparisons write u8 directly
    binary(op, widen_f32(a), widen_f32(b), result);
    return round_into(result, out);
  }
  dispatch_floating(a.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_binary_op(op, [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      const T* ap = static_cast<const T*>(a.data_ptr());
      const T* bp = static_cast<const T*>(b.data_ptr());
      if constexpr (kOp >= BinaryOp::kEq) {
        uint8_t* op_ = static_cast<uint8_t*>(out.data_ptr());
        for_each_row<3>(out.shape(), {a.strides(), b.strides(), out.strides()},
                        [&](const auto& off, int64_t n, const auto& st) {
                          for (int64_t j = 0; j < n; ++j) {
                            op_[off[2] + j] = pm::compare<kOp, T>(ap[off[0] + j * st[0]],
                                                                  bp[off[1] + j * st[1]]);
                          }
                        });
      } else {
        T* op_ = static_cast<T*>(out.data_ptr());
        if (a.is_contiguous() && b.is_contiguous()) {
          parallel_for(out.numel(),
                       [&](int64_t i) { op_[i] = pm::binary_forward<kOp, T>(ap[i], bp[i]); });
          return;
        }
        for_each_row<3>(out.shape(), {a.strides(), b.strides(), out.strides()},
                        [&](const auto& off, int64_t n, const auto& st) {
                          const T* ar = ap + off[0];
                          const T* br = bp + off[1];
                          T* orow = op_ + off[2];
                          if (st[0] == 1 && st[1] == 1) {
                            for (int64_t j = 0; j < n; ++j) orow[j] = pm::binary_forward<kOp, T>(ar[j], br[j]);
                          } else if (st[0] == 1 && st[1] == 0) {
                            const T bv = br[0];
                            for (int64_t j = 0; j < n; ++j) orow[j] = pm::binary_forward<kOp, T>(ar[j], bv);
                          } else {
                            for (int64_t j = 0; j < n; ++j) {
                              orow[j] = pm::binary_forward<kOp, T>(ar[j * st[0]], br[j * st[1]]);
                            }
                          }
                        });
      }
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(cond.dtype() == DType::kU8, DTypeError, "where: condition must be u8, got ",
            dtype_name(cond.dtype()));
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const uint8_t* cp = static_cast<const uint8_t*>(cond.data_ptr());
    const T* ap = static_cast<const T*>(a.data_ptr());
    const T* bp = static_cast<const T*>(b.data_ptr());
    T* op_ = static_cast<T*>(out.data_ptr());
    for_each_row<4>(out.shape(), {cond.strides(), a.strides(), b.strides(), out.strides()},
                    [&](const auto& off, int64_t n, const auto& st) {
                      for (int64_t j = 0; j < n; ++j) {
                        op_[off[3] + j] = cp[off[0] + j * st[0]] ? ap[off[1] + j * st[1]]
                                                                 : bp[off[2] + j * st[2]];
                      }
                    });
  });
}

}  // namespace ska::cpu
