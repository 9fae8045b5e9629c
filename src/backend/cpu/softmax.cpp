// CPU kernel: softmax and log-softmax over the last dim, with a scale and an additive mask.
// Rows are independent and spread over OpenMP threads; sums accumulate in double.
#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ska::cpu {

namespace {

// Element offset of the first element of row `row` (rows = all dims but the last) in a view of
// `shape` with `strides`. The mask is such a view: broadcast dims have stride 0.
int64_t row_offset(int64_t row, const Shape& shape, const Shape& strides) {
  int64_t offset = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    offset += (row % shape[d]) * strides[d];
    row /= shape[d];
  }
  return offset;
}

// One row of z = scale * x + mask, then y = softmax(z) or log_softmax(z). The max is subtracted
// first for stability; exp runs once per element in T's precision (expf for f32) and the sum
// accumulates in double. A row whose every z is -inf has no finite maximum: it gives NaN, as in
// PyTorch (a fully masked attention row has no meaningful distribution).
template <typename T>
void softmax_row(const T* x, const T* mask, int64_t mask_stride, int64_t len, double scale,
                 bool log, T* y) {
  const T s = static_cast<T>(scale);
  auto z = [&](int64_t j) -> T { return mask ? s * x[j] + mask[j * mask_stride] : s * x[j]; };
  T max_z = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < len; ++j) max_z = std::fmax(max_z, z(j));
  double total = 0.0;  // a NaN anywhere in the row makes it NaN, and so the whole row
  if (log) {
    for (int64_t j = 0; j < len; ++j) total += std::exp(z(j) - max_z);
    const T log_total = static_cast<T>(std::log(total));
    for (int64_t j = 0; j < len; ++j) y[j] = z(j) - max_z - log_total;
    return;
  }
  for (int64_t j = 0; j < len; ++j) {
    const T e = std::exp(z(j) - max_z);
    y[j] = e;
    total += e;
  }
  const T inv_total = static_cast<T>(1.0 / total);
  for (int64_t j = 0; j < len; ++j) y[j] *= inv_total;
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& mask, double scale, bool log, const Tensor& y) {
  dispatch_floating(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t len = x.dim() == 0 ? 1 : x.shape().back();
    const int64_t rows = len == 0 ? 0 : x.numel() / len;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const T* mp = mask.defined() ? static_cast<const T*>(mask.data_ptr()) : nullptr;
    const int64_t mask_stride = mask.defined() && mask.dim() > 0 ? mask.strides().back() : 0;
    parallel_for(rows, [&](int64_t r) {
      const T* mask_row = mp ? mp + row_offset(r, mask.shape(), mask.strides()) : nullptr;
      softmax_row(xp + r * len, mask_row, mask_stride, len, scale, log, yp + r * len);
    }, 64);
  });
}

// dL/dz = y * (g - sum(g * y)) for softmax, g - exp(y) * sum(g) for log-softmax (y = log p);
// grad_x = scale * dL/dz.
void softmax_backward(const Tensor& y, const Tensor& grad_y, double scale, bool log,
                      const Tensor& grad_x) {
  dispatch_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t len = y.dim() == 0 ? 1 : y.shape().back();
    const int64_t rows = len == 0 ? 0 : y.numel() / len;
    const T* yp = static_cast<const T*>(y.data_ptr());
    const T* gp = static_cast<const T*>(grad_y.data_ptr());
    T* gxp = static_cast<T*>(grad_x.data_ptr());
    parallel_for(rows, [&](int64_t r) {
      const T* yr = yp + r * len;
      const T* gr = gp + r * len;
      T* out = gxp + r * len;
      double dot = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        dot += static_cast<double>(gr[j]) * (log ? 1.0 : static_cast<double>(yr[j]));
      }
      for (int64_t j = 0; j < len; ++j) {
        const double yj = static_cast<double>(yr[j]), gj = static_cast<double>(gr[j]);
        const double dz = log ? gj - std::exp(yj) * dot : yj * (gj - dot);
        out[j] = static_cast<T>(scale * dz);
      }
    }, 64);
  });
}

}  // namespace ska::cpu
