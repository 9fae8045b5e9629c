// CPU kernels: 2-D convolution. NCHW dense and grouped convolutions use im2col + GEMM per sample
// and group, or per block of small samples (col2im for the input gradient), samples spread over
// threads; channels-last ones the pixel-block GEMMs of conv2d_nhwc.cpp; depthwise ones the direct
// loops of conv2d_depthwise.cpp (channels-last depthwise calls run on NCHW copies).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/conv2d_geometry.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

// Output length along one dim; 0 when the dilated kernel does not fit the padded input.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

// With `channels_last`, x and y are channels-last (channels_last_call checked it).
ConvGeometry conv_geometry(const char* kernel, const Tensor& x, const Tensor& w, const Tensor& y,
                           const Conv2dParams& p, bool channels_last = false) {
  SKA_CHECK(x.dim() == 4 && w.dim() == 4 && y.dim() == 4, ShapeError, kernel,
            ": input, weight and output must be 4-d, got ", shape_str(x.shape()), ", ",
            shape_str(w.shape()), ", ", shape_str(y.shape()));
  SKA_CHECK(x.dtype() == w.dtype() && y.dtype() == w.dtype(), DTypeError, kernel,
            ": operands of different dtypes");
  SKA_CHECK(w.is_contiguous() && (channels_last || (x.is_contiguous() && y.is_contiguous())),
            ValueError, kernel, ": operands must be contiguous");
  ConvGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
                 y.size(2), y.size(3), p.groups,  0,         0,         p};
  SKA_CHECK(p.groups >= 1 && g.c_in % p.groups == 0 && g.c_out % p.groups == 0 &&
                w.size(1) * p.groups == g.c_in && y.size(0) == g.n && y.size(1) == g.c_out,
            ShapeError, kernel, ": input ", shape_str(x.shape()), ", weight ", shape_str(w.shape()),
            " and output ", shape_str(y.shape()), " do not match groups = ", p.groups);
  SKA_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1 &&
                p.pad_h >= 0 && p.pad_w >= 0 &&
                g.h_out == conv_out_size(g.h, g.kh, p.stride_h, p.pad_h, p.dilation_h) &&
                g.w_out == conv_out_size(g.w, g.kw, p.stride_w, p.pad_w, p.dilation_w),
            ShapeError, kernel, ": output ", shape_str(y.shape()), " does not match input ",
            shape_str(x.shape()), " and weight ", shape_str(w.shape()), " for the given params");
  g.c_in_group = g.c_in / p.groups;
  g.c_out_group = g.c_out / p.groups;
  return g;
}

// col[(c, i, j), (oh, ow)] = x[c, oh * sh + i * dh - ph, ow * sw + j * dw - pw], 0 in the padding.
// Rows of col are `ld` elements apart (default: the output area, a contiguous [k, area] matrix).
template <typename T>
void im2col(const T* x, const ConvGeometry& g, T* col, int64_t ld = 0) {
  const int64_t rows = g.col_rows(), cols = g.out_area();
  if (ld == 0) ld = cols;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = r / g.kernel_area(), i = (r / g.kw) % g.kh, j = r % g.kw;
    const int64_t off_h = i * g.p.dilation_h - g.p.pad_h, off_w = j * g.p.dilation_w - g.p.pad_w;
    const auto [oh_lo, oh_hi] = valid_outputs(off_h, g.p.stride_h, g.h, g.h_out);
    const auto [ow_lo, ow_hi] = valid_outputs(off_w, g.p.stride_w, g.w, g.w_out);
    const T* plane = x + c * g.in_area();
    T* dst_rows = col + r * ld;
    std::fill(dst_rows, dst_rows + cols, T(0));
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      const T* src = plane + (oh * g.p.stride_h + off_h) * g.w + off_w;
      T* dst = dst_rows + oh * g.w_out;
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow] = src[ow * g.p.stride_w];
    }
  }
}

