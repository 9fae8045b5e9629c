// The attention core: logit builders, head split/merge, masks, attention_weights and attend.
#include "nn/mixers/attention_core.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "backend/conv_logits_geometry.h"
#include "backend/device_runtime.h"
#include "core/precision.h"
#include "nn/constants.h"
#include "nn/init.h"
#include "nn/mixers/attention_probe.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/mac_counter.h"
#include "ops/ops.h"

namespace ska::nn {
namespace {

std::atomic<bool> g_fused_attention{true};
std::atomic<ConvLogitsForm> g_conv_logits_form{ConvLogitsForm::kAuto};
// The widest head the CUDA attention kernels take (cuda/kernels/attention.cu).
constexpr int64_t kCudaFusedMaxHeadDim = 128;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The index of `name` in `names`, or a ValueError naming `what` and every known name.
size_t index_of(const std::string& name, const std::vector<std::string>& names,
                const std::string& what) {
  const auto it = std::find(names.begin(), names.end(), name);
  SKA_CHECK(it != names.end(), ValueError, "unknown ", what, " '", name, "' (known: ", join(names),
            ")");
  return static_cast<size_t>(it - names.begin());
}

}  // namespace

const std::vector<std::string>& attention_kind_names() {
  static const std::vector<std::string> kNames = {"mhsa", "ska", "cska"};  // enum order
  return kNames;
}

AttentionKind attention_kind(const std::string& name) {
  return static_cast<AttentionKind>(index_of(name, attention_kind_names(), "attention kind"));
}

const std::string& attention_kind_name(AttentionKind kind) {
  return attention_kind_names()[static_cast<size_t>(kind)];
}

const std::vector<std::string>& normalise_names() {
  static const std::vector<std::string> kNames = {"softmax", "gelu", "relu", "starrelu"};
  return kNames;
}

Normalise normalise_kind(const std::string& name) {
  return static_cast<Normalise>(index_of(name, normalise_names(), "attention normalisation"));
}

Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
  SKA_CHECK(width % heads == 0, ShapeError, "split_heads: width ", width, " is not a multiple of ",
            heads, " heads");
  return x.reshape({batch, tokens, heads, width / heads}).permute({0, 2, 1, 3});
}

namespace {

// The heads of columns [start, start + width) of x [B, N, W], [B, h, N, width / h]: a raw view
// (no history).
Tensor heads_view(const Tensor& x, int64_t start, int64_t width, int64_t heads) {
  const int64_t d = width / heads;
  return Tensor::make_view(x.storage(), {x.size(0), heads, x.size(1), d},
                           {x.stride(0), d * x.stride(2), x.stride(1), x.stride(2)},
                           x.offset() + start * x.stride(2), x.dtype());
}

}  // namespace

TensorList split_heads(const Tensor& x, const std::vector<int64_t>& widths, int64_t heads) {
  SKA_CHECK(x.dim() == 3 && heads > 0, ShapeError, "split_heads: expected [B, N, W] tokens and ",
            "a positive head count, got ", x.str(), " and ", heads, " heads");
  int64_t total = 0;
  for (const int64_t w : widths) {
    SKA_CHECK(w > 0 && w % heads == 0, ShapeError, "split_heads: piece width ", w,
              " is not a positive multiple of ", heads, " heads");
    total += w;
  }
  SKA_CHECK(total == x.size(2), ShapeError, "split_heads: piece widths add up to ", total,
            ", but the tokens have ", x.size(2), " channels");
  TensorList pieces;
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const int64_t w : widths) {
    pieces.push_back(heads_view(x, start, w, heads));
    starts.push_back(start);
    start += w;
  }
  // An assembly: a piece's producer may write its gradient in place, in the projection's layout.
  autograd::record_assembly(
      "split_heads", x, pieces,
      [starts, widths, heads](const Tensor& z, size_t i) {
        return heads_view(z, starts[i], widths[i], heads);
      },
      [shape = x.shape(), strides = x.strides()](DType dtype, Device device) {
        return detail::empty_in_stride_order(shape, strides, dtype, device,
                                             /*last_innermost=*/true);
      });
  return pieces;
}

