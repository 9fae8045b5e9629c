// CPU kernel: layer norm over the last dim (forward and backward), weight and bias optional.
// Statistics are computed in double (two passes) and saved in x's dtype (f32 or f64) per row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ska::cpu {

namespace {

// Pointer to an optional [C] tensor's data, or null when the tensor is undefined.
template <typename T>
T* optional_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Row layout of x [..., C] as (rows, C).
struct Rows {
  int64_t rows;
  int64_t cols;
};

Rows rows_of(const Tensor& x) {
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}

// Sums over rows of g * xhat (into dw) and of g (into db), per column. Column blocks are spread
// over threads so each thread owns its outputs; the row loop inside keeps the sums in order.
template <typename T>
void layer_norm_param_grads(const T* g, const T* x, const T* mean, const T* rstd, Rows shape,
                            T* dw, T* db) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (shape.cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (shape.rows * shape.cols > 32768)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, c1 = std::min(shape.cols, c0 + kBlock);
    std::vector<double> sum_gx(static_cast<size_t>(c1 - c0), 0.0);
    std::vector<double> sum_g(static_cast<size_t>(c1 - c0), 0.0);
    for (int64_t r = 0; r < shape.rows; ++r) {
      const double m = static_cast<double>(mean[r]), s = static_cast<double>(rstd[r]);
      const T* gr = g + r * shape.cols;
      const T* xr = x + r * shape.cols;
      for (int64_t c = c0; c < c1; ++c) {
        const double gv = static_cast<double>(gr[c]);
        sum_gx[static_cast<size_t>(c - c0)] += gv * (static_cast<double>(xr[c]) - m) * s;
        sum_g[static_cast<size_t>(c - c0)] += gv;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dw) dw[c] = static_cast<T>(sum_gx[static_cast<size_t>(c - c0)]);
      if (db) db[c] = static_cast<T>(sum_g[static_cast<size_t>(c - c0)]);
    }
  }
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    const Rows shape = rows_of(x);
    const T* xp = x.data<T>();
    const T* w = optional_data<T>(weight);
    const T* b = optional_data<T>(bias);
    T* yp = y.data<T>();
    T* mp = mean.data<T>();
    T* sp = rstd.data<T>();
    parallel_for(shape.rows, [&](int64_t r) {
      const T* xr = xp + r * shape.cols;
      double m = 0.0;
      for (int64_t c = 0; c < shape.cols; ++c) m += static_cast<double>(xr[c]);
      m /= static_cast<double>(shape.cols);
      double var = 0.0;
      for (int64_t c = 0; c < shape.cols; ++c) {
        const double d = static_cast<double>(xr[c]) - m;
        var += d * d;
      }
      var /= static_cast<double>(shape.cols);
      const double s = 1.0 / std::sqrt(var + eps);
      T* yr = yp + r * shape.cols;
      for (int64_t c = 0; c < shape.cols; ++c) {
        double v = (static_cast<double>(xr[c]) - m) * s;
        if (w) v *= static_cast<double>(w[c]);
        if (b) v += static_cast<double>(b[c]);
        yr[c] = static_cast<T>(v);
      }
      mp[r] = static_cast<T>(m);
      sp[r] = static_cast<T>(s);
    }, 64);
  });
}

// With xhat = (x - mean) * rstd and dxhat = grad_y * weight:
//   grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const Rows shape = rows_of(x);
    const T* gp = grad_y.data<T>();
    const T* xp = x.data<T>();
    const T* w = optional_data<T>(weight);
    const T* mp = mean.data<T>();
    const T* sp = rstd.data<T>();
    if (grad_x.defined()) {
      T* gxp = grad_x.data<T>();
      parallel_for(shape.rows, [&](int64_t r) {
        const T* gr = gp + r * shape.cols;
        const T* xr = xp + r * shape.cols;
        const double m = static_cast<double>(mp[r]), s = static_cast<double>(sp[r]);
        auto dxhat = [&](int64_t c) {
          const double g = static_cast<double>(gr[c]);
          return w ? g * static_cast<double>(w[c]) : g;
        };
        double sum_d = 0.0, sum_dx = 0.0;
        for (int64_t c = 0; c < shape.cols; ++c) {
          const double d = dxhat(c);
          sum_d += d;
          sum_dx += d * (static_cast<double>(xr[c]) - m) * s;
        }
        const double n = static_cast<double>(shape.cols);
        const double mean_d = sum_d / n, mean_dx = sum_dx / n;
        T* out = gxp + r * shape.cols;
        for (int64_t c = 0; c < shape.cols; ++c) {
          const double xhat = (static_cast<double>(xr[c]) - m) * s;
          out[c] = static_cast<T>(s * (dxhat(c) - mean_d - xhat * mean_dx));
        }
      }, 64);
    }
    if (grad_weight.defined() || grad_bias.defined()) {
      layer_norm_param_grads<T>(gp, xp, mp, sp, shape, optional_data<T>(grad_weight),
                                optional_data<T>(grad_bias));
    }
  });
}

}  // namespace ska::cpu
