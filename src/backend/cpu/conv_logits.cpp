// CPU kernels: CSKA's convolutional logits as the sums they are (backend/kernels.inc), the
// reference the CUDA kernels are tested against. Each image and head is one task; grad_w is
// summed per head over the images in order (deterministic).
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/conv_logits_geometry.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

// Where position p's neighbour at tap (dy, dx) lies (-1 off the grid).
struct Taps {
  int64_t height, width, k;
  int64_t neighbour(int64_t p, int64_t tap) const {
    const int64_t r = k / 2, y = p / width + tap / k - r, x = p % width + tap % k - r;
    return y >= 0 && y < height && x >= 0 && x < width ? y * width + x : -1;
  }
};

template <typename T>
void forward(const Tensor& q, const Tensor& w, const Tensor& bias, const ConvLogitsGeometry& geo,
             const Tensor& logits) {
  const T* qd = static_cast<const T*>(q.data_ptr());
  const T* wd = static_cast<const T*>(w.data_ptr());
  const T* bd = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
  T* out = static_cast<T*>(logits.data_ptr());
  const Taps taps{geo.height, geo.width, geo.kernel};
  const int64_t positions = geo.height * geo.width, keys = geo.keys, d = geo.d;
  const int64_t ntaps = geo.kernel * geo.kernel;
  parallel_for(
      geo.batch * geo.heads,
      [&](int64_t bh) {
        const int64_t b = bh / geo.heads, h = bh % geo.heads;
        const T* qbh = qd + b * q.stride(0) + h * q.stride(1);
        T* obh = out + b * logits.stride(0) + h * logits.stride(1);
        const int64_t row = logits.stride(2);
        std::vector<T> acc(keys);
        for (int64_t p = 0; p < positions; ++p) {
          for (int64_t j = 0; j < keys; ++j) acc[j] = bd ? bd[h * keys + j] : T(0);
          for (int64_t tap = 0; tap < ntaps; ++tap) {
            const int64_t s = taps.neighbour(p, tap);
            if (s < 0) continue;
            const T* qs = qbh + s * q.stride(2);
            const T* wt = wd + (h * ntaps + tap) * keys * d;
            for (int64_t j = 0; j < keys; ++j) {
              T sum = 0;
              for (int64_t c = 0; c < d; ++c) sum += qs[c] * wt[j * d + c];
              acc[j] += sum;
            }
          }
          for (int64_t j = 0; j < keys; ++j) obh[p * row + j] = acc[j];
        }
      },
      1);
}