Tensor merge_heads(const Tensor& x) {
  const int64_t batch = x.size(0), heads = x.size(1), tokens = x.size(2), width = x.size(3);
  return x.permute({0, 2, 1, 3}).reshape({batch, tokens, heads * width});
}

Tensor dot_logits(const Tensor& q, const Tensor& k) { return matmul(q, k.transpose(-2, -1)); }

Tensor static_key_logits(const Tensor& q, const Tensor& keys) {
  SKA_CHECK(
      q.dim() == 4 && keys.dim() == 3 && keys.size(0) == q.size(1) && keys.size(2) == q.size(3),
      ShapeError, "static_key_logits: queries [B, h, N, d] and keys [h, K, d], got ", q.str(),
      " and ", keys.str());
  return dot_logits(q, keys);
}

namespace {

// conv_logits through the convolution `conv_of` (image -> output): q laid out as an image
// [B, h*d, H, W], the output [B, h * K, H, W] (channel = head * K + key) read as logits.
template <typename ConvOf>
Tensor logits_by_conv(const Tensor& q, int64_t height, int64_t width, ConvOf&& conv_of) {
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2);
  const Tensor image = q.transpose(-1, -2).reshape({batch, heads * q.size(3), height, width});
  const Tensor out = conv_of(image);
  return out.reshape({batch, heads, out.size(1) / heads, tokens}).transpose(2, 3);
}

// conv_logits as one matrix product per head: every query's k x k neighbourhood of its head's
// channels (grid_neighbourhoods, im2col with taps before channels), [h, B*H*W, k*k*d], times the
// head's filters reordered to [h, K, k*k*d]. The heads lead, so the weight gradient is one
// product per head over the whole batch (no per-sample products summed after). A bias rides in
// the product as one more column (grid_neighbourhood_rows: a one after the k*k*d values, zeros
// to a multiple of 8 columns; the filters get the bias there): no pass over the [B, h, N, K]
// logits to add it (CSKAFormer-S18's stage 2 at batch 128: 1.26 GB a layer, read and written)
// and none over their gradient to sum it.
Tensor logits_by_gemm(const Tensor& q, const Tensor& weight, const Tensor& bias, int64_t height,
                      int64_t width) {
  const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), d = q.size(3);
  const int64_t k = weight.size(2), keys = weight.size(0) / heads, taps = k * k * d;
  const Tensor grid = q.transpose(0, 1).reshape({heads, batch, height, width, d});
  Tensor filters = weight.reshape({heads, keys, d, k * k})
                       .transpose(-1, -2)
                       .contiguous()
                       .reshape({heads, keys, taps});
  Tensor cols;
  if (bias.defined()) {
    const int64_t row = (taps + 1 + 7) / 8 * 8;
    cols = grid_neighbourhood_rows(grid, k, row).reshape({heads, batch * tokens, row});
    filters = pad(cat({filters, bias.reshape({heads, keys, 1}).to(filters.dtype())}, -1),
                  {0, row - taps - 1});
  } else {
    cols = grid_neighbourhoods(grid, k).reshape({heads, batch * tokens, taps});
  }
  Tensor logits;
  {
    // The convolution's MACs, as the conv form counts them: not the bias column nor the padding.
    const MacCountingPause pause;
    logits = matmul(cols, filters.transpose(-1, -2));  // [h, B*H*W, K]
  }
  MacCounter::add(heads * batch * tokens * keys * taps);
  return logits.reshape({heads, batch, tokens, keys}).transpose(0, 1);
}

// Whether logits_by_gemm computes what `conv` does: a square k x k "same" convolution (k odd,
// padding k/2, stride and dilation 1) with one group per head.
bool gemm_form_applies(const Conv2d& conv, int64_t heads) {
  const Conv2dOptions& o = conv.options;
  const int64_t k = conv.weight.size(2);
  return conv.weight.size(3) == k && k % 2 == 1 && o.padding == k / 2 && o.stride == 1 &&
         o.dilation == 1 && o.groups == heads;
}

