// CPU kernel: batch norm of x [N, C, ...] per channel (forward with running-stat update, backward
// in training and eval modes). Channels are spread over OpenMP threads; sums accumulate in double.
// A bf16/f16 x (with parameters in its dtype or f32) runs the f32 path on widened copies.
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

// x [N, C, S...] seen as N planes per channel, each of `spatial` consecutive elements.
struct ChannelLayout {
  int64_t batch;
  int64_t channels;
  int64_t spatial;
  int64_t count() const { return batch * spatial; }  // elements per channel
  int64_t plane(int64_t n, int64_t c) const { return (n * channels + c) * spatial; }
};

ChannelLayout layout_of(const Tensor& x) {
  const int64_t batch = x.shape()[0], channels = x.shape()[1];
  const int64_t per_sample = batch * channels;
  return {batch, channels, per_sample == 0 ? 0 : x.numel() / per_sample};
}

template <typename T>
T* optional_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Visits every element of channel c: fn(index into x).
template <typename F>
void for_channel(const ChannelLayout& l, int64_t c, F&& fn) {
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t base = l.plane(n, c);
    for (int64_t s = 0; s < l.spatial; ++s) fn(base + s);
  }
}

// Biased mean and variance of each channel (two passes).
template <typename T>
void channel_stats(const T* x, const ChannelLayout& l, std::vector<double>& mean,
                   std::vector<double>& var) {
  const double count = static_cast<double>(l.count());
#pragma omp parallel for schedule(static) if (l.channels * l.count() > 32768)
  for (int64_t c = 0; c < l.channels; ++c) {
    double m = 0.0;
    for_channel(l, c, [&](int64_t i) { m += static_cast<double>(x[i]); });
    m /= count;
    double v = 0.0;
    for_channel(l, c, [&](int64_t i) {
      const double d = static_cast<double>(x[i]) - m;
      v += d * d;
    });
    mean[static_cast<size_t>(c)] = m;
    var[static_cast<size_t>(c)] = v / count;
  }
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance.
void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const std::vector<double>& mean, const std::vector<double>& var,
                          int64_t count, double momentum) {
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1)
                                  : 1.0;
  if (running_mean.defined()) {
    std::vector<double> rm = running_mean.to_vector<double>();
    for (size_t c = 0; c < rm.size(); ++c) rm[c] = (1.0 - momentum) * rm[c] + momentum * mean[c];
    copy(Tensor::from_vector(rm, running_mean.shape()), running_mean);
  }
  if (running_var.defined()) {
    std::vector<double> rv = running_var.to_vector<double>();
    for (size_t c = 0; c < rv.size(); ++c) {
      rv[c] = (1.0 - momentum) * rv[c] + momentum * var[c] * unbias;
    }
    copy(Tensor::from_vector(rv, running_var.shape()), running_var);
  }
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& running_mean, const Tensor& running_var, bool training,
                        double momentum, double eps, const Tensor& y, const Tensor& save_mean,
                        const Tensor& save_rstd) {
  if (is_16bit_float(x.dtype())) {  // widened (f32 or 16-bit parameters), y rounded once
    const Tensor result = f32_output(y);
    batch_norm_forward(widen_f32(x), widen_f32(weight), widen_f32(bias), running_mean, running_var,
                       training, momentum, eps, result, save_mean, save_rstd);
    round_into(result, y);
    return;
  }
  dispatch_floating(x.dtype(), "batch_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    const ChannelLayout l = layout_of(x);
    const T* xp = x.data<T>();
    std::vector<double> mean(static_cast<size_t>(l.channels));
    std::vector<double> var(static_cast<size_t>(l.channels));
    if (training) {
      channel_stats(xp, l, mean, var);
      update_running_stats(running_mean, running_var, mean, var, l.count(), momentum);
    } else {
      mean = running_mean.to_vector<double>();
      var = running_var.to_vector<double>();
    }
    const T* w = optional_data<T>(weight);
    const T* b = optional_data<T>(bias);
    T* yp = y.data<T>();
    T* mp = save_mean.data<T>();
    T* sp = save_rstd.data<T>();
#pragma omp parallel for schedule(static) if (l.channels * l.count() > 32768)
    for (int64_t c = 0; c < l.channels; ++c) {
      const double m = mean[static_cast<size_t>(c)];
      const double s = 1.0 / std::sqrt(var[static_cast<size_t>(c)] + eps);
      const double scale = w ? s * static_cast<double>(w[c]) : s;
      const double shift = b ? static_cast<double>(b[c]) : 0.0;
      for_channel(l, c, [&](int64_t i) {
        yp[i] = static_cast<T>((static_cast<double>(xp[i]) - m) * scale + shift);
      });
      mp[c] = static_cast<T>(m);
      sp[c] = static_cast<T>(s);
    }
  });
}

// With xhat = (x - mean) * rstd, per channel over its N * S elements:
//   training: grad_x = weight * rstd * (g - mean(g) - xhat * mean(g * xhat))
//   eval:     grad_x = weight * rstd * g            (the statistics are constants)
//   grad_weight = sum(g * xhat), grad_bias = sum(g).
void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_rstd, bool training,
                         const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  if (is_16bit_float(x.dtype())) {  // widened; each gradient rounded once into its own dtype
    const Tensor gx = f32_output(grad_x), gw = f32_output(grad_weight), gb = f32_output(grad_bias);
    batch_norm_backward(widen_f32(grad_y), widen_f32(x), widen_f32(weight), save_mean, save_rstd,
                        training, gx, gw, gb);
    round_into(gx, grad_x);
    round_into(gw, grad_weight);
    round_into(gb, grad_bias);
    return;
  }
  dispatch_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const ChannelLayout l = layout_of(x);
    const T* gp = grad_y.data<T>();
    const T* xp = x.data<T>();
    const T* w = optional_data<T>(weight);
    const T* mp = save_mean.data<T>();
    const T* sp = save_rstd.data<T>();
    T* gxp = optional_data<T>(grad_x);
    T* dw = optional_data<T>(grad_weight);
    T* db = optional_data<T>(grad_bias);
    const double count = static_cast<double>(l.count());
#pragma omp parallel for schedule(static) if (l.channels * l.count() > 32768)
    for (int64_t c = 0; c < l.channels; ++c) {
      const double m = static_cast<double>(mp[c]), s = static_cast<double>(sp[c]);
      double sum_g = 0.0, sum_gx = 0.0;
      for_channel(l, c, [&](int64_t i) {
        const double g = static_cast<double>(gp[i]);
        sum_g += g;
        sum_gx += g * (static_cast<double>(xp[i]) - m) * s;
      });
      if (dw) dw[c] = static_cast<T>(sum_gx);
      if (db) db[c] = static_cast<T>(sum_g);
      if (!gxp) continue;
      const double scale = w ? s * static_cast<double>(w[c]) : s;
      const double mean_g = training ? sum_g / count : 0.0;
      const double mean_gx = training ? sum_gx / count : 0.0;
      for_channel(l, c, [&](int64_t i) {
        const double xhat = (static_cast<double>(xp[i]) - m) * s;
        gxp[i] = static_cast<T>(scale * (static_cast<double>(gp[i]) - mean_g - xhat * mean_gx));
      });
    }
  });
}

}  // namespace ska::cpu
