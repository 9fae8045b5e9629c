// 2-D convolution op: argument and shape checks, the kernel call, and the gradients of the input,
// the weight and the bias.
#include "ops/conv.h"

#include <cstdint>

#include "ops/mac_counter.h"

#include "autograd/node.h"
#include "backend/backend.h"
#include "backend/conv_logits_geometry.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/reduce.h"

namespace ska {

namespace {

// Output length along one dim; 0 when the dilated kernel does not fit the padded input.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

void check_conv_params(const Conv2dParams& p) {
  SKA_CHECK(p.stride_h >= 1 && p.stride_w >= 1, ValueError, "conv2d: stride must be >= 1, got (",
            p.stride_h, ", ", p.stride_w, ")");
  SKA_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, ValueError,
            "conv2d: dilation must be >= 1, got (", p.dilation_h, ", ", p.dilation_w, ")");
  SKA_CHECK(p.pad_h >= 0 && p.pad_w >= 0, ValueError, "conv2d: padding must be >= 0, got (",
            p.pad_h, ", ", p.pad_w, ")");
  SKA_CHECK(p.groups >= 1, ValueError, "conv2d: groups must be >= 1, got ", p.groups);
}

// Checks every operand and returns the output shape [N, C_out, H_out, W_out].
Shape conv_output_shape(const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Conv2dParams& p) {
  detail::check_same_device_dtype("conv2d", x, w);
  detail::check_floating("conv2d", x);
  detail::check_dim("conv2d", x, 4, "input");
  detail::check_dim("conv2d", w, 4, "weight");
  check_conv_params(p);
  const int64_t c_in = x.size(1), c_out = w.size(0);
  SKA_CHECK(c_in % p.groups == 0 && c_out % p.groups == 0, ShapeError, "conv2d: input channels ",
            c_in, " (input ", shape_str(x.shape()), ") and output channels ", c_out, " (weight ",
            shape_str(w.shape()), ") must be divisible by groups = ", p.groups);
  SKA_CHECK(w.size(1) * p.groups == c_in, ShapeError, "conv2d: weight ", shape_str(w.shape()),
            " expects ", w.size(1) * p.groups, " input channels for groups = ", p.groups,
            ", but input ", shape_str(x.shape()), " has ", c_in);
  if (bias.defined()) {
    detail::check_same_device_dtype("conv2d", x, bias);
    SKA_CHECK(bias.dim() == 1 && bias.size(0) == c_out, ShapeError, "conv2d: bias ",
              shape_str(bias.shape()), " does not match weight ", shape_str(w.shape()));
  }
  const int64_t h_out = conv_out_size(x.size(2), w.size(2), p.stride_h, p.pad_h, p.dilation_h);
  const int64_t w_out = conv_out_size(x.size(3), w.size(3), p.stride_w, p.pad_w, p.dilation_w);
  SKA_CHECK(h_out > 0 && w_out > 0, ShapeError, "conv2d: output size ", h_out, "x", w_out,
            " <= 0 for input ", shape_str(x.shape()), " and weight ", shape_str(w.shape()),
            " (stride ", p.stride_h, "x", p.stride_w, ", padding ", p.pad_h, "x", p.pad_w,
            ", dilation ", p.dilation_h, "x", p.dilation_w, ")");
  return {x.size(0), c_out, h_out, w_out};
}

// [N, C, H, W] `t` in the memory layout the call runs in: contiguous NCHW, or channels-last
// (a contiguous [N, H, W, C] seen through a permute). A copy only when `t` is laid out otherwise.
Tensor in_layout(const Tensor& t, bool channels_last) {
  if (!channels_last) return t.contiguous();
  if (t.is_channels_last()) return t;
  return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

// A new, uninitialised [N, C, H, W] tensor in the call's layout.
Tensor new_in_layout(const Shape& s, DType dtype, Device device, bool channels_last) {
  if (!channels_last) return Tensor::empty(s, dtype, device);
  return Tensor::empty({s[0], s[2], s[3], s[1]}, dtype, device).permute({0, 3, 1, 2});
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  if (auto cast = autocast_inputs("conv2d", {x, weight, bias})) {
    return conv2d((*cast)[0], (*cast)[1], (*cast)[2], p);
  }
  const Shape out_shape = conv_output_shape(x, weight, bias, p);
  // An input laid out channels-last (as a permuted token grid [B, H, W, C] is) runs so, and its
  // output comes out channels-last too, as in PyTorch: cuDNN's NHWC kernels then need no
  // transposing copy on either side. Anything else runs on a contiguous NCHW copy.
  const bool channels_last = x.is_channels_last() && !x.is_contiguous();
  const Tensor xc = in_layout(x.detach(), channels_last), wc = weight.detach().contiguous();
  Tensor y = new_in_layout(out_shape, x.dtype(), x.device(), channels_last);
  const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  SKA_KERNEL(x.device(), conv2d_forward)(xc, wc, bc, p, y);
  MacCounter::add(y.numel() * weight.size(1) * weight.size(2) * weight.size(3));
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // Saves the raw operands in the call's layout only where a gradient needs them.
  const Tensor saved_x = need_w ? xc : Tensor(), saved_w = need_x ? wc : Tensor();
  const Shape x_shape = x.shape(), w_shape = weight.shape();
  autograd::record_op("conv2d", {x, weight, bias}, {y}, [=](const TensorList& g) {
    const Tensor gy = in_layout(g[0], channels_last);
    Tensor gx, gw;
    // Uninitialised: the kernels write every element.
    if (need_x) {
      gx = new_in_layout(x_shape, gy.dtype(), gy.device(), channels_last);
      SKA_KERNEL(gy.device(), conv2d_backward_input)(gy, saved_w, p, gx);
    }
    if (need_w) {
      gw = Tensor::empty(w_shape, gy.dtype(), gy.device());
      SKA_KERNEL(gy.device(), conv2d_backward_weight)(gy, saved_x, p, gw);
    }
    return TensorList{gx, gw, need_b ? sum(gy, {0, 2, 3}) : Tensor()};
  });
  return y;
}

Tensor grid_conv_logits(const Tensor& q, const Tensor& w, const Tensor& bias, int64_t height,
                        int64_t width, const Tensor& out) {
  if (auto cast = autocast_inputs("conv_logits", {q, w, bias})) {
    return grid_conv_logits((*cast)[0], (*cast)[1], (*cast)[2], height, width, out);
  }
  detail::check_same_device_dtype("conv_logits", q, w);
  if (bias.defined()) detail::check_same_device_dtype("conv_logits", q, bias);
  // The kernels read q through its strides (a head split of a projection needs no copy) but for
  // the last dim's.
  const auto unit_columns = [](const Tensor& t) {
    return t.dim() == 0 || t.numel() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1;
  };
  const Tensor qd = unit_columns(q) ? q.detach() : q.detach().contiguous();
  const Tensor wc = w.detach().contiguous();
  const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  SKA_CHECK(q.dim() == 4 && w.dim() == 4, ShapeError,
            "conv_logits: q [B, h, H*W, d] and w [h, k*k, K, d], got ", shape_str(q.shape()),
            " and ", shape_str(w.shape()));
  SKA_CHECK(!out.defined() || !out.requires_grad(), AutogradError,
            "conv_logits: the logits' tensor ", out.str(),
            " requires grad; it must be a fresh tensor the logits are recorded into");
  const Tensor logits = out.defined() ? out
                                      : Tensor::empty({q.size(0), q.size(1), q.size(2), w.size(2)},
                                                      q.dtype(), q.device());
  SKA_KERNEL(q.device(), conv_logits_forward)(qd, wc, bc, height, width, logits);
  MacCounter::add(logits.numel() * w.size(1) * w.size(3));
  const bool need_q = q.requires_grad(), need_w = w.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  const Shape b_shape = bias.defined() ? bias.shape() : Shape{};
  autograd::record_op("conv_logits", {q, w, bias}, {logits}, [=](const TensorList& g) {
    const Tensor gl = unit_columns(g[0]) ? g[0] : g[0].contiguous();
    // Uninitialised: the kernels write every element.
    // q's gradient in the tensor q's node offers where it offers one (the heads of the
    // projection's gradient: no copy into it after), else a tensor of its own.
    Tensor gq;
    if (need_q) {
      gq = autograd::grad_destination(0, qd.shape(), gl.dtype(), gl.device(),
                                      conv_logits_grad_q_layout);
      if (!gq.defined()) gq = Tensor::empty(qd.shape(), gl.dtype(), gl.device());
    }
    const Tensor gw = need_w ? Tensor::empty(wc.shape(), gl.dtype(), gl.device()) : Tensor();
    const Tensor gb =
        need_b ? Tensor::empty({qd.size(1), wc.size(2)}, gl.dtype(), gl.device()) : Tensor();
    if (need_q || need_w || need_b) {
      SKA_KERNEL(gl.device(), conv_logits_backward)(gl, qd, wc, height, width, gq, gw, gb);
    }
    return TensorList{gq, gw, need_b ? gb.reshape(b_shape) : Tensor()};
  });
  return logits;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
              int64_t padding, int64_t dilation, int64_t groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = padding;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return conv2d(x, weight, bias, p);
}

}  // namespace ska
