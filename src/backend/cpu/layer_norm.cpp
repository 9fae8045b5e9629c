// CPU kernel: layer norm over the last dim (forward and backward), weight and bias optional.
// Statistics are computed in two passes and saved in x's dtype (f32 or f64) per row: in double
// for f64, in 16 float lanes for f32 (vectorised; the lanes keep rounding error at ~1e-7 per row).
// The f32 backward is vectorised the same way; its weight and bias sums go through per-chunk f32
// partials added in double. A bf16/f16 output of an f32 input is computed in f32 and rounded once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/widen.h"
#include "backend/residual_norm_checks.h"

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

// Forward of rows [r0, r1) in f32: mean, then the centred variance, then y, each a vector loop.
SKA_CPU_SIMD_CLONES
void layer_norm_rows_f32(const float* x, const float* w, const float* b, float eps, int64_t cols,
                         int64_t r0, int64_t r1, float* y, float* mean, float* rstd) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float m = vm::lane_sum(cols, [&](int64_t c) { return xr[c]; }) * inv_n;
    const float var = vm::lane_sum(cols, [&](int64_t c) { return (xr[c] - m) * (xr[c] - m); }) * inv_n;
    const float s = 1.0f / std::sqrt(var + eps);
    if (w && b) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        float v = (xr[c] - m) * s;
        if (w) v *= w[c];
        if (b) v += b[c];
        yr[c] = v;
      }
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

// grad_x of rows [r0, r1) in f32 (see layer_norm_backward): two lane sums and one vector loop
// per row.
SKA_CPU_SIMD_CLONES
void layer_norm_grad_input_rows_f32(const float* g, const float* x, const float* w,
                                    const float* mean, const float* rstd, int64_t cols, int64_t r0,
                                    int64_t r1, float* gx) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * cols;
    const float* xr = x + r * cols;
    float* out = gx + r * cols;
    const float m = mean[r], s = rstd[r];
    float mean_d, mean_dx;
    if (w) {
      mean_d = vm::lane_sum(cols, [&](int64_t c) { return gr[c] * w[c]; }) * inv_n;
      mean_dx = vm::lane_sum(cols, [&](int64_t c) { return gr[c] * w[c] * ((xr[c] - m) * s); });
      mean_dx *= inv_n;
      for (int64_t c = 0; c < cols; ++c) {
        out[c] = s * (gr[c] * w[c] - mean_d - (xr[c] - m) * s * mean_dx);
      }
    } else {
      mean_d = vm::lane_sum(cols, [&](int64_t c) { return gr[c]; }) * inv_n;
      mean_dx = vm::lane_sum(cols, [&](int64_t c) { return gr[c] * ((xr[c] - m) * s); }) * inv_n;
      for (int64_t c = 0; c < cols; ++c) out[c] = s * (gr[c] - mean_d - (xr[c] - m) * s * mean_dx);
    }
  }
}

// Per-column sums of g * xhat (into pw) and of g (into pb) over rows [r0, r1) in f32, each row
// one vector loop along the columns.
SKA_CPU_SIMD_CLONES
void layer_norm_param_partials_f32(const float* g, const float* x, const float* mean,
                                   const float* rstd, int64_t cols, int64_t r0, int64_t r1,
                                   float* pw, float* pb) {
  std::fill(pw, pw + cols, 0.0f);
  std::fill(pb, pb + cols, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * cols;
    const float* xr = x + r * cols;
    const float m = mean[r], s = rstd[r];
    for (int64_t c = 0; c < cols; ++c) {
      pw[c] += gr[c] * ((xr[c] - m) * s);
      pb[c] += gr[c];
    }
  }
}

