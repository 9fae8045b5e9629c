// Basic layers.
#include "nn/layers.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "autograd/grad_mode.h"
#include "nn/summary.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace ska::nn {

namespace {

Tensor init_weight(const Shape& shape, int64_t fan_in, Init init) {
  return init == Init::kTruncNormal ? init_trunc_normal(shape, 0.02)
                                    : init_torch_default(shape, fan_in);
}
Tensor init_bias(int64_t n, int64_t fan_in, Init init) {
  return init == Init::kTruncNormal ? Tensor::zeros({n}) : init_torch_default({n}, fan_in);
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, Init init) {
  SKA_CHECK(in > 0 && out > 0, ValueError, "Linear(", in, ", ", out, "): sizes must be positive");
  weight = register_parameter("weight", init_weight({out, in}, in, init));
  if (with_bias) bias = register_parameter("bias", init_bias(out, in, init));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions opt) : options(opt) {
  SKA_CHECK(in > 0 && out > 0 && kernel > 0 && opt.groups > 0 && in % opt.groups == 0 &&
                out % opt.groups == 0,
            ValueError, "Conv2d(", in, ", ", out, ", k=", kernel, ", groups=", opt.groups,
            "): channels must be positive multiples of groups");
  const int64_t fan_in = in / opt.groups * kernel * kernel;
  weight = register_parameter("weight", init_weight({out, in / opt.groups, kernel, kernel}, fan_in,
                                                    opt.init));
  if (opt.bias) bias = register_parameter("bias", init_bias(out, fan_in, opt.init));
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool with_bias, bool channels_first)
    : eps(eps), channels_first(channels_first) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({dim}));
}

namespace {
std::atomic<bool> g_norm_autocast_outputs{true};
}  // namespace

bool norm_autocast_outputs_enabled() {
  return g_norm_autocast_outputs.load(std::memory_order_relaxed);
}
void set_norm_autocast_outputs(bool enabled) {
  g_norm_autocast_outputs.store(enabled, std::memory_order_relaxed);
}

namespace {
std::atomic<bool> g_fused_residual_norm{true};
std::atomic<bool> g_fused_gelu_dropout{true};
std::atomic<bool> g_fused_dropout_add{true};
}  // namespace

bool fused_dropout_add_enabled() { return g_fused_dropout_add.load(std::memory_order_relaxed); }
void set_fused_dropout_add(bool enabled) {
  g_fused_dropout_add.store(enabled, std::memory_order_relaxed);
}

Tensor residual_sum(const Tensor& x, const Tensor& branch, double p, const Tensor& x_scale,
                    const Tensor& branch_scale, const Tensor& branch_keep) {
  if (fused_dropout_add_enabled()) {
    return scaled_residual(x, x_scale, branch, branch_scale, branch_keep, p);
  }
  return scaled_residual(x, x_scale, dropout(branch, p, true), branch_scale, branch_keep);
}

bool fused_gelu_dropout_enabled() { return g_fused_gelu_dropout.load(std::memory_order_relaxed); }
void set_fused_gelu_dropout(bool enabled) {
  g_fused_gelu_dropout.store(enabled, std::memory_order_relaxed);
}

namespace {
std::atomic<bool> g_stacked_projections{false};
}  // namespace

bool stacked_projections_enabled() { return g_stacked_projections.load(std::memory_order_relaxed); }
void set_stacked_projections(bool enabled) {
  g_stacked_projections.store(enabled, std::memory_order_relaxed);
}

Tensor stacked_product(const Tensor& x, const std::vector<Linear*>& layers) {
  SKA_CHECK(!layers.empty(), ValueError, "stacked_linear: no layers");
  const bool biased = layers[0]->bias.defined();
  for (const Linear* layer : layers) {
    SKA_CHECK(layer->bias.defined() == biased, ValueError,
              "stacked_linear: the layers must all have a bias or none");
  }
  if (!stacked_projections_enabled() || layers.size() == 1 || SummaryRecorder::active()) {
    return Tensor();
  }
  TensorList weights, biases;
  for (const Linear* layer : layers) {
    weights.push_back(layer->weight);
    if (biased) biases.push_back(layer->bias);
  }
  return linear(x, cat(weights, 0), biased ? cat(biases, 0) : Tensor());
}

TensorList stacked_linear(const Tensor& x, const std::vector<Linear*>& layers) {
  const Tensor joined = stacked_product(x, layers);
  TensorList out;
  if (!joined.defined()) {
    for (Linear* layer : layers) out.push_back((*layer)(x));
    return out;
  }
  std::vector<int64_t> sizes;
  for (const Linear* layer : layers) sizes.push_back(layer->weight.size(0));
  return split(joined, sizes, -1);
}