// The adjoint of im2col: x[c, ...] += every col entry that was read from it; rows of col `ld`
// elements apart as there.
template <typename T>
void col2im_add(const T* col, const ConvGeometry& g, T* x, int64_t ld = 0) {
  const int64_t cols = g.out_area();
  if (ld == 0) ld = cols;
#pragma omp parallel for schedule(static) if (g.col_rows() * cols > 32768)
  for (int64_t c = 0; c < g.c_in_group; ++c) {  // one thread per plane: no write conflicts
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t off_h = i * g.p.dilation_h - g.p.pad_h,
                      off_w = j * g.p.dilation_w - g.p.pad_w;
        const auto [oh_lo, oh_hi] = valid_outputs(off_h, g.p.stride_h, g.h, g.h_out);
        const auto [ow_lo, ow_hi] = valid_outputs(off_w, g.p.stride_w, g.w, g.w_out);
        const T* src_rows = col + ((c * g.kh + i) * g.kw + j) * ld;
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* dst = x + c * g.in_area() + (oh * g.p.stride_h + off_h) * g.w + off_w;
          const T* src = src_rows + oh * g.w_out;
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow * g.p.stride_w] += src[ow];
        }
      }
    }
  }
}

// A [1, rows, cols] matrix view of `base`'s storage starting `offset` elements into base; with
// `transposed`, the memory holds the [cols, rows] matrix row-major.
Tensor matrix_view(const Tensor& base, int64_t offset, int64_t rows, int64_t cols,
                   bool transposed = false) {
  const Shape strides = transposed ? Shape{rows * cols, 1, rows} : Shape{rows * cols, cols, 1};
  return Tensor::make_view(base.storage(), {1, rows, cols}, strides, base.offset() + offset,
                           base.dtype());
}

void run_gemm(const Tensor& a, const Tensor& b, const Tensor& c, float beta) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.c = c;
  args.beta = beta;
  gemm(args);
}

// Element offset of group `grp`'s first channel in sample `n` of an [N, C, H, W] tensor.
int64_t group_offset(int64_t n, int64_t channels, int64_t grp, int64_t group_channels,
                     int64_t area) {
  return (n * channels + grp * group_channels) * area;
}

// --- Dense and grouped: im2col + GEMM ---

// With at least as many samples as threads, whole samples go to the threads (each with its own
// im2col buffer; its im2col and GEMMs then run on that thread alone): one parallel region per
// convolution instead of two per sample. Otherwise (1: one team) the samples run in turn and each
// im2col and GEMM is split over the threads.
int64_t sample_threads(const ConvGeometry& g) {
  const int64_t threads = omp_get_max_threads();
  const bool by_sample =
      threads > 1 && g.n >= threads && g.work() > kConvParallelWork && !omp_in_parallel();
  return by_sample ? threads : 1;
}

// How many samples' im2col matrices a thread puts side by side for one GEMM: as many as fit in
// kConvBlockElements, at most an even share of the batch per thread; 1 (one GEMM per sample and
// group) when a sample's alone fills a block.
int64_t block_samples(const ConvGeometry& g) {
  const int64_t per_sample = std::max<int64_t>(1, g.col_rows() * g.out_area());
  const int64_t threads = sample_threads(g), share = (g.n + threads - 1) / threads;
  return std::clamp<int64_t>(kConvBlockElements / per_sample, 1, std::max<int64_t>(share, 1));
}

// Small samples: the im2col matrices of a block of S samples side by side, [K, S x area], times
// the group's weight in one GEMM; its [C_out / groups, S x area] result is then copied to each
// sample's planes with the bias added, as the per-sample path adds it after its GEMM.
template <typename T>
void dense_forward_blocked(const T* x, const T* w, const T* bias, const ConvGeometry& g,
                           int64_t samples, T* y) {
  const int64_t k = g.col_rows(), area = g.out_area(), width = samples * area;
  const int64_t cog = g.c_out_group, teams = sample_threads(g);
  const int64_t blocks = (g.n + samples - 1) / samples;
  const std::unique_ptr<T[]> buffers(new T[teams * (k + cog) * width]);
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    T* col = buffers.get() + omp_get_thread_num() * (k + cog) * width;
    T* out = col + k * width;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * samples, count = std::min(samples, g.n - n0);
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        for (int64_t s = 0; s < count; ++s) {
          im2col(x + group_offset(n0 + s, g.c_in, grp, g.c_in_group, g.in_area()), g,
                 col + s * area, width);
        }
        blas_gemm(CblasNoTrans, CblasNoTrans, blas_int(cog), blas_int(count * area), blas_int(k),
                  T(1), w + grp * cog * k, blas_int(k), col, blas_int(width), T(0), out,
                  blas_int(width));
        for (int64_t s = 0; s < count; ++s) {
          T* dst = y + group_offset(n0 + s, g.c_out, grp, cog, area);
          for (int64_t o = 0; o < cog; ++o) {
            const T* src = out + o * width + s * area;
            const T v = bias != nullptr ? bias[grp * cog + o] : T(0);
            for (int64_t e = 0; e < area; ++e) dst[o * area + e] = src[e] + v;
          }
        }
      }
    }
  }
}

