// CPU kernels: copy, fill, unary (+ backward), binary, where.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/elementwise.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/pointwise_f32.h"
#include "backend/cpu/widen.h"
#include "backend/pointwise_math.h"

namespace ska::cpu {

namespace {

// A copy's iteration space: operand 0 the source, 1 the destination.
using CopyLayout = ElementwiseLayout<2>;

// dst[...] = src[...] where the destination's last dim and the source's dim `p` are the unit
// strides (a transpose of those two dims): 32 x 32 tiles, so that both sides are read and written
// a cache line at a time. The other dims are iterated over, in parallel with the tiles.
template <typename S, typename D>
void copy_transposed(const S* s, D* d, const CopyLayout& l, size_t p) {
  constexpr int64_t kTile = 32;
  const size_t last = l.shape.size() - 1;
  const int64_t rows = l.shape[p], cols = l.shape[last];
  const int64_t s_col = l.strides[0][last], d_row = l.strides[1][p];
  std::vector<size_t> outer;
  int64_t outer_count = 1;
  for (size_t k = 0; k < l.shape.size(); ++k) {
    if (k != p && k != last) {
      outer.push_back(k);
      outer_count *= l.shape[k];
    }
  }
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tasks = outer_count * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (outer_count * rows * cols > 32768)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t rest = t / (row_tiles * col_tiles);
    const int64_t tile = t % (row_tiles * col_tiles);
    int64_t s_off = 0, d_off = 0;
    for (size_t k = outer.size(); k-- > 0;) {
      const int64_t i = rest % l.shape[outer[k]];
      rest /= l.shape[outer[k]];
      s_off += i * l.strides[0][outer[k]];
      d_off += i * l.strides[1][outer[k]];
    }
    const int64_t r0 = (tile / col_tiles) * kTile, c0 = (tile % col_tiles) * kTile;
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r) {
      const S* sp = s + s_off + r;
      D* dp = d + d_off + r * d_row;
      for (int64_t c = c0; c < c1; ++c) dp[c] = convert<D>(sp[c * s_col]);
    }
  }
}

}  // namespace

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
      const CopyLayout l = coalesce_layout<2>(dst.shape(), {src.strides(), dst.strides()});
      const size_t last = l.shape.size() - 1;
      if (l.strides[1][last] == 1 && l.strides[0][last] != 1 && l.shape[last] >= 8) {
        // A transpose: the source's unit stride is on another dim.
        for (size_t p = 0; p < last; ++p) {
          if (l.strides[0][p] == 1 && l.shape[p] >= 8) {
            copy_transposed(s, d, l, p);
            return;
          }
        }
      }
      for_each_row<2>(l.shape, l.strides,
                      [&](const auto& off, int64_t n, const auto& st) {
                        const S* sp = s + off[0];
                        D* dp = d + off[1];
                        if (st[0] == 1 && st[1] == 1) {  // rows contiguous on both sides
                          if constexpr (std::is_same_v<S, D>) {
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
  if (a.dtype() != b.dtype()) {  // f32 with bf16/f16: the 16-bit side widened exactly
    SKA_CHECK((a.dtype() == DType::kF32 && is_16bit_float(b.dtype())) ||
                  (b.dtype() == DType::kF32 && is_16bit_float(a.dtype())),
              DTypeError, "binary: operands of dtypes ", dtype_name(a.dtype()), " and ",
              dtype_name(b.dtype()), " (mixed only as f32 with bf16 or f16)");
    return binary(op, a.dtype() == DType::kF32 ? a : widen_f32(a),
                  b.dtype() == DType::kF32 ? b : widen_f32(b), out);
  }
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