bool fused_residual_norm_enabled() { return g_fused_residual_norm.load(std::memory_order_relaxed); }
void set_fused_residual_norm(bool enabled) {
  g_fused_residual_norm.store(enabled, std::memory_order_relaxed);
}

std::optional<DType> LayerNorm::output_dtype(const Tensor& x) const {
  const AutocastState autocast = autocast_state();
  // Autocast runs layer norm in f32 (f64 stays f64); its output is then cast by the matrix
  // products that read it.
  if (autocast_output && autocast.enabled && x.dtype() != DType::kF64 &&
      norm_autocast_outputs_enabled()) {
    return autocast.dtype;
  }
  return std::nullopt;
}

Tensor LayerNorm::forward(const Tensor& x) {
  if (channels_first) return layer_norm_channels_first(x, weight, bias, eps);
  return layer_norm(x, weight, bias, eps, output_dtype(x));
}

ResidualNorm LayerNorm::forward_residual(const Tensor& x, const Tensor& branch,
                                         const Tensor& x_scale, const Tensor& branch_scale,
                                         const Tensor& branch_keep, double branch_drop) {
  // The model summary records this norm as a module of its own, so it takes the unfused form.
  // So do sums with a scale of the stream or drop path's factors (MetaFormer's res_scale and
  // drop path): scaled_residual applies them, the branch's dropout and its scale in its one pass,
  // where the fused form would need a multiply of its own first (a kernel and a pass more, not
  // fewer). A scale of the branch alone (CaiT's LayerScale) goes into add_layer_norm's kernels.
  if (channels_first || !fused_residual_norm_enabled() || SummaryRecorder::active() ||
      x_scale.defined() || (branch_scale.defined() && branch_keep.defined())) {
    Tensor sum = residual_sum(x, branch, branch_drop, x_scale, branch_scale, branch_keep);
    Tensor normed = (*this)(sum);
    return {std::move(sum), std::move(normed)};
  }
  // The branch's closing dropout goes into add_layer_norm's kernels, unless drop path's factors
  // multiply the dropped branch first.
  if (!branch_keep.defined()) {
    return add_layer_norm(x, branch, weight, bias, eps, output_dtype(x), branch_drop, nullptr,
                          branch_scale);
  }
  const Tensor kept = apply_drop_path_factors(dropout(branch, branch_drop, true), branch_keep);
  return add_layer_norm(x, kept, weight, bias, eps, output_dtype(x));
}

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum)
    : eps(eps), momentum(momentum) {
  weight = register_parameter("weight", Tensor::ones({channels}));
  bias = register_parameter("bias", Tensor::zeros({channels}));
  running_mean = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var = register_buffer("running_var", Tensor::ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::kI64));
}