// The f32 weight and bias gradients: partial sums over fixed chunks of rows (in parallel), then
// the chunks added in order in double. The chunking does not depend on the thread count, so the
// result is the same for any number of threads.
void layer_norm_param_grads_f32(const float* g, const float* x, const float* mean,
                                const float* rstd, Rows shape, float* dw, float* db) {
  constexpr int64_t kRowChunk = 128;
  const int64_t cols = shape.cols, chunks = (shape.rows + kRowChunk - 1) / kRowChunk;
  std::vector<float> partial(static_cast<size_t>(2 * chunks * cols));
#pragma omp parallel for schedule(static) if (shape.rows * shape.cols > 32768)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float* pw = partial.data() + 2 * ch * cols;
    layer_norm_param_partials_f32(g, x, mean, rstd, cols, ch * kRowChunk,
                                  std::min(shape.rows, (ch + 1) * kRowChunk), pw, pw + cols);
  }
  for (int64_t c = 0; c < cols; ++c) {
    double sum_w = 0.0, sum_b = 0.0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      sum_w += static_cast<double>(partial[static_cast<size_t>(2 * ch * cols + c)]);
      sum_b += static_cast<double>(partial[static_cast<size_t>((2 * ch + 1) * cols + c)]);
    }
    if (dw) dw[c] = static_cast<float>(sum_w);
    if (db) db[c] = static_cast<float>(sum_b);
  }
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (y.dtype() != x.dtype()) {  // bf16/f16 output of an f32 input: f32, then one rounding
    SKA_CHECK(x.dtype() == DType::kF32 && is_16bit_float(y.dtype()), DTypeError,
              "layer_norm_forward: a ", dtype_name(x.dtype()), " input cannot write a ",
              dtype_name(y.dtype()), " output");
    const Tensor result = f32_output(y);
    layer_norm_forward(x, weight, bias, eps, result, mean, rstd);
    return round_into(result, y);
  }
  dispatch_floating(x.dtype(), "layer_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    const Rows shape = rows_of(x);
    const T* xp = x.data<T>();
    const T* w = optional_data<T>(weight);
    const T* b = optional_data<T>(bias);
    T* yp = y.data<T>();
    T* mp = mean.data<T>();
    T* sp = rstd.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      constexpr int64_t kRowBlock = 16;  // rows per call: amortises the multiversion dispatch
      const int64_t blocks = (shape.rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (shape.rows * shape.cols > 32768)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        layer_norm_rows_f32(xp, w, b, static_cast<float>(eps), shape.cols, blk * kRowBlock,
                            std::min(shape.rows, (blk + 1) * kRowBlock), yp, mp, sp);
      }
      return;
    }
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
  if (grad_y.dtype() != x.dtype()) {  // the gradient of a bf16/f16 output: read widened
    SKA_CHECK(x.dtype() == DType::kF32 && is_16bit_float(grad_y.dtype()), DTypeError,
              "layer_norm_backward: a ", dtype_name(grad_y.dtype()), " output gradient for a ",
              dtype_name(x.dtype()), " input");
    return layer_norm_backward(widen_f32(grad_y), x, weight, mean, rstd, grad_x, grad_weight,
                               grad_bias);
  }
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const Rows shape = rows_of(x);
    const T* gp = grad_y.data<T>();
    const T* xp = x.data<T>();
    const T* w = optional_data<T>(weight);
    const T* mp = mean.data<T>();
    const T* sp = rstd.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (grad_x.defined()) {
        constexpr int64_t kRowBlock = 16;  // rows per call: amortises the multiversion dispatch
        const int64_t blocks = (shape.rows + kRowBlock - 1) / kRowBlock;
        float* gxp = grad_x.data<float>();
#pragma omp parallel for schedule(static) if (shape.rows * shape.cols > 32768)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          layer_norm_grad_input_rows_f32(gp, xp, w, mp, sp, shape.cols, blk * kRowBlock,
                                         std::min(shape.rows, (blk + 1) * kRowBlock), gxp);
        }
      }
      if (grad_weight.defined() || grad_bias.defined()) {
        layer_norm_param_grads_f32(gp, xp, mp, sp, shape, optional_data<float>(grad_weight),
                                   optional_data<float>(grad_bias));
      }
      return;
    }
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