// conv_logits by the grid_conv_logits op (ops/conv.h): the filters [h*K, d, k, k] reordered to
// [h, k*k, K, d] (a copy of the filters, not of the activations), the bias to [h, K].
Tensor logits_by_direct(const Tensor& q, const Tensor& weight, const Tensor& bias, int64_t height,
                        int64_t width, const Tensor& out = Tensor()) {
  const int64_t heads = q.size(1), d = q.size(3), k = weight.size(2);
  const int64_t keys = weight.size(0) / heads;
  const Tensor w = weight.reshape({heads, keys, d, k * k}).permute({0, 3, 1, 2});
  return grid_conv_logits(q, w, bias.defined() ? bias.reshape({heads, keys}) : Tensor(), height,
                          width, out);
}

// Whether the direct form runs this call (with gemm_form_applies): on the CPU always (the
// reference), on CUDA where its kernels take the device (compute capability 8.0 or newer), the
// dtype the call runs in (autocast's for f32 q) and the head dim and grid
// (conv_logits_direct_fits).
bool direct_form_applies(const Tensor& q, const Conv2d& conv, int64_t width) {
  if (!q.device().is_cuda()) return true;
  if (cuda_compute_capability(q.device().index) < 80) return false;
  const AutocastState autocast = autocast_state();
  const DType dtype = autocast.enabled && q.dtype() == DType::kF32 ? autocast.dtype : q.dtype();
  return (dtype == DType::kBF16 || dtype == DType::kF16) &&
         conv_logits_direct_fits(q.size(3), width, conv.weight.size(2));
}

// The forms ConvLogitsForm::kAuto chose, by what the timing saw, and their descriptions.
using AutoKey = std::vector<int64_t>;
struct AutoChoices {
  std::mutex mutex;
  std::map<AutoKey, ConvLogitsForm> forms;
  std::vector<std::string> lines;
};
AutoChoices& auto_choices() {
  static AutoChoices choices;
  return choices;
}

std::string fixed_ms(double ms) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(ms < 10.0 ? 3 : 1);
  out << ms << " ms";
  return out.str();
}

// kAuto's form for this call (see set_conv_logits_form).
ConvLogitsForm auto_form(const Tensor& q, const Conv2d& conv, int64_t height, int64_t width) {
  if (!q.device().is_cuda() || !cudnn_benchmark()) return ConvLogitsForm::kConv;
  const bool backward = GradMode::is_enabled();
  const AutocastState autocast = autocast_state();
  AutoKey key = {q.device().index, static_cast<int64_t>(q.dtype()), autocast.enabled,
                 static_cast<int64_t>(autocast.dtype), backward};
  key.insert(key.end(), q.shape().begin(), q.shape().end());
  key.insert(key.end(), conv.weight.shape().begin(), conv.weight.shape().end());
  AutoChoices& choices = auto_choices();
  {
    std::lock_guard<std::mutex> lock(choices.mutex);
    const auto it = choices.forms.find(key);
    if (it != choices.forms.end()) return it->second;
  }
  if (capturing(q.device())) return ConvLogitsForm::kConv;  // timing would synchronise
  const ConvLogitsTiming t = time_conv_logits(q, conv, height, width);
  ConvLogitsForm form = t.gemm_ms < t.conv_ms ? ConvLogitsForm::kGemm : ConvLogitsForm::kConv;
  if (t.direct_ms < std::min(t.conv_ms, t.gemm_ms)) form = ConvLogitsForm::kDirect;
  std::ostringstream line;
  line << "conv logits " << q.str() << " -> " << conv.weight.size(0) / q.size(1) << " keys on "
       << q.device() << (backward ? " (forward + backward)" : " (forward)") << ": conv "
       << fixed_ms(t.conv_ms) << ", gemm " << fixed_ms(t.gemm_ms);
  if (std::isfinite(t.direct_ms)) line << ", direct " << fixed_ms(t.direct_ms);
  line << ": "
       << (form == ConvLogitsForm::kDirect ? "direct"
           : form == ConvLogitsForm::kGemm ? "gemm"
                                           : "conv");
  std::lock_guard<std::mutex> lock(choices.mutex);
  choices.forms.emplace(key, form);
  choices.lines.push_back(line.str());
  return form;
}

}  // namespace