// num_batches_tracked is kept for state-dict compatibility with PyTorch; like PyTorch with a set
// momentum, nothing reads it, so it is not updated (that would be a device op per step).
Tensor BatchNorm2d::forward(const Tensor& x) {
  if (is_training() && sum_across_workers) return forward_synchronised(x);
  return batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_synchronised(const Tensor& x) {
  SKA_CHECK(x.dim() == 4, ShapeError, "BatchNorm2d: expected [N, C, H, W], got ",
            shape_str(x.shape()));
  const int64_t channels = x.size(1);
  // Per-channel sums of x - s and (x - s)^2 and the sample count, summed over the workers in one
  // collective; the sum is differentiable, so backward reduces the statistics' gradients too.
  // The shift s is the running mean (the same on every worker: each updates it from the same
  // sums), so that the variance is not the small difference of two large f32 sums where a
  // channel's mean is far from zero (CUDA's sums are f32; the difference cost three digits).
  const Shape per_channel = {1, channels, 1, 1};
  const Tensor xf = x.to(DType::kF32);
  const Tensor shift = running_mean.detach().to(DType::kF32).clone();  // before its update
  const Tensor d = sub(xf, shift.view(per_channel));
  const Tensor count = Tensor::full({1}, static_cast<double>(x.numel() / channels), DType::kF32,
                                    x.device());
  const Tensor stats =
      sum_across_workers(cat({sum(d, {0, 2, 3}), sum(mul(d, d), {0, 2, 3}), count}, 0));
  const Tensor n = stats.narrow(0, 2 * channels, 1);
  const Tensor shifted_mean = div(stats.narrow(0, 0, channels), n);
  const Tensor mean = add(shifted_mean, shift);
  const Tensor var =
      sub(div(stats.narrow(0, channels, channels), n), mul(shifted_mean, shifted_mean));
  {
    NoGradGuard no_grad;  // running statistics as PyTorch keeps them: the variance unbiased
    const Tensor unbiased = div(mul(var.detach(), n), sub(n, 1.0));
    running_mean.copy_(add(mul(running_mean, 1.0 - momentum), mul(mean.detach(), momentum)));
    running_var.copy_(add(mul(running_var, 1.0 - momentum), mul(unbiased, momentum)));
  }
  const Tensor scale = mul(rsqrt(add(var, eps)), weight).view(per_channel);
  const Tensor y = add(mul(sub(xf, mean.view(per_channel)), scale), bias.view(per_channel));
  return y.dtype() == x.dtype() ? y : y.to(x.dtype());  // in x's dtype, as batch_norm
}

Tensor Dropout::forward(const Tensor& x) {
  return taken_over ? x : ska::dropout(x, p, is_training());
}

Tensor DropPath::forward(const Tensor& x) { return drop_path(x, p, is_training()); }

const std::vector<std::string>& Activation::names() {
  static const std::vector<std::string> kNames = {"identity",   "relu",         "gelu",
                                                  "gelu_tanh",  "quick_gelu",   "squared_relu",
                                                  "silu",       "sigmoid",      "starrelu"};
  return kNames;
}

Activation::Activation(const std::string& name, double starrelu_scale, double starrelu_bias)
    : kind_(name) {
  const auto& known = names();
  SKA_CHECK(std::find(known.begin(), known.end(), name) != known.end(), ValueError,
            "unknown activation '", name, "'");
  if (name == "starrelu") {
    scale = register_parameter("scale", Tensor::full({1}, starrelu_scale));
    bias = register_parameter("bias", Tensor::full({1}, starrelu_bias));
  }
}

Tensor Activation::forward(const Tensor& x) {
  if (kind_ == "identity") return x;
  if (kind_ == "relu") return relu(x);
  if (kind_ == "gelu") return gelu(x);
  if (kind_ == "gelu_tanh") return gelu(x, true);
  if (kind_ == "quick_gelu") return quick_gelu(x);
  if (kind_ == "squared_relu") return squared_relu(x);
  if (kind_ == "silu") return silu(x);
  if (kind_ == "sigmoid") return sigmoid(x);
  const AutocastState autocast = autocast_state();
  const bool narrow = autocast_output && autocast.enabled && x.dtype() == autocast.dtype &&
                      norm_autocast_outputs_enabled();
  return star_relu(x, scale, bias, narrow ? std::optional<DType>(x.dtype()) : std::nullopt);
}

Scale::Scale(int64_t dim, double init_value) {
  scale = register_parameter("scale", Tensor::full({dim}, init_value));
}

Tensor Scale::forward(const Tensor& x) { return mul(x, scale); }

DroppedOperand dropped_operand(DropPath& drop_path, const Tensor& t) {
  if (SummaryRecorder::active()) return {drop_path(t), Tensor()};
  return {
      t, drop_path_factors(t.size(0), drop_path.p, drop_path.is_training(), t.dtype(), t.device())};
}

ScaledOperand scaled_operand(Module& module, const Tensor& t) {
  auto* s = dynamic_cast<Scale*>(&module);
  if (s == nullptr || SummaryRecorder::active()) return {module(t), Tensor()};
  return {t, s->scale};
}

Mlp::Mlp(int64_t dim, const MlpOptions& o) {
  const int64_t out = o.out > 0 ? o.out : dim;
  fc1_ = register_module("fc1", std::make_shared<Linear>(dim, o.hidden, o.bias, o.init));
  act_ = register_module("act", std::make_shared<Activation>(o.activation));
  drop_ = register_module("drop", std::make_shared<Dropout>(o.drop));  // so eval() reaches it
  fc2_ = register_module("fc2", std::make_shared<Linear>(o.hidden, out, o.bias, o.init));
  // fc2 alone reads the activation when no dropout rescales it in between.
  act_->autocast_output = o.drop == 0.0;
}

Tensor Mlp::forward(const Tensor& x) {
  const Tensor hidden = (*fc1_)(x);
  const std::string& act = act_->kind();
  Tensor activated;
  // The model summary records the activation and the dropout as modules of their own.
  if (fused_gelu_dropout_enabled() && (act == "gelu" || act == "gelu_tanh") && drop_->p > 0.0 &&
      drop_->is_training() && !SummaryRecorder::active()) {
    activated = gelu_dropout(hidden, drop_->p, true, act == "gelu_tanh");
  } else {
    activated = (*drop_)((*act_)(hidden));
  }
  const Tensor out = (*fc2_)(activated);
  return output_drop_taken_ ? out : (*drop_)(out);
}

double Mlp::take_output_dropout() {
  output_drop_taken_ = true;
  return drop_->p;
}

}  // namespace ska::nn
