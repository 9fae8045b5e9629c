// CPU kernels: depthwise 2-D convolution (groups == input channels, any channel multiplier) by
// direct loops over a zero-padded copy of each plane, so that the inner loops need no bounds checks
// and run as vectors. The input gradient is the same correlation, of the output gradient (with
// zeros between its entries for strides > 1) with the flipped kernel.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/conv2d_geometry.h"
#include "backend/cpu/vec_math.h"

// The vector helpers below return 32-byte vectors; they are always inlined, so the baseline
// clone's different vector ABI never shows at a call.
#pragma GCC diagnostic ignored "-Wpsabi"

// The per-plane templates are inlined into their f32 entry points, so that they are compiled
// again for each instruction set of SKA_CPU_SIMD_CLONES (a call would run the baseline code).
#define SKA_INLINE_HOT inline __attribute__((always_inline))

namespace ska::cpu {

namespace {

// Where a plane goes in a zero buffer of [rows, cols]: src[r, c] lands at
// (top + r * step_h, left + c * step_w) when that lies inside, and is dropped otherwise.
struct Placement {
  int64_t rows, cols, top, left, step_h, step_w;
};

template <typename T>
void place_plane(const T* src, int64_t src_h, int64_t src_w, const Placement& pl, T* buf) {
  std::fill(buf, buf + pl.rows * pl.cols, T(0));
  for (int64_t r = 0; r < src_h; ++r) {
    const int64_t u = pl.top + r * pl.step_h;
    if (u < 0 || u >= pl.rows) continue;
    T* dst = buf + u * pl.cols;
    const T* s = src + r * src_w;
    if (pl.step_w == 1) {
      const int64_t c0 = std::max<int64_t>(0, -pl.left);
      const int64_t c1 = std::min(src_w, pl.cols - pl.left);
      if (c1 > c0) std::copy(s + c0, s + c1, dst + pl.left + c0);
      continue;
    }
    for (int64_t c = 0; c < src_w; ++c) {
      const int64_t v = pl.left + c * pl.step_w;
      if (v >= 0 && v < pl.cols) dst[v] = s[c];
    }
  }
}

// A correlation over a padded buffer whose rows are buf_w long: out[oh, ow] = the sum over taps
// (i, j) of k[i, j] * buf[oh * stride_h + i * dil_h, ow * stride_w + j * dil_w].
struct Correlation {
  int64_t kh, kw, stride_h, stride_w, dil_h, dil_w, out_h, out_w, buf_w;
};

// 32 bytes of T (8 f32 or 4 f64) as a GCC/Clang vector: the compiler emits one AVX register per
// vector in the AVX2 clone and two SSE registers in the baseline one. Loaded and stored unaligned.
template <typename T>
struct Vec32;
template <>
struct Vec32<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Vec32<double> {
  typedef double type __attribute__((vector_size(32)));
};

template <typename V, typename T>
SKA_INLINE_HOT V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V, typename T>
SKA_INLINE_HOT void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// Outputs [ow, ow + kVecs * lanes) of one row, accumulated in kVecs registers (independent FMA
// chains) over every plane and tap, then stored.
template <typename T, int kVecs>
SKA_INLINE_HOT void correlate_block(const T* const* bufs, const T* const* kernels, int64_t planes,
                                    const Correlation& c, int64_t row0, int64_t ow, T init, T* o) {
  using V = typename Vec32<T>::type;
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  V acc[kVecs];
  for (int v = 0; v < kVecs; ++v) acc[v] = V{} + init;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < c.kh; ++i) {
      const T* src = bufs[p] + row0 + i * c.dil_h * c.buf_w + ow;
      const T* k = kernels[p] + i * c.kw;
      for (int64_t j = 0; j < c.kw; ++j) {
        const V kv = V{} + k[j];
        const T* s = src + j * c.dil_w;
        for (int v = 0; v < kVecs; ++v) acc[v] += kv * load<V>(s + v * kLanes);
      }
    }
  }
  for (int v = 0; v < kVecs; ++v) store(o + ow + v * kLanes, acc[v]);
}

// Every output of one row in blocks of kVecs vectors; a last partial block is recomputed as a
// full block ending at the row's end (overlapping outputs get the same values). Needs
// stride_w == 1 and out_w >= one block.
template <typename T, int kVecs>
SKA_INLINE_HOT void correlate_row(const T* const* bufs, const T* const* kernels, int64_t planes,
                                  const Correlation& c, int64_t row0, T init, T* o) {
  constexpr int64_t kWidth = kVecs * (32 / sizeof(T));
  int64_t ow = 0;
  for (; ow + kWidth <= c.out_w; ow += kWidth) {
    correlate_block<T, kVecs>(bufs, kernels, planes, c, row0, ow, init, o);
  }
  if (ow < c.out_w)
    correlate_block<T, kVecs>(bufs, kernels, planes, c, row0, c.out_w - kWidth, init, o);
}