namespace ska::cpu {

// The reference composes the kernels the unfused ops run (dropout, add, layer norm; cast and
// dropout backward; scaled_residual's for a scaled branch), so its bits are theirs. A 16-bit sum
// (with f32 parameters) is normalised as its f32 copy, as autocast's layer_norm does.
void add_layer_norm_forward(const Tensor& x, const Tensor& y, const DropoutDraw& drop,
                            const Tensor& y_scale, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& sum, const Tensor& normed, const Tensor& mean,
                            const Tensor& rstd) {
  const char* kernel = "add_layer_norm_forward";
  check_add_layer_norm_scale(kernel, y_scale, x, norm_param_dtype(x, weight, bias));
  if (drop.active()) check_add_layer_norm_drop(kernel, drop, x, y);
  if (y_scale.defined()) {
    scaled_residual_forward(x, Tensor(), y, y_scale, Tensor(), drop, sum);
  } else {
    Tensor branch = y;
    if (drop.active()) {
      branch = Tensor::empty(y.shape(), y.dtype(), y.device());
      dropout_forward(y, drop.seed, drop.offset, drop.keep_prob, drop.scale, drop.offset_base,
                      branch, drop.bits);
    }
    binary(BinaryOp::kAdd, x, branch, sum);
  }
  layer_norm_forward(is_16bit_float(sum.dtype()) ? widen_f32(sum) : sum, weight, bias, eps, normed,
                     mean, rstd);
}

void add_layer_norm_backward(const Tensor& grad_y, const Tensor& grad_sum, const Tensor& x,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const DropoutDraw& drop, const Tensor& y, const Tensor& y_scale,
                             const Tensor& grad_x, const Tensor& grad_branch,
                             const Tensor& grad_weight, const Tensor& grad_bias,
                             const Tensor& grad_scale) {
  const char* kernel = "add_layer_norm_backward";
  check_add_layer_norm_grads(kernel, x, grad_y, grad_x, grad_branch);
  check_add_layer_norm_scale_grad(kernel, x, grad_y, y, y_scale, grad_x, grad_scale);
  if (grad_branch.defined() || grad_scale.defined()) {
    check_add_layer_norm_scale(kernel, y_scale, x, weight.defined() ? weight.dtype() : x.dtype());
    if (drop.active()) check_add_layer_norm_drop(kernel, drop, x, grad_x);
  }
  // A 16-bit x: the gradient of its f32 copy, rounded to x's dtype as the cast's backward does.
  const bool narrow = is_16bit_float(x.dtype());
  const Tensor x_norm = narrow ? widen_f32(x) : x;
  const Tensor norm_grad =
      grad_x.defined() ? Tensor::empty(x.shape(), x_norm.dtype(), x.device()) : Tensor();
  layer_norm_backward(grad_y, x_norm, weight, mean, rstd, norm_grad, grad_weight, grad_bias);
  if (!grad_x.defined()) return;
  Tensor rounded = norm_grad;
  if (narrow) {
    rounded = Tensor::empty(x.shape(), x.dtype(), x.device());
    copy(norm_grad, rounded);
  }
  binary(BinaryOp::kAdd, rounded, grad_sum, grad_x);
  if (y_scale.defined() && (grad_branch.defined() || grad_scale.defined())) {
    scaled_residual_backward(grad_x, Tensor(), Tensor(), grad_scale.defined() ? y : Tensor(),
                             y_scale, Tensor(), drop, Tensor(), grad_branch, Tensor(), grad_scale);
    return;
  }
  if (!grad_branch.defined()) return;
  copy(grad_x, grad_branch);  // add's gradient cast to the branch's dtype
  if (drop.active()) dropout_backward(grad_branch, drop.bits, drop.scale, grad_branch);
}

}  // namespace ska::cpu
