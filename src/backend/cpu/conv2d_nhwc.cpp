// CPU kernels: dense and grouped 2-D convolution of channels-last operands (x [N, H, W, C_in] and
// y [N, Ho, Wo, C_out] in memory), one GEMM per group over a block of output pixels of any samples.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "backend/cpu/blas.h"
#include "backend/cpu/conv2d_geometry.h"

namespace ska::cpu {

namespace {

// The im2col row of every output pixel of a group: kh * kw runs of the group's C_in / groups
// input channels, one per tap (zeros where the tap falls in the padding). The weight is read
// in the same order, [C_out, kh, kw, C_in / groups] (reordered_weight).
template <typename T>
void im2col_rows(const T* x, const ConvGeometry& g, int64_t group, int64_t first_row, int64_t rows,
                 T* col) {
  const int64_t cig = g.c_in_group, area = g.out_area();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pixel = first_row + r, n = pixel / area, oh = pixel % area / g.w_out,
                  ow = pixel % g.w_out;
    const T* sample = x + n * g.in_area() * g.c_in + group * cig;
    T* dst = col + r * g.col_rows();
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ih = oh * g.p.stride_h + i * g.p.dilation_h - g.p.pad_h;
      for (int64_t j = 0; j < g.kw; ++j, dst += cig) {
        const int64_t iw = ow * g.p.stride_w + j * g.p.dilation_w - g.p.pad_w;
        if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) {
          std::fill(dst, dst + cig, T(0));
        } else {
          const T* src = sample + (ih * g.w + iw) * g.c_in;
          std::copy(src, src + cig, dst);
        }
      }
    }
  }
}

// The adjoint of im2col_rows: each entry of col is added to the input element it was read from.
template <typename T>
void col2im_rows_add(const T* col, const ConvGeometry& g, int64_t group, int64_t first_row,
                     int64_t rows, T* x) {
  const int64_t cig = g.c_in_group, area = g.out_area();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pixel = first_row + r, n = pixel / area, oh = pixel % area / g.w_out,
                  ow = pixel % g.w_out;
    T* sample = x + n * g.in_area() * g.c_in + group * cig;
    const T* src = col + r * g.col_rows();
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ih = oh * g.p.stride_h + i * g.p.dilation_h - g.p.pad_h;
      for (int64_t j = 0; j < g.kw; ++j, src += cig) {
        const int64_t iw = ow * g.p.stride_w + j * g.p.dilation_w - g.p.pad_w;
        if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
        T* dst = sample + (ih * g.w + iw) * g.c_in;
        for (int64_t c = 0; c < cig; ++c) dst[c] += src[c];
      }
    }
  }
}

// w [C_out, C_in / groups, kh, kw] reordered to [C_out, kh, kw, C_in / groups] (and back).
template <typename T>
std::unique_ptr<T[]> reordered_weight(const T* w, const ConvGeometry& g) {
  const int64_t cig = g.c_in_group, taps = g.kernel_area(), k = g.col_rows();
  std::unique_ptr<T[]> out(new T[g.c_out * k]);
  for (int64_t o = 0; o < g.c_out; ++o) {
    for (int64_t c = 0; c < cig; ++c) {
      for (int64_t t = 0; t < taps; ++t) out[o * k + t * cig + c] = w[o * k + c * taps + t];
    }
  }
  return out;
}

template <typename T>
void restore_weight_order(const T* reordered, const ConvGeometry& g, T* w) {
  const int64_t cig = g.c_in_group, taps = g.kernel_area(), k = g.col_rows();
  for (int64_t o = 0; o < g.c_out; ++o) {
    for (int64_t c = 0; c < cig; ++c) {
      for (int64_t t = 0; t < taps; ++t) w[o * k + c * taps + t] = reordered[o * k + t * cig + c];
    }
  }
}

int64_t block_rows(const ConvGeometry& g) {
  return std::max<int64_t>(1, kConvBlockElements / std::max<int64_t>(1, g.col_rows()));
}

// Threads for one call; BLAS itself runs single-threaded inside them (blas.h).
int64_t team_size(const ConvGeometry& g) {
  use_single_threaded_blas();
  const bool parallel = g.work() > kConvParallelWork && !omp_in_parallel();
  return parallel ? omp_get_max_threads() : 1;
}

}  // namespace

// Blocks of output pixels go to the threads; each builds its block's im2col rows per group in its
// own buffer and multiplies them by the group's weight straight into y's rows (ldc = C_out). A
// 1x1 convolution of stride 1 reads x's rows as they are.
template <typename T>
void nhwc_forward(const T* x, const T* w, const T* bias, const ConvGeometry& g, T* y) {
  const int64_t k = g.col_rows(), pixels = g.n * g.out_area(), rows = block_rows(g);
  const int64_t blocks = (pixels + rows - 1) / rows, teams = team_size(g);
  const std::unique_ptr<T[]> wr = reordered_weight(w, g);
  const bool direct = g.is_pointwise();
  const std::unique_ptr<T[]> cols(direct ? nullptr : new T[teams * rows * k]);
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    T* col = direct ? nullptr : cols.get() + omp_get_thread_num() * rows * k;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * rows, m = std::min(rows, pixels - first);
      T* yb = y + first * g.c_out;
      if (bias != nullptr) {
        for (int64_t r = 0; r < m; ++r) std::copy(bias, bias + g.c_out, yb + r * g.c_out);
      }
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* a = direct ? x + first * g.c_in + grp * k : col;
        if (!direct) im2col_rows(x, g, grp, first, m, col);
        blas_gemm(CblasNoTrans, CblasTrans, blas_int(m), blas_int(g.c_out_group), blas_int(k), T(1),
                  a, blas_int(direct ? g.c_in : k), wr.get() + grp * g.c_out_group * k, blas_int(k),
                  T(bias != nullptr ? 1 : 0), yb + grp * g.c_out_group, blas_int(g.c_out));
      }
    }
  }
}