// out = init + the sum over `planes` (buffer, kernel) pairs of their correlations.
template <typename T>
SKA_INLINE_HOT void correlate(const T* const* bufs, const T* const* kernels, int64_t planes,
                              const Correlation& c, T init, T* out) {
  constexpr int64_t kLanes = 32 / sizeof(T);
  for (int64_t oh = 0; oh < c.out_h; ++oh) {
    T* o = out + oh * c.out_w;
    const int64_t row0 = oh * c.stride_h * c.buf_w;
    if (c.stride_w == 1 && c.out_w >= 4 * kLanes) {
      correlate_row<T, 4>(bufs, kernels, planes, c, row0, init, o);
    } else if (c.stride_w == 1 && c.out_w >= 2 * kLanes) {
      correlate_row<T, 2>(bufs, kernels, planes, c, row0, init, o);
    } else if (c.stride_w == 1 && c.out_w >= kLanes) {
      correlate_row<T, 1>(bufs, kernels, planes, c, row0, init, o);
    } else {  // narrow rows or a strided width: one output at a time
      for (int64_t ow = 0; ow < c.out_w; ++ow) {
        T acc = init;
        for (int64_t p = 0; p < planes; ++p) {
          for (int64_t i = 0; i < c.kh; ++i) {
            const T* src = bufs[p] + row0 + i * c.dil_h * c.buf_w + ow * c.stride_w;
            const T* k = kernels[p] + i * c.kw;
            for (int64_t j = 0; j < c.kw; ++j) acc += k[j] * src[j * c.dil_w];
          }
        }
        o[ow] = acc;
      }
    }
  }
}

// sum over (oh, ow) of dy[oh, ow] * buf[oh * stride_h + i * dil_h, ow * stride_w + j * dil_w]:
// one kernel tap's weight gradient from one plane, in two vectors of partial sums.
template <typename T>
SKA_INLINE_HOT T correlate_tap(const T* buf, const T* dy, const Correlation& c, int64_t i,
                               int64_t j) {
  using V = typename Vec32<T>::type;
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  V acc0 = V{}, acc1 = V{};
  T tail = T(0);
  for (int64_t oh = 0; oh < c.out_h; ++oh) {
    const T* s = buf + (oh * c.stride_h + i * c.dil_h) * c.buf_w + j * c.dil_w;
    const T* d = dy + oh * c.out_w;
    int64_t ow = 0;
    if (c.stride_w == 1) {
      for (; ow + 2 * kLanes <= c.out_w; ow += 2 * kLanes) {
        acc0 += load<V>(d + ow) * load<V>(s + ow);
        acc1 += load<V>(d + ow + kLanes) * load<V>(s + ow + kLanes);
      }
      if (ow + kLanes <= c.out_w) {
        acc0 += load<V>(d + ow) * load<V>(s + ow);
        ow += kLanes;
      }
    }
    for (; ow < c.out_w; ++ow) tail += d[ow] * s[ow * c.stride_w];
  }
  const V sum = acc0 + acc1;
  for (int64_t l = 0; l < kLanes; ++l) tail += sum[l];
  return tail;
}

// --- one plane of each kernel: an inline template, and an f32 entry compiled for AVX2 as well ---

// y[co] for the `mult` outputs of one input plane: the plane is padded once into buf.
template <typename T>
SKA_INLINE_HOT void forward_plane(const T* x, const T* w, const T* bias, int64_t co0, int64_t mult,
                                  const Placement& pl, const Correlation& c, int64_t h, int64_t wd,
                                  int64_t kernel_area, int64_t out_area, T* buf, T* y) {
  place_plane(x, h, wd, pl, buf);
  for (int64_t m = 0; m < mult; ++m) {
    const T* k = w + (co0 + m) * kernel_area;
    correlate<T>(&buf, &k, 1, c, bias ? bias[co0 + m] : T(0), y + m * out_area);
  }
}

SKA_CPU_SIMD_CLONES
void forward_plane_f32(const float* x, const float* w, const float* bias, int64_t co0, int64_t mult,
                       const Placement& pl, const Correlation& c, int64_t h, int64_t wd,
                       int64_t kernel_area, int64_t out_area, float* buf, float* y) {
  forward_plane<float>(x, w, bias, co0, mult, pl, c, h, wd, kernel_area, out_area, buf, y);
}