Tensor conv_logits(const Tensor& q, Conv2d& conv, int64_t height, int64_t width,
                   const Tensor& place) {
  const int64_t heads = q.size(1), tokens = q.size(2);
  SKA_CHECK(q.dim() == 4 && tokens == height * width, ShapeError, "conv_logits: queries ", q.str(),
            " for a ", height, "x", width, " grid");
  ConvLogitsForm form = gemm_form_applies(conv, heads) ? conv_logits_form() : ConvLogitsForm::kConv;
  if (form == ConvLogitsForm::kAuto) form = auto_form(q, conv, height, width);
  if (form == ConvLogitsForm::kDirect) {
    if (direct_form_applies(q, conv, width)) {
      return logits_by_direct(q, conv.weight, conv.bias, height, width, place);
    }
    form = ConvLogitsForm::kConv;
  }
  if (form == ConvLogitsForm::kGemm) {
    return logits_by_gemm(q, conv.weight, conv.bias, height, width);
  }
  // Through the module, so that `summary` sees the layer.
  return logits_by_conv(q, height, width, [&](const Tensor& image) { return conv(image); });
}

ConvLogitsTiming time_conv_logits(const Tensor& q, const Conv2d& conv, int64_t height,
                                  int64_t width, int reps) {
  SKA_CHECK(gemm_form_applies(conv, q.size(1)), ValueError,
            "time_conv_logits: the convolution has no matrix-product form");
  const bool backward = GradMode::is_enabled();
  enum Form { kByConv, kByGemm, kByDirect };
  // One call of a form on detached operands, so that neither the caller's graph nor the
  // parameters' gradients see it.
  const auto run = [&](Form form) {
    Tensor x = q.detach(), w = conv.weight.detach(), b;
    if (conv.bias.defined()) b = conv.bias.detach();
    if (backward) {
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      if (b.defined()) b.set_requires_grad(true);
    }
    const Conv2dOptions& o = conv.options;
    const Tensor y = form == kByGemm ? logits_by_gemm(x, w, b, height, width)
                     : form == kByDirect
                         ? logits_by_direct(x, w, b, height, width)
                         : logits_by_conv(x, height, width, [&](const Tensor& image) {
                             return conv2d(image, w, b, o.stride, o.padding, o.dilation, o.groups);
                           });
    if (backward) y.backward(Tensor::ones(y.shape(), y.dtype(), y.device()));
  };
  const Device device = q.device();
  const MacCountingPause not_counted;  // the timing calls are no part of a model's MAC count
  const double never = std::numeric_limits<double>::infinity();
  ConvLogitsTiming t{never, never, never};
  std::vector<Form> forms = {kByConv, kByGemm};
  if (direct_form_applies(q, conv, width)) forms.push_back(kByDirect);
  for (int i = -1; i < reps; ++i) {  // i = -1: a warm-up call of each (cuDNN's own timing)
    for (const Form form : forms) {
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      run(form);
      synchronize(device);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      double& best = form == kByGemm ? t.gemm_ms : form == kByDirect ? t.direct_ms : t.conv_ms;
      if (i >= 0) best = std::min(best, ms);
    }
  }
  return t;
}

std::vector<std::string> conv_logits_auto_choices() {
  AutoChoices& choices = auto_choices();
  std::lock_guard<std::mutex> lock(choices.mutex);
  return choices.lines;
}

ConvLogitsForm conv_logits_form() { return g_conv_logits_form.load(std::memory_order_relaxed); }

void set_conv_logits_form(ConvLogitsForm form) {
  g_conv_logits_form.store(form, std::memory_order_relaxed);
}

Tensor init_static_keys(const Shape& shape) { return init_normal(shape, 0.0, 1.0); }

std::shared_ptr<Conv2d> make_conv_logits(int64_t width, int64_t heads, int64_t keys, Init init) {
  Conv2dOptions conv;
  conv.padding = 1;
  conv.groups = heads;
  conv.init = init;
  return std::make_shared<Conv2d>(width, heads * keys, 3, conv);
}

double lowest_finite(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return -DBL_MAX;
    case DType::kBF16:
      return -3.3895313892515355e38;  // largest finite bf16
    case DType::kF16:
      return -65504.0;
    default:
      return -FLT_MAX;
  }
}

Tensor diagonal_mask(int64_t rows, int64_t cols, Device device) {
  const std::string key = "diagonal_mask " + std::to_string(rows) + "x" + std::to_string(cols);
  return device_constant(key, device, [&] {
    std::vector<uint8_t> mask(static_cast<size_t>(rows * cols), 0);
    for (int64_t i = 0; i < std::min(rows, cols); ++i) mask[static_cast<size_t>(i * cols + i)] = 1;
    return Tensor::from_vector(mask, {rows, cols});
  });
}