// The im2col rows' gradient, grad_y's rows times the group's weight, is added back to the input
// pixels it came from. Blocks hold whole samples, so no two threads add into the same pixel.
template <typename T>
void nhwc_backward_input(const T* grad_y, const T* w, const ConvGeometry& g, T* grad_x) {
  const int64_t k = g.col_rows(), area = g.out_area(), teams = team_size(g);
  const std::unique_ptr<T[]> wr = reordered_weight(w, g);
  const bool direct = g.is_pointwise();
  const int64_t per_team = (g.n + teams - 1) / teams;
  const int64_t samples = std::clamp<int64_t>(block_rows(g) / area, 1, per_team);
  const int64_t blocks = (g.n + samples - 1) / samples, rows = samples * area;
  const std::unique_ptr<T[]> cols(direct ? nullptr : new T[teams * rows * k]);
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    T* col = direct ? nullptr : cols.get() + omp_get_thread_num() * rows * k;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * samples, n1 = std::min(g.n, n0 + samples);
      const int64_t first = n0 * area, m = (n1 - n0) * area;
      T* gx = grad_x + n0 * g.in_area() * g.c_in;
      if (!direct) std::fill(gx, gx + (n1 - n0) * g.in_area() * g.c_in, T(0));
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        T* c = direct ? grad_x + first * g.c_in + grp * k : col;
        blas_gemm(CblasNoTrans, CblasNoTrans, blas_int(m), blas_int(k), blas_int(g.c_out_group),
                  T(1), grad_y + first * g.c_out + grp * g.c_out_group, blas_int(g.c_out),
                  wr.get() + grp * g.c_out_group * k, blas_int(k), T(0), c,
                  blas_int(direct ? g.c_in : k));
        if (!direct) col2im_rows_add(col, g, grp, first, m, grad_x);
      }
    }
  }
}

// grad_w (reordered) = grad_y's rows^T times the im2col rows, block after block in a fixed
// order. Within a block the threads build the rows together, then each multiplies into its own
// band of grad_w's columns, so every element sums the same products in the same order whatever
// the number of threads.
template <typename T>
void nhwc_backward_weight(const T* grad_y, const T* x, const ConvGeometry& g, T* grad_w) {
  const int64_t k = g.col_rows(), pixels = g.n * g.out_area(), rows = block_rows(g);
  const int64_t teams = team_size(g);
  const bool direct = g.is_pointwise();
  const std::unique_ptr<T[]> col(direct ? nullptr : new T[rows * k]);
  const std::unique_ptr<T[]> gw(new T[g.c_out * k]);
  std::fill(gw.get(), gw.get() + g.c_out * k, T(0));
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int64_t team = omp_get_thread_num(), size = omp_get_num_threads();
    const int64_t band = ((k + size - 1) / size + 15) / 16 * 16;
    const int64_t k0 = std::min(k, team * band), k1 = std::min(k, k0 + band);
    for (int64_t first = 0; first < pixels; first += rows) {
      const int64_t m = std::min(rows, pixels - first);
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        if (!direct) {
          const int64_t part = (m + size - 1) / size, r0 = std::min(m, team * part),
                        r1 = std::min(m, r0 + part);
          im2col_rows(x, g, grp, first + r0, r1 - r0, col.get() + r0 * k);
#pragma omp barrier
        }
        const T* b = direct ? x + first * g.c_in + grp * k : col.get();
        if (k1 > k0) {
          blas_gemm(CblasTrans, CblasNoTrans, blas_int(g.c_out_group), blas_int(k1 - k0),
                    blas_int(m), T(1), grad_y + first * g.c_out + grp * g.c_out_group,
                    blas_int(g.c_out), b + k0, blas_int(direct ? g.c_in : k), T(1),
                    gw.get() + grp * g.c_out_group * k + k0, blas_int(k));
        }
        if (!direct) {
#pragma omp barrier
        }
      }
    }
  }
  restore_weight_order(gw.get(), g, grad_w);
}

template void nhwc_forward<float>(const float*, const float*, const float*, const ConvGeometry&,
                                  float*);
template void nhwc_forward<double>(const double*, const double*, const double*, const ConvGeometry&,
                                   double*);
template void nhwc_backward_input<float>(const float*, const float*, const ConvGeometry&, float*);
template void nhwc_backward_input<double>(const double*, const double*, const ConvGeometry&,
                                          double*);
template void nhwc_backward_weight<float>(const float*, const float*, const ConvGeometry&, float*);
template void nhwc_backward_weight<double>(const double*, const double*, const ConvGeometry&,
                                           double*);

}  // namespace ska::cpu