template <typename T>
void dense_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeometry& g,
                   const Tensor& y) {
  const int64_t samples = g.is_pointwise() ? 1 : block_samples(g);
  if (samples > 1) {
    use_single_threaded_blas();
    return dense_forward_blocked(static_cast<const T*>(x.data_ptr()),
                                 static_cast<const T*>(w.data_ptr()),
                                 bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                                 g, samples, static_cast<T*>(y.data_ptr()));
  }
  const int64_t k = g.col_rows(), cols = g.out_area(), teams = sample_threads(g);
  Tensor col = g.is_pointwise() ? Tensor() : Tensor::empty({teams, k, cols}, x.dtype());
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int64_t col_off = omp_get_thread_num() * k * cols;  // this thread's im2col buffer
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const int64_t x_off = group_offset(n, g.c_in, grp, g.c_in_group, g.in_area());
        Tensor b = matrix_view(x, x_off, k, cols);
        if (!g.is_pointwise()) {
          im2col(static_cast<const T*>(x.data_ptr()) + x_off, g,
                 static_cast<T*>(col.data_ptr()) + col_off);
          b = matrix_view(col, col_off, k, cols);
        }
        run_gemm(
            matrix_view(w, grp * g.c_out_group * k, g.c_out_group, k), b,
            matrix_view(y, group_offset(n, g.c_out, grp, g.c_out_group, cols), g.c_out_group, cols),
            0.0f);
      }
    }
  }
  if (!bias.defined()) return;
  const T* bp = static_cast<const T*>(bias.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
#pragma omp parallel for schedule(static) if (y.numel() > 32768)
  for (int64_t plane = 0; plane < g.n * g.c_out; ++plane) {
    T* dst = yp + plane * cols;
    const T v = bp[plane % g.c_out];
    for (int64_t e = 0; e < cols; ++e) dst[e] += v;
  }
}

// Small samples: grad_y's planes of a block of S samples packed side by side,
// [C_out / groups, S x area], times the group's weight transposed in one GEMM; the resulting
// im2col-shaped gradient is added back to each sample's input planes.
template <typename T>
void dense_backward_input_blocked(const T* grad_y, const T* w, const ConvGeometry& g,
                                  int64_t samples, T* grad_x) {
  const int64_t k = g.col_rows(), area = g.out_area(), width = samples * area;
  const int64_t cog = g.c_out_group, teams = sample_threads(g);
  const int64_t blocks = (g.n + samples - 1) / samples, sample_size = g.c_in * g.in_area();
  const std::unique_ptr<T[]> buffers(new T[teams * (k + cog) * width]);
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    T* col = buffers.get() + omp_get_thread_num() * (k + cog) * width;
    T* packed = col + k * width;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {  // each block writes only its own samples
      const int64_t n0 = b * samples, count = std::min(samples, g.n - n0);
      std::fill(grad_x + n0 * sample_size, grad_x + (n0 + count) * sample_size, T(0));
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        for (int64_t s = 0; s < count; ++s) {
          const T* src = grad_y + group_offset(n0 + s, g.c_out, grp, cog, area);
          for (int64_t o = 0; o < cog; ++o) {
            std::copy(src + o * area, src + (o + 1) * area, packed + o * width + s * area);
          }
        }
        blas_gemm(CblasTrans, CblasNoTrans, blas_int(k), blas_int(count * area), blas_int(cog),
                  T(1), w + grp * cog * k, blas_int(k), packed, blas_int(width), T(0), col,
                  blas_int(width));
        for (int64_t s = 0; s < count; ++s) {
          col2im_add(col + s * area, g,
                     grad_x + group_offset(n0 + s, g.c_in, grp, g.c_in_group, g.in_area()), width);
        }
      }
    }
  }
}