// grad_x of one input plane: the sum over its `mult` outputs of correlate(placed grad_y, flipped
// kernel). bufs holds mult padded planes, flipped mult kernels.
template <typename T>
SKA_INLINE_HOT void backward_input_plane(const T* grad_y, const T* w, int64_t mult,
                                         const Placement& pl, const Correlation& c, int64_t h_out,
                                         int64_t w_out, int64_t kernel_area, T* bufs, T* flipped,
                                         T* grad_x) {
  constexpr int64_t kMaxStack = 8;
  const T* buf_ptrs[kMaxStack];
  const T* kernel_ptrs[kMaxStack];
  const int64_t plane_size = pl.rows * pl.cols;
  for (int64_t m0 = 0; m0 < mult; m0 += kMaxStack) {  // multipliers above 8: in batches of 8
    const int64_t count = std::min(kMaxStack, mult - m0);
    for (int64_t m = 0; m < count; ++m) {
      place_plane(grad_y + (m0 + m) * h_out * w_out, h_out, w_out, pl, bufs + m * plane_size);
      const T* k = w + (m0 + m) * kernel_area;
      T* f = flipped + m * kernel_area;
      for (int64_t t = 0; t < kernel_area; ++t) f[t] = k[kernel_area - 1 - t];
      buf_ptrs[m] = bufs + m * plane_size;
      kernel_ptrs[m] = f;
    }
    if (m0 == 0) {
      correlate<T>(buf_ptrs, kernel_ptrs, count, c, T(0), grad_x);
    } else {  // rare (multipliers above 8): add this batch's sum
      std::vector<T> part(static_cast<size_t>(c.out_h * c.out_w));
      correlate<T>(buf_ptrs, kernel_ptrs, count, c, T(0), part.data());
      for (size_t e = 0; e < part.size(); ++e) grad_x[e] += part[e];
    }
  }
}

SKA_CPU_SIMD_CLONES
void backward_input_plane_f32(const float* grad_y, const float* w, int64_t mult,
                              const Placement& pl, const Correlation& c, int64_t h_out,
                              int64_t w_out, int64_t kernel_area, float* bufs, float* flipped,
                              float* grad_x) {
  backward_input_plane<float>(grad_y, w, mult, pl, c, h_out, w_out, kernel_area, bufs, flipped,
                              grad_x);
}

// acc[tap] += the weight gradient of every tap from one (input plane, output gradient) pair.
template <typename T>
SKA_INLINE_HOT void backward_weight_plane(const T* x, const T* dy, const Placement& pl,
                                          const Correlation& c, int64_t h, int64_t wd, T* buf,
                                          double* acc) {
  place_plane(x, h, wd, pl, buf);
  for (int64_t i = 0; i < c.kh; ++i) {
    for (int64_t j = 0; j < c.kw; ++j) {
      acc[i * c.kw + j] += static_cast<double>(correlate_tap<T>(buf, dy, c, i, j));
    }
  }
}

SKA_CPU_SIMD_CLONES
void backward_weight_plane_f32(const float* x, const float* dy, const Placement& pl,
                               const Correlation& c, int64_t h, int64_t wd, float* buf,
                               double* acc) {
  backward_weight_plane<float>(x, dy, pl, c, h, wd, buf, acc);
}

// The padded input of the forward pass and the weight gradient: just large enough for the last
// output's taps (rows past it are never read).
Placement input_placement(const ConvGeometry& g) {
  return {(g.h_out - 1) * g.p.stride_h + (g.kh - 1) * g.p.dilation_h + 1,
          (g.w_out - 1) * g.p.stride_w + (g.kw - 1) * g.p.dilation_w + 1,
          g.p.pad_h,
          g.p.pad_w,
          1,
          1};
}

Correlation input_correlation(const ConvGeometry& g, const Placement& pl) {
  return {g.kh,           g.kw,    g.p.stride_h, g.p.stride_w, g.p.dilation_h,
          g.p.dilation_w, g.h_out, g.w_out,      pl.cols};
}

}  // namespace

template <typename T>
void depthwise_forward(const T* x, const T* w, const T* bias, const ConvGeometry& g, T* y) {
  const int64_t mult = g.c_out / g.c_in;
  const Placement pl = input_placement(g);
  const Correlation c = input_correlation(g, pl);
#pragma omp parallel if (g.work() > kConvParallelWork)
  {
    std::vector<T> buf(static_cast<size_t>(pl.rows * pl.cols));
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < g.n * g.c_in; ++plane) {
      const int64_t n = plane / g.c_in, co0 = (plane % g.c_in) * mult;
      const T* xp = x + plane * g.in_area();
      T* yp = y + (n * g.c_out + co0) * g.out_area();
      if constexpr (std::is_same_v<T, float>) {
        forward_plane_f32(xp, w, bias, co0, mult, pl, c, g.h, g.w, g.kernel_area(), g.out_area(),
                          buf.data(), yp);
      } else {
        forward_plane<T>(xp, w, bias, co0, mult, pl, c, g.h, g.w, g.kernel_area(), g.out_area(),
                         buf.data(), yp);
      }
    }
  }
}