Tensor mix_heads(const Tensor& x, const Tensor& mix) {
  const int64_t heads = x.size(-3), plane = x.size(-2) * x.size(-1);
  const Tensor mixed = matmul(mix.transpose(0, 1), x.reshape({-1, heads, plane}));
  return mixed.reshape(x.shape());
}

namespace {

std::atomic<bool> g_fused_talking_heads{false};

// Whether the spec's attention dropout draws (in training, p > 0): the fused ops have none.
bool attention_dropout_active(const AttentionSpec& spec) {
  return spec.dropout != nullptr && spec.dropout->p > 0.0 && spec.dropout->is_training();
}

// Whether attention_weights takes talking_heads_softmax for this call.
bool talking_heads_fuse(const Tensor& logits, const AttentionSpec& spec) {
  return fused_talking_heads_enabled() && fused_attention_enabled() &&
         spec.normalise == Normalise::kSoftmax && spec.heads_pre.defined() &&
         spec.heads_post.defined() && !spec.exclude_diagonal && !spec.temperature.defined() &&
         !spec.bias.defined() && !attention_dropout_active(spec) &&
         spec.heads_pre.size(0) == logits.size(-3) && talking_heads_softmax_fits(logits);
}

}  // namespace

bool fused_talking_heads_enabled() { return g_fused_talking_heads.load(std::memory_order_relaxed); }
void set_fused_talking_heads(bool enabled) {
  g_fused_talking_heads.store(enabled, std::memory_order_relaxed);
}

Tensor attention_weights(const Tensor& logits, const AttentionSpec& spec) {
  if (talking_heads_fuse(logits, spec)) {
    const Tensor weights =
        talking_heads_softmax(logits, spec.scale, spec.heads_pre, spec.heads_post);
    AttentionRecorder::record(weights, spec);
    return weights;
  }
  const bool softmax_only = spec.normalise == Normalise::kSoftmax && !spec.exclude_diagonal &&
                            !spec.heads_pre.defined() && !spec.temperature.defined();
  const Tensor mask = spec.exclude_diagonal
                          ? diagonal_mask(logits.size(-2), logits.size(-1), logits.device())
                          : Tensor();
  Tensor weights;
  if (softmax_only) {
    weights = softmax(logits, spec.scale, spec.bias);  // scale and bias fused into the softmax
  } else {
    Tensor x = spec.temperature.defined() ? mul(logits, exp(spec.temperature))
               : spec.scale != 1.0        ? mul(logits, spec.scale)
                                          : logits;
    if (spec.bias.defined()) x = add(x, spec.bias);
    if (spec.heads_pre.defined()) x = mix_heads(x, spec.heads_pre);
    switch (spec.normalise) {
      case Normalise::kSoftmax:
        weights = softmax(mask.defined() ? masked_fill(x, mask, lowest_finite(x.dtype())) : x);
        break;
      case Normalise::kGelu:
        weights = gelu(x);
        break;
      case Normalise::kRelu:
        weights = relu(x);
        break;
      case Normalise::kStarRelu:
        weights = star_relu(x, spec.starrelu_scale, spec.starrelu_bias);
        break;
    }
    // Without normalisation a masked pair must contribute nothing, whatever act(-inf) would be.
    if (spec.normalise != Normalise::kSoftmax && mask.defined())
      weights = masked_fill(weights, mask, 0.0);
  }
  if (spec.dropout) weights = (*spec.dropout)(weights);
  if (spec.heads_post.defined()) weights = mix_heads(weights, spec.heads_post);
  AttentionRecorder::record(weights, spec);
  return weights;
}