template <typename T>
void dense_backward_input(const Tensor& grad_y, const Tensor& w, const ConvGeometry& g,
                          const Tensor& grad_x) {
  const int64_t samples = g.is_pointwise() ? 1 : block_samples(g);
  if (samples > 1) {
    use_single_threaded_blas();
    return dense_backward_input_blocked(static_cast<const T*>(grad_y.data_ptr()),
                                        static_cast<const T*>(w.data_ptr()), g, samples,
                                        static_cast<T*>(grad_x.data_ptr()));
  }
  const int64_t k = g.col_rows(), cols = g.out_area();
  T* gx = static_cast<T*>(grad_x.data_ptr());
  std::fill(gx, gx + grad_x.numel(), T(0));
  const int64_t teams = sample_threads(g);
  Tensor col = g.is_pointwise() ? Tensor() : Tensor::empty({teams, k, cols}, grad_x.dtype());
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int64_t col_off = omp_get_thread_num() * k * cols;  // this thread's column buffer
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {  // each sample writes only its own grad_x planes
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const int64_t x_off = group_offset(n, g.c_in, grp, g.c_in_group, g.in_area());
        const Tensor c = g.is_pointwise() ? matrix_view(grad_x, x_off, k, cols)
                                          : matrix_view(col, col_off, k, cols);
        run_gemm(matrix_view(w, grp * g.c_out_group * k, k, g.c_out_group, true),
                 matrix_view(grad_y, group_offset(n, g.c_out, grp, g.c_out_group, cols),
                             g.c_out_group, cols),
                 c, 0.0f);
        if (!g.is_pointwise()) {
          col2im_add(static_cast<const T*>(col.data_ptr()) + col_off, g, gx + x_off);
        }
      }
    }
  }
}

// grad_w of one group as one GEMM over every sample: grad_y's channels of the group as a
// [C_out_group, N x area] matrix (grad_y packed channel-major once) times the im2col columns of
// all samples side by side, [k, N x area] (each sample's im2col on its own thread). One large
// product instead of N small ones accumulated in turn.
template <typename T>
void dense_backward_weight_batched(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g,
                                   const Tensor& grad_w) {
  const int64_t k = g.col_rows(), cols = g.out_area(), width = g.n * cols;
  const Tensor gy = grad_y.view({g.n, g.c_out, cols}).permute({1, 0, 2}).contiguous();
  Tensor col = Tensor::empty({k, width}, x.dtype());
  T* cp = static_cast<T*>(col.data_ptr());
  const T* xp = static_cast<const T*>(x.data_ptr());
  for (int64_t grp = 0; grp < g.groups; ++grp) {
#pragma omp parallel for schedule(static) if (g.n > 1 && k * width > 32768)
    for (int64_t n = 0; n < g.n; ++n) {
      im2col(xp + group_offset(n, g.c_in, grp, g.c_in_group, g.in_area()), g, cp + n * cols, width);
    }
    run_gemm(matrix_view(gy, grp * g.c_out_group * width, g.c_out_group, width),
             matrix_view(col, 0, width, k, true),
             matrix_view(grad_w, grp * g.c_out_group * k, g.c_out_group, k), 0.0f);
  }
}

// Elements of the batched backward-weight buffers above which the per-sample loop runs instead.
constexpr int64_t kMaxBatchedColElements = int64_t{16} << 20;

template <typename T>
void dense_backward_weight(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g,
                           const Tensor& grad_w) {
  const int64_t k = g.col_rows(), cols = g.out_area();
  if (!g.is_pointwise() && g.n > 1 && k * g.n * cols <= kMaxBatchedColElements) {
    return dense_backward_weight_batched<T>(grad_y, x, g, grad_w);
  }
  Tensor col = g.is_pointwise() ? Tensor() : Tensor::empty({k, cols}, x.dtype());
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const int64_t x_off = group_offset(n, g.c_in, grp, g.c_in_group, g.in_area());
      Tensor b = matrix_view(x, x_off, cols, k, true);
      if (!g.is_pointwise()) {
        im2col(static_cast<const T*>(x.data_ptr()) + x_off, g, static_cast<T*>(col.data_ptr()));
        b = matrix_view(col, 0, cols, k, true);
      }
      run_gemm(matrix_view(grad_y, group_offset(n, g.c_out, grp, g.c_out_group, cols),
                           g.c_out_group, cols),
               b, matrix_view(grad_w, grp * g.c_out_group * k, g.c_out_group, k),
               n == 0 ? 0.0f : 1.0f);
    }
  }
  if (g.n == 0) {
    T* gw = static_cast<T*>(grad_w.data_ptr());
    std::fill(gw, gw + grad_w.numel(), T(0));
  }
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