template <typename T>
void depthwise_backward_input(const T* grad_y, const T* w, const ConvGeometry& g, T* grad_x) {
  const int64_t mult = g.c_out / g.c_in;
  // grad_y placed with zeros between entries (strides) and shifted so that a stride-1 correlation
  // with the flipped kernel gives grad_x (see the header comment).
  const Placement pl{g.h + (g.kh - 1) * g.p.dilation_h,
                     g.w + (g.kw - 1) * g.p.dilation_w,
                     (g.kh - 1) * g.p.dilation_h - g.p.pad_h,
                     (g.kw - 1) * g.p.dilation_w - g.p.pad_w,
                     g.p.stride_h,
                     g.p.stride_w};
  const Correlation c{g.kh, g.kw, 1, 1, g.p.dilation_h, g.p.dilation_w, g.h, g.w, pl.cols};
  const int64_t stacked = std::min<int64_t>(mult, 8);
#pragma omp parallel if (g.work() > kConvParallelWork)
  {
    std::vector<T> bufs(static_cast<size_t>(stacked * pl.rows * pl.cols));
    std::vector<T> flipped(static_cast<size_t>(stacked * g.kernel_area()));
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < g.n * g.c_in; ++plane) {
      const int64_t n = plane / g.c_in, co0 = (plane % g.c_in) * mult;
      const T* gy = grad_y + (n * g.c_out + co0) * g.out_area();
      const T* wp = w + co0 * g.kernel_area();
      T* gx = grad_x + plane * g.in_area();
      if constexpr (std::is_same_v<T, float>) {
        backward_input_plane_f32(gy, wp, mult, pl, c, g.h_out, g.w_out, g.kernel_area(),
                                 bufs.data(), flipped.data(), gx);
      } else {
        backward_input_plane<T>(gy, wp, mult, pl, c, g.h_out, g.w_out, g.kernel_area(), bufs.data(),
                                flipped.data(), gx);
      }
    }
  }
}

template <typename T>
void depthwise_backward_weight(const T* grad_y, const T* x, const ConvGeometry& g, T* grad_w) {
  if (g.out_area() == 0) {  // no output positions: no tap is ever used
    std::fill(grad_w, grad_w + g.c_out * g.kernel_area(), T(0));
    return;
  }
  const int64_t mult = g.c_out / g.c_in;
  const Placement pl = input_placement(g);
  const Correlation c = input_correlation(g, pl);
#pragma omp parallel if (g.work() > kConvParallelWork)
  {
    std::vector<T> buf(static_cast<size_t>(pl.rows * pl.cols));
    std::vector<double> acc(static_cast<size_t>(g.kernel_area()));
#pragma omp for schedule(static)
    for (int64_t co = 0; co < g.c_out; ++co) {  // each thread owns whole output channels
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t n = 0; n < g.n; ++n) {
        const T* xp = x + (n * g.c_in + co / mult) * g.in_area();
        const T* dy = grad_y + (n * g.c_out + co) * g.out_area();
        if constexpr (std::is_same_v<T, float>) {
          backward_weight_plane_f32(xp, dy, pl, c, g.h, g.w, buf.data(), acc.data());
        } else {
          backward_weight_plane<T>(xp, dy, pl, c, g.h, g.w, buf.data(), acc.data());
        }
      }
      for (int64_t t = 0; t < g.kernel_area(); ++t) {
        grad_w[co * g.kernel_area() + t] = static_cast<T>(acc[static_cast<size_t>(t)]);
      }
    }
  }
}

template void depthwise_forward<float>(const float*, const float*, const float*,
                                       const ConvGeometry&, float*);
template void depthwise_forward<double>(const double*, const double*, const double*,
                                        const ConvGeometry&, double*);
template void depthwise_backward_input<float>(const float*, const float*, const ConvGeometry&,
                                              float*);
template void depthwise_backward_input<double>(const double*, const double*, const ConvGeometry&,
                                               double*);
template void depthwise_backward_weight<float>(const float*, const float*, const ConvGeometry&,
                                               float*);
template void depthwise_backward_weight<double>(const double*, const double*, const ConvGeometry&,
                                                double*);

}  // namespace ska::cpu