namespace {

// Whether the fused op may replace weights-then-matmul for this spec (both attend and attend_qk):
// softmax, no talking heads, no attention dropout in training, no AttentionRecorder, fused
// attention enabled, and on CUDA value head dims up to the kernels' limit. A diagonal mask
// needs two keys or more: with one, the masked softmax gives its excluded key the weight (the
// logit is the lowest finite value), the kernels' -inf NaN.
bool fusable_spec(const AttentionSpec& spec, const Tensor& v, int64_t qk_dim) {
  const bool dropping = attention_dropout_active(spec);
  return fused_attention_enabled() && spec.normalise == Normalise::kSoftmax &&
         !spec.heads_pre.defined() && !spec.heads_post.defined() && !dropping &&
         !AttentionRecorder::active() && v.dim() >= 3 && v.dim() <= 6 &&
         (!spec.exclude_diagonal || v.size(-2) > 1) &&
         (!v.device().is_cuda() || std::max(qk_dim, v.size(-1)) <= kCudaFusedMaxHeadDim);
}

// The fused ops' mask for a spec.
AttentionMask fused_mask(const AttentionSpec& spec) {
  return spec.exclude_diagonal ? AttentionMask::kDiagonal : AttentionMask::kNone;
}

}  // namespace

bool attend_fuses(const Tensor& logits, const Tensor& v, const AttentionSpec& spec) {
  // An additive bias would be scaled with the logits in the fused op: unfused.
  return fusable_spec(spec, v, 0) && !spec.bias.defined() && logits.dim() == v.dim();
}

Tensor attend(const Tensor& logits, const Tensor& v, const AttentionSpec& spec) {
  // Fused: softmax(factor * logits) v with the weights never stored, the scale or temperature as
  // the device-side factor.
  if (attend_fuses(logits, v, spec)) {
    Tensor factor;
    if (spec.temperature.defined()) {
      factor = exp(spec.temperature);
    } else if (spec.scale != 1.0) {
      // f32 (f64 for f64 logits, so that gradient checks stay exact), kept on the device.
      const DType dt = logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      std::ostringstream key;
      key.precision(17);
      key << "attention scale " << spec.scale << " " << dtype_name(dt);
      factor =
          device_constant(key.str(), v.device(), [&] { return Tensor::full({1}, spec.scale, dt); });
    }
    return softmax_attend(logits, v, factor, fused_mask(spec));
  }
  return matmul(attention_weights(logits, spec), v);
}

bool fused_attention_enabled() { return g_fused_attention.load(std::memory_order_relaxed); }

void set_fused_attention(bool enabled) {
  g_fused_attention.store(enabled, std::memory_order_relaxed);
}

namespace {

// What the fused ops take from a spec: the scale, or a learnable temperature as the device-side
// factor (read by the kernels), the additive bias and the mask.
struct FusedArgs {
  double scale;
  Tensor factor, bias;
  AttentionMask mask;
};
FusedArgs fused_args(const AttentionSpec& spec) {
  return {spec.temperature.defined() ? 1.0 : spec.scale,
          spec.temperature.defined() ? exp(spec.temperature) : Tensor(), spec.bias,
          fused_mask(spec)};
}

}  // namespace

Tensor attend_qk(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec) {
  if (!fusable_spec(spec, v, q.size(-1)) || q.dim() < 3 || q.dim() > 6) {
    return attend(dot_logits(q, k), v, spec);
  }
  const FusedArgs a = fused_args(spec);
  return scaled_dot_attention(q, k, v, a.scale, a.bias, a.factor, Tensor(), a.mask);
}

Tensor attend_qkv(const Tensor& qkv, int64_t heads, const AttentionSpec& spec) {
  SKA_CHECK(qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0, ShapeError,
            "attend_qkv: qkv ", qkv.str(), " must be [B, N, 3 * heads * head_dim] for ", heads,
            " heads");
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), head_dim = qkv.size(2) / (3 * heads);
  const Tensor heads_view = qkv.view({batch, tokens, 3, heads, head_dim});
  // v's shape and device, without recording a view that the fused op would not use.
  const Tensor v_like = heads_view.detach().select(2, 2).permute({0, 2, 1, 3});
  if (!fusable_spec(spec, v_like, head_dim)) {
    const TensorList parts = unbind(heads_view.permute({2, 0, 3, 1, 4}), 0);  // [3, B, h, N, d]
    return attend_qk(parts[0], parts[1], parts[2], spec);
  }
  const FusedArgs a = fused_args(spec);
  return qkv_attention(qkv, heads, a.scale, a.bias, a.factor, a.mask);
}

}  // namespace ska::nn