template <typename T>
void backward(const Tensor& grad, const Tensor& q, const Tensor& w, const ConvLogitsGeometry& geo,
              const Tensor& grad_q, const Tensor& grad_w, const Tensor& grad_bias) {
  const T* gd = static_cast<const T*>(grad.data_ptr());
  const T* qd = static_cast<const T*>(q.data_ptr());
  const T* wd = static_cast<const T*>(w.data_ptr());
  const Taps taps{geo.height, geo.width, geo.kernel};
  const int64_t positions = geo.height * geo.width, keys = geo.keys, d = geo.d;
  const int64_t ntaps = geo.kernel * geo.kernel;
  const auto grad_row = [&](int64_t b, int64_t h, int64_t p) {
    return gd + b * grad.stride(0) + h * grad.stride(1) + p * grad.stride(2);
  };
  const auto q_row = [&](int64_t b, int64_t h, int64_t p) {
    return qd + b * q.stride(0) + h * q.stride(1) + p * q.stride(2);
  };
  if (grad_q.defined()) {  // dq[s] = sum over taps of dL[p] w[tap] for p whose neighbour is s
    T* gq = static_cast<T*>(grad_q.data_ptr());
    parallel_for(
        geo.batch * geo.heads,
        [&](int64_t bh) {
          const int64_t b = bh / geo.heads, h = bh % geo.heads;
          T* out = gq + b * grad_q.stride(0) + h * grad_q.stride(1);
          const int64_t row = grad_q.stride(2);
          for (int64_t s = 0; s < positions; ++s) {
            for (int64_t c = 0; c < d; ++c) out[s * row + c] = T(0);
          }
          for (int64_t p = 0; p < positions; ++p) {
            const T* gp = grad_row(b, h, p);
            for (int64_t tap = 0; tap < ntaps; ++tap) {
              const int64_t s = taps.neighbour(p, tap);
              if (s < 0) continue;
              const T* wt = wd + (h * ntaps + tap) * keys * d;
              T* os = out + s * row;
              for (int64_t j = 0; j < keys; ++j) {
                const T gj = gp[j];
                for (int64_t c = 0; c < d; ++c) os[c] += gj * wt[j * d + c];
              }
            }
          }
        },
        1);
  }
  if (grad_bias.defined()) {  // db[h, j] = sum over images and positions of dL[p, j]
    T* gb = static_cast<T*>(grad_bias.data_ptr());
    parallel_for(
        geo.heads,
        [&](int64_t h) {
          T* out = gb + h * keys;
          for (int64_t j = 0; j < keys; ++j) out[j] = T(0);
          for (int64_t b = 0; b < geo.batch; ++b) {
            for (int64_t p = 0; p < positions; ++p) {
              const T* gp = grad_row(b, h, p);
              for (int64_t j = 0; j < keys; ++j) out[j] += gp[j];
            }
          }
        },
        1);
  }
  if (grad_w.defined()) {  // dw[h, tap, j, c] = sum over images and positions of dL[p, j] q[s, c]
    T* gw = static_cast<T*>(grad_w.data_ptr());
    parallel_for(
        geo.heads * ntaps,
        [&](int64_t ht) {
          const int64_t h = ht / ntaps, tap = ht % ntaps;
          T* out = gw + ht * keys * d;
          for (int64_t i = 0; i < keys * d; ++i) out[i] = T(0);
          for (int64_t b = 0; b < geo.batch; ++b) {
            for (int64_t p = 0; p < positions; ++p) {
              const int64_t s = taps.neighbour(p, tap);
              if (s < 0) continue;
              const T* gp = grad_row(b, h, p);
              const T* qs = q_row(b, h, s);
              for (int64_t j = 0; j < keys; ++j) {
                const T gj = gp[j];
                for (int64_t c = 0; c < d; ++c) out[j * d + c] += gj * qs[c];
              }
            }
          }
        },
        1);
  }
}

}  // namespace

void conv_logits_forward(const Tensor& q, const Tensor& w, const Tensor& bias, int64_t height,
                         int64_t width, const Tensor& logits) {
  const ConvLogitsGeometry geo =
      conv_logits_geometry("conv_logits_forward", q, w, bias, height, width, logits);
  if (is_16bit_float(q.dtype())) {  // f32 sums of the widened values, each output rounded once
    const Tensor result = f32_output(logits);
    conv_logits_forward(widen_f32(q), widen_f32(w), widen_f32(bias), height, width, result);
    round_into(result, logits);
    return;
  }
  dispatch_floating(q.dtype(), "conv_logits_forward",
                    [&](auto tag) { forward<decltype(tag)>(q, w, bias, geo, logits); });
}

void conv_logits_backward(const Tensor& grad, const Tensor& q, const Tensor& w, int64_t height,
                          int64_t width, const Tensor& grad_q, const Tensor& grad_w,
                          const Tensor& grad_bias) {
  const ConvLogitsGeometry geo = conv_logits_geometry(
      "conv_logits_backward", q, w, Tensor(), height, width, grad, grad_q, grad_w, grad_bias);
  if (is_16bit_float(q.dtype())) {
    const auto f32 = [](const Tensor& t) { return t.defined() ? f32_output(t) : Tensor(); };
    const Tensor gq = f32(grad_q), gw = f32(grad_w), gb = f32(grad_bias);
    conv_logits_backward(widen_f32(grad), widen_f32(q), widen_f32(w), height, width, gq, gw, gb);
    if (gq.defined()) round_into(gq, grad_q);
    if (gw.defined()) round_into(gw, grad_w);
    if (gb.defined()) round_into(gb, grad_bias);
    return;
  }
  dispatch_floating(q.dtype(), "conv_logits_backward", [&](auto tag) {
    backward<decltype(tag)>(grad, q, w, geo, grad_q, grad_w, grad_bias);
  });
}

}  // namespace ska::cpu