// Whether a call runs channels-last (its x/y-side operands not all contiguous); every such operand
// must then be channels-last.
bool channels_last_call(const char* kernel, std::initializer_list<const Tensor*> xy) {
  bool contiguous = true;
  for (const Tensor* t : xy) contiguous = contiguous && t->is_contiguous();
  if (contiguous) return false;
  for (const Tensor* t : xy) {
    SKA_CHECK(t->is_channels_last(), ValueError, kernel,
              ": x, y and their gradients must be all contiguous or all channels-last, got ",
              t->str(), " with strides ", shape_str(t->strides()));
  }
  return true;
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                    const Tensor& y) {
  const bool cl = channels_last_call("conv2d_forward", {&x, &y});
  const ConvGeometry g = conv_geometry("conv2d_forward", x, w, y, p, cl);
  if (cl && g.is_depthwise()) {
    const Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device());
    conv2d_forward(x.contiguous(), w, bias, p, out);
    return copy(out, y);
  }
  SKA_CHECK(!bias.defined() ||
                (bias.numel() == g.c_out && bias.dtype() == y.dtype() && bias.is_contiguous()),
            ShapeError, "conv2d_forward: bias must be a contiguous [", g.c_out,
            "] tensor of the input's dtype, got ", bias.str());
  if (y.numel() == 0) return;
  if (is_16bit_float(y.dtype())) {
    const Tensor result = f32_output_like(y);
    conv2d_forward(widen_f32_like(x), widen_f32(w), widen_f32(bias), p, result);
    return round_into(result, y);
  }
  dispatch_floating(x.dtype(), "conv2d_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = static_cast<const T*>(w.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    if (cl) {
      nhwc_forward(xp, wp, ptr_or_null<T>(bias), g, yp);
    } else if (g.is_depthwise()) {
      depthwise_forward(xp, wp, ptr_or_null<T>(bias), g, yp);
    } else {
      dense_forward<T>(x, w, bias, g, y);
    }
  });
}

void conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                           const Tensor& grad_x) {
  const bool cl = channels_last_call("conv2d_backward_input", {&grad_y, &grad_x});
  const ConvGeometry g = conv_geometry("conv2d_backward_input", grad_x, w, grad_y, p, cl);
  if (cl && g.is_depthwise()) {
    const Tensor out = Tensor::empty(grad_x.shape(), grad_x.dtype(), grad_x.device());
    conv2d_backward_input(grad_y.contiguous(), w, p, out);
    return copy(out, grad_x);
  }
  if (grad_x.numel() == 0) return;
  if (is_16bit_float(grad_x.dtype())) {
    const Tensor result = f32_output_like(grad_x);
    conv2d_backward_input(widen_f32_like(grad_y), widen_f32(w), p, result);
    return round_into(result, grad_x);
  }
  dispatch_floating(grad_x.dtype(), "conv2d_backward_input", [&](auto tag) {
    using T = decltype(tag);
    const T* gy = static_cast<const T*>(grad_y.data_ptr());
    const T* wp = static_cast<const T*>(w.data_ptr());
    T* gx = static_cast<T*>(grad_x.data_ptr());
    if (cl) {
      nhwc_backward_input(gy, wp, g, gx);
    } else if (g.is_depthwise()) {
      depthwise_backward_input(gy, wp, g, gx);
    } else {
      dense_backward_input<T>(grad_y, w, g, grad_x);
    }
  });
}

void conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Conv2dParams& p,
                            const Tensor& grad_w) {
  const bool cl = channels_last_call("conv2d_backward_weight", {&grad_y, &x});
  const ConvGeometry g = conv_geometry("conv2d_backward_weight", x, grad_w, grad_y, p, cl);
  if (cl && g.is_depthwise()) {
    return conv2d_backward_weight(grad_y.contiguous(), x.contiguous(), p, grad_w);
  }
  if (grad_w.numel() == 0) return;
  if (is_16bit_float(grad_w.dtype())) {
    const Tensor result = f32_output(grad_w);
    conv2d_backward_weight(widen_f32_like(grad_y), widen_f32_like(x), p, result);
    return round_into(result, grad_w);
  }
  dispatch_floating(grad_w.dtype(), "conv2d_backward_weight", [&](auto tag) {
    using T = decltype(tag);
    const T* gy = static_cast<const T*>(grad_y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* gw = static_cast<T*>(grad_w.data_ptr());
    if (cl) {
      nhwc_backward_weight(gy, xp, g, gw);
    } else if (g.is_depthwise()) {
      depthwise_backward_weight(gy, xp, g, gw);
    } else {
      dense_backward_weight<T>(grad_y, x, g, grad_w);
    }
  });
}

}  // namespace ska::cpu
