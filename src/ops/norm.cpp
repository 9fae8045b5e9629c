// Layer norm (channels-last and channels-first) and batch norm, with their gradients.
// Saved statistics are f32, or f64 for f64 inputs so that gradient checks stay exact.
#include "ops/norm.h"

#include <cstdint>
#include <numeric>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/pointwise.h"
#include "ops/random.h"

namespace ska {

namespace {

DType stat_dtype(DType x_dtype) { return x_dtype == DType::kF64 ? DType::kF64 : DType::kF32; }

// A per-channel parameter: undefined, or [channels] of x's dtype and device.
void check_channel_param(const char* op, const char* what, const Tensor& x, const Tensor& p,
                         int64_t channels) {
  if (!p.defined()) return;
  detail::check_same_device_dtype(op, x, p);
  SKA_CHECK(p.dim() == 1 && p.shape()[0] == channels, ShapeError, op, ": ", what, " must be [",
            channels, "] for input ", shape_str(x.shape()), ", got ", shape_str(p.shape()));
}

// A raw contiguous copy (or view) for a kernel input; undefined stays undefined.
Tensor kernel_input(const Tensor& t) { return t.defined() ? t.contiguous().detach() : Tensor(); }

// An output of `like`'s shape for a wanted gradient, else undefined.
Tensor grad_buffer(bool wanted, const Tensor& like) {
  return wanted ? Tensor::empty(like.shape(), like.dtype(), like.device()) : Tensor();
}

// Running statistics are updated in place, so they must be [C] contiguous floating tensors.
void check_running_stat(const char* what, const Tensor& x, const Tensor& stat, int64_t channels) {
  if (!stat.defined()) return;
  SKA_CHECK(stat.device() == x.device(), DeviceError, "batch_norm: ", what, " on ", stat.device(),
            ", input on ", x.device());
  detail::check_floating("batch_norm", stat);
  SKA_CHECK(stat.dim() == 1 && stat.shape()[0] == channels && stat.is_contiguous(), ShapeError,
            "batch_norm: ", what, " must be a contiguous [", channels, "] tensor for input ",
            shape_str(x.shape()), ", got ", shape_str(stat.shape()));
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  std::optional<DType> out_dtype) {
  if (auto cast = autocast_inputs("layer_norm", {x, weight, bias})) {
    return layer_norm((*cast)[0], (*cast)[1], (*cast)[2], eps, out_dtype);
  }
  detail::check_floating("layer_norm", x);
  SKA_CHECK(x.dim() >= 1, ShapeError, "layer_norm: expected at least 1 dim, got a 0-d tensor");
  const int64_t channels = x.shape().back();
  check_channel_param("layer_norm", "weight", x, weight, channels);
  check_channel_param("layer_norm", "bias", x, bias, channels);
  const DType y_dtype = out_dtype.value_or(x.dtype());
  SKA_CHECK(y_dtype == x.dtype() ||
                (x.dtype() == DType::kF32 && (y_dtype == DType::kBF16 || y_dtype == DType::kF16)),
            DTypeError, "layer_norm: output dtype ", dtype_name(y_dtype), " for a ",
            dtype_name(x.dtype()), " input; expected the input's dtype, or bf16/f16 for f32");
  const Tensor xc = kernel_input(x), w = kernel_input(weight), b = kernel_input(bias);
  const int64_t rows = channels == 0 ? 0 : x.numel() / channels;
  const Tensor mean = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  const Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor y = Tensor::empty(x.shape(), y_dtype, x.device());
  SKA_KERNEL(x.device(), layer_norm_forward)(xc, w, b, eps, y, mean, rstd);

  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  autograd::record_op("layer_norm", {x, weight, bias}, {y}, [=](const TensorList& g) {
    Tensor gx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    Tensor gw = grad_buffer(need_w, w), gb = grad_buffer(need_b, b);
    // The output gradient comes in y's dtype; the kernel reads it as it is.
    const Tensor gy = g[0].dtype() == y_dtype ? g[0].contiguous() : g[0].to(y_dtype).contiguous();
    SKA_KERNEL(xc.device(), layer_norm_backward)(gy, xc, w, mean, rstd, gx, gw, gb);
    return TensorList{gx, gw, gb};
  });
  return y;
}

namespace {

// Whether add_layer_norm's one kernel computes what add followed by layer_norm computes (else it
// runs those two ops, which also give the errors for bad input).
bool is_16bit(DType d) { return d == DType::kBF16 || d == DType::kF16; }

// Under autocast, a 16-bit sum with f32 parameters: layer_norm normalises autocast's f32 copy of
// it, and add_layer_norm the sum as it reads it, the same values.
bool autocast_16bit_stream(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return autocast_state().enabled && is_16bit(x.dtype()) &&
         (!weight.defined() || weight.dtype() == DType::kF32) &&
         (!bias.defined() || bias.dtype() == DType::kF32);
}

bool residual_norm_fusable(const Tensor& x, const Tensor& y, const Tensor& weight,
                           const Tensor& bias, DType out_dtype, const Tensor& y_scale) {
  if (!x.defined() || !y.defined() || !x.is_floating() || x.dim() == 0 || x.shape() != y.shape() ||
      y.device() != x.device()) {
    return false;
  }
  const bool narrow_stream = autocast_16bit_stream(x, weight, bias);
  // The branch's scale as scaled_residual's kernels take it: [C] of the sum's dtype (x's).
  if (y_scale.defined() &&
      (narrow_stream || y_scale.dtype() != x.dtype() || y_scale.device() != x.device() ||
       y_scale.dim() != 1 || y_scale.size(0) != x.shape().back() ||
       (x.dtype() == DType::kF64 && x.device().is_cuda()))) {
    return false;
  }
  const DType param_dtype = narrow_stream ? DType::kF32 : x.dtype();
  const auto param_ok = [&](const Tensor& p) {
    return !p.defined() || (p.dtype() == param_dtype && p.device() == x.device() && p.dim() == 1 &&
                            p.shape()[0] == x.shape().back());
  };
  if (!param_ok(weight) || !param_ok(bias)) return false;
  if (narrow_stream) {
    return y.dtype() == x.dtype() && (out_dtype == x.dtype() || out_dtype == DType::kF32);
  }
  const bool wide_x = x.dtype() == DType::kF32 || x.dtype() == DType::kF64;
  if (autocast_state().enabled && !wide_x) return false;  // autocast would cast the sum to f32
  const bool out_ok = out_dtype == x.dtype() || (x.dtype() == DType::kF32 && is_16bit(out_dtype));
  // A 16-bit branch of an f32 stream: of the output's dtype, or with an f32 output.
  const bool low_y = x.dtype() == DType::kF32 && is_16bit(y.dtype()) &&
                     (out_dtype == y.dtype() || out_dtype == DType::kF32);
  return out_ok && (y.dtype() == x.dtype() || low_y);
}

}  // namespace

ResidualNorm add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                            const Tensor& bias, double eps, std::optional<DType> out_dtype,
                            double y_drop, Generator* gen, const Tensor& y_scale) {
  SKA_CHECK(y_drop >= 0.0 && y_drop < 1.0, ValueError,
            "add_layer_norm: dropout probability must be in [0, 1), got ", y_drop);
  // The unfused norm's output: out_dtype, else its input's dtype (f32 for autocast's copy).
  const DType normed_dtype =
      out_dtype.value_or(autocast_16bit_stream(x, weight, bias) ? DType::kF32 : x.dtype());
  const bool fusable = residual_norm_fusable(x, y, weight, bias, normed_dtype, y_scale);
  // The branch's dropout goes into the kernels where the mask's bytes stay within rows.
  const bool drop_inside =
      fusable && y_drop > 0.0 && x.dtype() != DType::kF64 && x.shape().back() % 8 == 0;
  if (!fusable) {
    Tensor sum = y_scale.defined() ? scaled_residual(x, Tensor(), y, y_scale, Tensor(), y_drop, gen)
                                   : add(x, dropout(y, y_drop, true, gen));
    Tensor normed = layer_norm(sum, weight, bias, eps, out_dtype);
    return {std::move(sum), std::move(normed)};
  }
  if (y_drop > 0.0 && !drop_inside) {
    return add_layer_norm(x, dropout(y, y_drop, true, gen), weight, bias, eps, out_dtype, 0.0,
                          nullptr, y_scale);
  }
  const Tensor xc = kernel_input(x), yc = kernel_input(y);
  const Tensor w = kernel_input(weight), b = kernel_input(bias), ys = kernel_input(y_scale);
  const int64_t channels = x.shape().back();
  const int64_t rows = channels == 0 ? 0 : x.numel() / channels;
  const Tensor mean = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  const Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor sum = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor normed = Tensor::empty(x.shape(), normed_dtype, x.device());
  // The dropout's draws as the dropout op takes them (the same generator offsets).
  const DropoutDraw drop = drop_inside ? dropout_draw(y, y_drop, gen) : DropoutDraw();
  SKA_KERNEL(x.device(), add_layer_norm_forward)
  (xc, yc, drop, ys, w, b, eps, sum, normed, mean, rstd);

  const bool need_x = x.requires_grad(), need_y = y.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  const bool need_ys = y_scale.defined() && y_scale.requires_grad();
  const DType y_dtype = y.dtype();
  const Tensor saved_sum = sum.detach();
  // The branch stays alive for the backward pass only where its scale's gradient reads it.
  const Tensor saved_y = need_ys ? yc : Tensor();
  autograd::record_op(
      "add_layer_norm", {x, y, weight, bias, y_scale}, {sum, normed}, [=](const TensorList& g) {
        // g[0] reaches the sum along the residual path, g[1] through the norm (zeros for an
        // output nobody used).
        const Tensor grad_normed = g[1].to(normed_dtype).contiguous();
        Tensor gx = grad_buffer(need_x || need_y || need_ys, saved_sum);
        const Tensor grad_sum = gx.defined() ? g[0].to(saved_sum.dtype()).contiguous() : Tensor();
        // y's gradient, written by the same kernel where it is not grad_x itself: a y of a 16-bit
        // dtype under an f32 x, a dropped or a scaled branch.
        Tensor gy_branch = need_y && (y_dtype != saved_sum.dtype() || drop.active() || ys.defined())
                               ? Tensor::empty(saved_sum.shape(), y_dtype, saved_sum.device())
                               : Tensor();
        Tensor gw = grad_buffer(need_w, w), gb = grad_buffer(need_b, b);
        // The mask and the scale only shape y's and the scale's gradients: without those,
        // nothing to pass them to.
        const DropoutDraw branch_drop = need_y || need_ys ? drop : DropoutDraw();
        // The scale's gradient: the rows' sum of the gradient reaching the sum times the (dropped)
        // branch, as scaled_residual sums it.
        Tensor gys = need_ys ? Tensor::empty({channels}, ys.dtype(), ys.device()) : Tensor();
        SKA_KERNEL(saved_sum.device(), add_layer_norm_backward)
        (grad_normed, grad_sum, saved_sum, w, mean, rstd, branch_drop, saved_y,
         need_y || need_ys ? ys : Tensor(), gx, gy_branch, gw, gb, gys);
        Tensor gy = need_y ? (gy_branch.defined() ? gy_branch : gx) : Tensor();
        return TensorList{need_x ? gx : Tensor(), gy, gw, gb,
                          need_ys ? gys.view(y_scale.shape()) : Tensor()};
      });
  return {std::move(sum), std::move(normed)};
}

Tensor layer_norm_channels_first(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 double eps) {
  SKA_CHECK(x.dim() >= 2, ShapeError,
            "layer_norm_channels_first: expected x [N, C, ...], got shape ", shape_str(x.shape()));
  // [N, C, S...] -> [N, S..., C], normalise the last dim, and back: differentiable views.
  const int64_t nd = x.dim();
  std::vector<int64_t> to_last(static_cast<size_t>(nd)), to_first(static_cast<size_t>(nd));
  std::iota(to_last.begin(), to_last.end(), 0);
  to_last.erase(to_last.begin() + 1);
  to_last.push_back(1);
  for (int64_t d = 0; d < nd; ++d) to_first[static_cast<size_t>(to_last[d])] = d;
  return layer_norm(x.permute(to_last), weight, bias, eps).permute(to_first).contiguous();
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  // No autocast policy: as in torch.autocast, batch norm runs in its input's dtype, a bf16/f16
  // input with f32 parameters and statistics (computed in f32, y rounded once).
  detail::check_floating("batch_norm", x);
  SKA_CHECK(x.dim() >= 2, ShapeError, "batch_norm: expected x [N, C, ...], got shape ",
            shape_str(x.shape()));
  const int64_t channels = x.shape()[1];
  const Tensor& any_param = weight.defined() ? weight : bias;
  const DType param_dtype =
      is_16bit(x.dtype()) && any_param.defined() && any_param.dtype() == DType::kF32 ? DType::kF32
                                                                                     : x.dtype();
  for (const auto& [what, p] : {std::pair<const char*, const Tensor&>{"weight", weight},
                                std::pair<const char*, const Tensor&>{"bias", bias}}) {
    if (!p.defined()) continue;
    SKA_CHECK(p.device() == x.device(), DeviceError, "batch_norm: ", what, " on ", p.device(),
              ", input on ", x.device());
    SKA_CHECK(p.dtype() == param_dtype, DTypeError, "batch_norm: ", what, " is ",
              dtype_name(p.dtype()), " for a ", dtype_name(x.dtype()), " input",
              any_param.dtype() != p.dtype()
                  ? std::string(" and a ") + dtype_name(any_param.dtype()) + " weight"
                  : std::string(),
              "; expected ",
              is_16bit(x.dtype()) ? "the input's dtype or f32, weight and bias alike"
                                  : "the input's dtype");
    SKA_CHECK(p.dim() == 1 && p.shape()[0] == channels, ShapeError, "batch_norm: ", what,
              " must be [", channels, "] for input ", shape_str(x.shape()), ", got ",
              shape_str(p.shape()));
  }
  check_running_stat("running_mean", x, running_mean, channels);
  check_running_stat("running_var", x, running_var, channels);
  SKA_CHECK(training || (running_mean.defined() && running_var.defined()), ValueError,
            "batch_norm: eval mode needs running_mean and running_var (input ",
            shape_str(x.shape()), ")");
  SKA_CHECK(!training || channels == 0 || x.numel() / channels > 1, ValueError,
            "batch_norm: expected more than 1 value per channel when training, got input shape ",
            shape_str(x.shape()));
  const Tensor xc = kernel_input(x), w = kernel_input(weight), b = kernel_input(bias);
  const Tensor save_mean = Tensor::empty({channels}, stat_dtype(x.dtype()), x.device());
  const Tensor save_rstd = Tensor::empty({channels}, stat_dtype(x.dtype()), x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  SKA_KERNEL(x.device(), batch_norm_forward)(xc, w, b, running_mean, running_var, training,
                                             momentum, eps, y, save_mean, save_rstd);

  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  autograd::record_op("batch_norm", {x, weight, bias}, {y}, [=](const TensorList& g) {
    Tensor gx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    Tensor gw = grad_buffer(need_w, w), gb = grad_buffer(need_b, b);
    // The output gradient in y's (x's) dtype, as the kernels read it.
    const Tensor gy =
        g[0].dtype() == xc.dtype() ? g[0].contiguous() : g[0].to(xc.dtype()).contiguous();
    SKA_KERNEL(xc.device(), batch_norm_backward)
    (gy, xc, w, save_mean, save_rstd, training, gx, gw, gb);
    return TensorList{gx, gw, gb};
  });
  return y;
}

}  // namespace ska
