// Internal to the CPU convolution kernels (conv2d.cpp, conv2d_depthwise.cpp, conv2d_nhwc.cpp): the
// sizes of one convolution read from its operands, and which output positions a kernel tap reaches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/backend.h"

namespace ska::cpu {

// Below this many multiply-adds, threads cost more than they save.
constexpr int64_t kConvParallelWork = 1 << 16;
// Elements of one im2col block (1 MiB of f32) where the kernels gather the im2col matrices of
// several small samples (a token grid has only 49 or 64 pixels) to multiply them in one GEMM:
// small enough to stay in cache between im2col and GEMM, large enough for an efficient GEMM.
constexpr int64_t kConvBlockElements = int64_t{1} << 18;

// Sizes of one convolution, read from the input, weight and output shapes.
struct ConvGeometry {
  int64_t n, c_in, h, w;
  int64_t c_out, kh, kw;
  int64_t h_out, w_out;
  int64_t groups, c_in_group, c_out_group;
  Conv2dParams p;

  int64_t kernel_area() const { return kh * kw; }
  int64_t col_rows() const { return c_in_group * kh * kw; }  // rows of one group's im2col matrix
  int64_t out_area() const { return h_out * w_out; }
  int64_t in_area() const { return h * w; }
  // Multiply-adds of the whole convolution.
  int64_t work() const { return n * c_out * out_area() * col_rows(); }
  bool is_depthwise() const { return c_in_group == 1 && groups == c_in; }
  bool is_pointwise() const {  // 1x1, stride 1, no padding: the input already is the im2col matrix
    return kh == 1 && kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  }
};

// The output positions o in [first, last) whose input position o * stride + offset lies in
// [0, in_len), where offset = k * dilation - pad for kernel tap k.
inline std::pair<int64_t, int64_t> valid_outputs(int64_t offset, int64_t stride, int64_t in_len,
                                                 int64_t out_len) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = in_len - 1 - offset < 0 ? 0 : (in_len - 1 - offset) / stride + 1;
  const int64_t lo = std::min(first, out_len), hi = std::min(last, out_len);
  return {lo, std::max(lo, hi)};
}

// Depthwise kernels (conv2d_depthwise.cpp), for f32 and f64; pointers to contiguous NCHW data.
template <typename T>
void depthwise_forward(const T* x, const T* w, const T* bias, const ConvGeometry& g, T* y);
template <typename T>
void depthwise_backward_input(const T* grad_y, const T* w, const ConvGeometry& g, T* grad_x);
template <typename T>
void depthwise_backward_weight(const T* grad_y, const T* x, const ConvGeometry& g, T* grad_w);

// Dense and grouped kernels of channels-last operands (conv2d_nhwc.cpp), for f32 and f64: x and
// grad_x [N, H, W, C_in], y and grad_y [N, Ho, Wo, C_out] in memory; w and grad_w
// [C_out, C_in / groups, kh, kw] contiguous. grad_x and grad_w are overwritten.
template <typename T>
void nhwc_forward(const T* x, const T* w, const T* bias, const ConvGeometry& g, T* y);
template <typename T>
void nhwc_backward_input(const T* grad_y, const T* w, const ConvGeometry& g, T* grad_x);
template <typename T>
void nhwc_backward_weight(const T* grad_y, const T* x, const ConvGeometry& g, T* grad_w);

}  // namespace ska::cpu
