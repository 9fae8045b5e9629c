// CPU kernel: softmax and log-softmax over the last dim, with a scale and an additive mask.
// Rows are independent and spread over OpenMP threads. f64 sums accumulate in double; f32 rows
// take a SIMD path (vec_math.h's exp, sums in 16 float lanes: enough for rows of any length).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math.h"

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

// The f32 row: the same function as softmax_row, in three vectorised passes. z is staged in y;
// a NaN is skipped by the max but reaches the sum, so the row still turns NaN.
SKA_CPU_SIMD_CLONES
void softmax_row_f32(const float* x, const float* mask, int64_t mask_stride, int64_t len,
                     float scale, bool log, float* y) {
  if (mask == nullptr) {
    for (int64_t j = 0; j < len; ++j) y[j] = scale * x[j];
  } else if (mask_stride == 1) {
    for (int64_t j = 0; j < len; ++j) y[j] = scale * x[j] + mask[j];
  } else {
    for (int64_t j = 0; j < len; ++j) y[j] = scale * x[j] + mask[j * mask_stride];
  }
  const float max_z = vm::lane_max(y, len);
  if (log) {
    const float total = vm::lane_sum(len, [&](int64_t j) { return vm::exp_f32(y[j] - max_z); });
    const float shift = max_z + std::log(total);
    for (int64_t j = 0; j < len; ++j) y[j] -= shift;
    return;
  }
  const float total = vm::lane_sum(len, [&](int64_t j) {
    const float e = vm::exp_f32(y[j] - max_z);
    y[j] = e;
    return e;
  });
  const float inv_total = 1.0f / total;
  for (int64_t j = 0; j < len; ++j) y[j] *= inv_total;
}

// f32 backward row: dot = sum(g * y) (or sum(g) for log-softmax), then the pointwise formula.
SKA_CPU_SIMD_CLONES
void softmax_backward_row_f32(const float* y, const float* g, int64_t len, float scale, bool log,
                              float* out) {
  if (log) {
    const float dot = vm::lane_sum(len, [&](int64_t j) { return g[j]; });
    for (int64_t j = 0; j < len; ++j) out[j] = scale * (g[j] - vm::exp_f32(y[j]) * dot);
    return;
  }
  const float dot = vm::lane_sum(len, [&](int64_t j) { return g[j] * y[j]; });
  for (int64_t j = 0; j < len; ++j) out[j] = scale * (y[j] * (g[j] - dot));
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
      if constexpr (std::is_same_v<T, float>) {
        softmax_row_f32(xp + r * len, mask_row, mask_stride, len, static_cast<float>(scale), log,
                        yp + r * len);
      } else {
        softmax_row(xp + r * len, mask_row, mask_stride, len, scale, log, yp + r * len);
      }
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
      if constexpr (std::is_same_v<T, float>) {
        softmax_backward_row_f32(yr, gr, len, static_cast<float>(scale), log, out);
        return;
      }
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
