// benchmark_ops: times the GEMMs, convolutions, fused attention, softmax, layer norms and
// elementwise ops of ViT-S and CAFormer-S18 (forward, no grad; the *_fwd_bwd cases forward and
// backward) and prints GFLOP/s or GB/s; scripts/benchmark_ops.py is its twin.
//
// Timing: each case runs kWarmupRuns times; the warm-up time sets the number of repetitions
// (kTargetSeconds / time, clamped to [kMinReps, kMaxReps]); every repetition is one call between
// two device synchronisations, and the median is reported. The PyTorch script does exactly the
// same.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "backend/device_runtime.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "ops/ops.h"

namespace {

using ska::Device;
using ska::DType;
using ska::Shape;
using ska::Tensor;

constexpr int kWarmupRuns = 3;
constexpr double kTargetSeconds = 0.3;
constexpr int kMinReps = 5;
constexpr int kMaxReps = 100;

// Batch sizes per device: CPU cases stay under about a second on two cores.
struct Batches {
  int64_t vit;       // ViT-S on CIFAR: 65 tokens
  int64_t caformer;  // CAFormer-S18 at 224
};
constexpr Batches kCpuBatches{32, 8};
constexpr Batches kCudaBatches{128, 64};

// Records autograd history for a scope inside main's NoGradGuard (the _fwd_bwd cases).
class GradEnabled {
 public:
  GradEnabled() : prev_(ska::GradMode::is_enabled()) { ska::GradMode::set_enabled(true); }
  ~GradEnabled() { ska::GradMode::set_enabled(prev_); }
  GradEnabled(const GradEnabled&) = delete;
  GradEnabled& operator=(const GradEnabled&) = delete;

 private:
  bool prev_;
};

struct BenchCase {
  std::string name;
  std::string shape;  // the operands, for the reader and for matching the PyTorch cases
  double work;        // floating-point operations, or bytes moved
  bool counts_flops;
  std::function<Tensor()> run;
};

struct Options {
  std::vector<Device> devices;
  DType dtype = DType::kF32;
  bool json = false;
  std::vector<std::string> cases;  // --cases: run only cases whose name contains one of these
};

bool selected(const std::string& name, const std::vector<std::string>& cases) {
  if (cases.empty()) return true;
  for (const std::string& part : cases) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

// Cases that read and write whole tensors report bytes moved (reads + writes).
double bytes_of(const Tensor& t, int tensor_passes) {
  return static_cast<double>(t.numel()) * t.element_size() * tensor_passes;
}

class CaseBuilder {
 public:
  CaseBuilder(Device device, DType dtype) : device_(device), dtype_(dtype), gen_(1234) {}

  Tensor random(const Shape& shape) {
    return ska::randn(shape, DType::kF32, Device::cpu(), &gen_).to(device_, dtype_);
  }

  // y = x @ w^T (nn.Linear without bias), x [m, k], w [n, k].
  BenchCase linear(const std::string& name, int64_t m, int64_t k, int64_t n) {
    Tensor x = random({m, k}), w = random({n, k});
    return {name, shape_text({m, k}) + "*" + shape_text({n, k}) + "^T", 2.0 * m * n * k, true,
            [x, w] { return ska::linear(x, w); }};
  }

  // Batched a @ b^T, a [batch, m, k], b [batch, n, k] (q @ k^T of attention).
  BenchCase batched_abt(const std::string& name, int64_t batch, int64_t m, int64_t k, int64_t n) {
    Tensor a = random({batch, m, k}), b = random({batch, n, k});
    return {name, shape_text({batch, m, k}) + "@" + shape_text({batch, n, k}) + "^T",
            2.0 * batch * m * n * k, true, [a, b] { return ska::matmul(a, b.transpose(-2, -1)); }};
  }

  // `channels_last`: x (and in training the output gradient) laid out as a contiguous
  // [N, H, W, C], as a permuted token grid is; the output comes out so.
  BenchCase conv(const std::string& name, const Shape& x_shape, int64_t c_out, int64_t kernel,
                 int64_t stride, int64_t padding, int64_t groups, bool bias, bool train = false,
                 bool channels_last = false) {
    Tensor x = random(x_shape), w = random({c_out, x_shape[1] / groups, kernel, kernel});
    if (channels_last) x = to_channels_last(x);
    Tensor b = bias ? random({c_out}) : Tensor();
    const int64_t h_out = (x_shape[2] + 2 * padding - kernel) / stride + 1;
    const int64_t w_out = (x_shape[3] + 2 * padding - kernel) / stride + 1;
    const double flops =
        2.0 * x_shape[0] * c_out * h_out * w_out * (x_shape[1] / groups) * kernel * kernel;
    const std::string shape = shape_text(x_shape) + " k" + std::to_string(kernel) + "s" +
                              std::to_string(stride) + "g" + std::to_string(groups) + "->" +
                              std::to_string(c_out);
    BenchCase c{name, shape, flops, true,
                [=] { return ska::conv2d(x, w, b, stride, padding, 1, groups); }};
    return train ? with_backward(c, bias ? ska::TensorList{x, w, b} : ska::TensorList{x, w},
                                 channels_last)
                 : c;
  }

  // `c` with the CUDA backward-input pass of its convolutions forced to `mode` while it runs
  // (set_cuda_conv_input_grad): cuDNN's backward-data kernels or the forward form on the rotated
  // filter, to compare with the timed choice (the plain case).
  static BenchCase with_input_grad(BenchCase c, ska::ConvInputGrad mode) {
    c.run = [run = c.run, mode] {
      const ska::ConvInputGrad previous = ska::set_cuda_conv_input_grad(mode);
      Tensor y = run();
      ska::set_cuda_conv_input_grad(previous);
      return y;
    };
    return c;
  }

  // `c` with CUDA's channels-last depthwise convolutions on this project's kernels while it runs
  // (set_cuda_depthwise_conv(kDirect)), to compare with cuDNN's (the plain case).
  static BenchCase with_direct_depthwise(BenchCase c) {
    c.name += "_direct";
    c.run = [run = c.run] {
      const ska::DepthwiseConv previous = ska::set_cuda_depthwise_conv(ska::DepthwiseConv::kDirect);
      Tensor y = run();
      ska::set_cuda_depthwise_conv(previous);
      return y;
    };
    return c;
  }

  // CSKA's logits as the mixer computes them (nn::conv_logits, forward and backward): queries
  // [B, h, H*W, d] as split_heads leaves them (a strided view) through the grouped 3x3 conv of
  // `keys` outputs per head, in `form` (the convolution on an NCHW copy, or im2col + GEMM).
  BenchCase conv_logits(const std::string& name, int64_t batch, int64_t heads, int64_t head_dim,
                        int64_t grid, int64_t keys, ska::nn::ConvLogitsForm form) {
    const Tensor tokens = random({batch, grid * grid, heads * head_dim});
    auto conv = ska::nn::make_conv_logits(heads * head_dim, heads, keys);
    conv->to(device_);
    conv->to(dtype_);
    const double flops = 2.0 * batch * heads * keys * grid * grid * head_dim * 9;
    const std::string shape = shape_text({batch, heads, grid * grid, head_dim}) + " k3g" +
                              std::to_string(heads) + "->" + std::to_string(heads * keys);
    BenchCase c{name, shape, flops, true, [=] {
                  const ska::nn::ConvLogitsFormGuard guard(form);
                  return ska::nn::conv_logits(ska::nn::split_heads(tokens, heads), *conv, grid,
                                              grid);
                }};
    return with_backward(c, {tokens, conv->weight, conv->bias});
  }

  // Self-attention from one packed projection as the ViT and MetaFormer blocks run it
  // (qkv_attention): qkv [batch, tokens, 3 * heads * head_dim], so q, k and v are strided views.
  // `lsa`: ViT-S's locality self-attention, a learnable temperature (a one-element f32 factor on
  // the device, read there) and the diagonal left out; otherwise the fixed scale head_dim^-0.5.
  // Work: the two products, 4 batch heads tokens^2 head_dim flops (the diagonal counted).
  BenchCase attention(const std::string& name, int64_t batch, int64_t tokens, int64_t heads,
                      int64_t head_dim, bool lsa, bool train = false) {
    Tensor qkv = random({batch, tokens, 3 * heads * head_dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    Tensor factor = lsa ? Tensor::full({1}, scale).to(device_) : Tensor();
    const ska::AttentionMask mask = lsa ? ska::AttentionMask::kDiagonal : ska::AttentionMask::kNone;
    const double flops = 4.0 * batch * heads * tokens * tokens * head_dim;
    BenchCase c{
        name, shape_text({batch, heads, tokens, head_dim}) + (lsa ? " lsa" : ""), flops, true,
        [=] { return ska::qkv_attention(qkv, heads, lsa ? 1.0 : scale, Tensor(), factor, mask); }};
    if (!train) return c;
    return with_backward(c, lsa ? ska::TensorList{qkv, factor} : ska::TensorList{qkv});
  }

  // The fused attention op on separate q [..., Nq, d], k and v [..., Nk, d] and an additive bias
  // (broadcast over the leading dims it lacks; a learnable table's gradient in training):
  // Swin's window attention and CaiT's class attention. Work: 4 (leading) Nq Nk d flops.
  BenchCase attention_qkv(const std::string& name, const Shape& lead, int64_t nq, int64_t nk,
                          int64_t d, const Shape& bias_shape, bool train = false) {
    const auto with = [&](int64_t rows) {
      Shape s = lead;
      s.push_back(rows);
      s.push_back(d);
      return s;
    };
    Tensor q = random(with(nq)), k = random(with(nk)), v = random(with(nk));
    Tensor bias = bias_shape.empty() ? Tensor() : random(bias_shape);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const double flops = 4.0 * static_cast<double>(ska::shape_numel(lead)) * nq * nk * d;
    BenchCase c{name,
                shape_text(with(nq)) + "@" + std::to_string(nk) +
                    (bias.defined() ? " bias " + shape_text(bias_shape) : ""),
                flops, true, [=] { return ska::scaled_dot_attention(q, k, v, scale, bias); }};
    if (!train) return c;
    return with_backward(
        c, bias.defined() ? ska::TensorList{q, k, v, bias} : ska::TensorList{q, k, v});
  }

  // `c` with a process-wide CUDA kernel switch (`set`, which returns the value it replaces) at
  // `value` while it runs, `suffix` added to its name. Ours only, on CUDA (an unnamed case,
  // skipped, elsewhere).
  BenchCase with_switch(BenchCase c, const char* suffix, bool (*set)(bool), bool value) const {
    if (!device_.is_cuda()) return {};
    c.name += suffix;
    c.run = [run = c.run, set, value] {
      const bool previous = set(value);
      Tensor y = run();
      set(previous);
      return y;
    };
    return c;
  }

  // `c` with the mma.sync attention's one-block forward and backward (for up to 80 tokens), to
  // compare with the tiled forward and split backward (the plain case).
  BenchCase with_one_block_attention(BenchCase c) const {
    return with_switch(
        with_switch(std::move(c), "_one_block", ska::set_cuda_attention_one_block_forward, true),
        "", ska::set_cuda_attention_one_block_backward, true);
  }

  // `c` with the tensor-core kernels' tiles and fragments by plain loads (train.attention_loads:
  // sync: the attention's tiles loaded and stored, and the attention's and the conv logits'
  // fragments by 32- and 16-bit shared loads instead of ldmatrix).
  BenchCase with_sync_loads(BenchCase c) const {
    return with_switch(std::move(c), "_sync", ska::set_cuda_attention_async_loads, false);
  }

  // `c` with the mma.sync attention's one-pass backward (each weight computed once for up to 80
  // tokens).
  BenchCase with_one_pass_attention(BenchCase c) const {
    return with_switch(std::move(c), "_one_pass", ska::set_cuda_attention_one_pass_backward, true);
  }

  static Tensor to_channels_last(const Tensor& t) {
    return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  }

  BenchCase softmax(const std::string& name, const Shape& shape) {
    Tensor x = random(shape);
    return {name, shape_text(shape), bytes_of(x, 2), false, [x] { return ska::softmax(x); }};
  }

  BenchCase layer_norm(const std::string& name, int64_t rows, int64_t width, bool train = false) {
    Tensor x = random({rows, width}), w = random({width}), b = random({width});
    BenchCase c{name, shape_text({rows, width}), bytes_of(x, 2), false,
                [=] { return ska::layer_norm(x, w, b, 1e-5); }};
    return train ? with_backward(c, {x, w, b}) : c;
  }

  // A bias gradient: [rows, width] summed over its rows (the leading dim).
  BenchCase column_sum(const std::string& name, int64_t rows, int64_t width) {
    Tensor x = random({rows, width});
    return {name, shape_text({rows, width}), bytes_of(x, 1), false,
            [x] { return ska::sum(x, {0}); }};
  }

  BenchCase add(const std::string& name, int64_t n) {
    Tensor a = random({n}), b = random({n});
    return {name, shape_text({n}), bytes_of(a, 3), false, [a, b] { return ska::add(a, b); }};
  }

  // MetaFormer's StarReLU, s * relu(x)^2 + b, with one-element parameters of x's dtype.
  BenchCase star_relu(const std::string& name, int64_t n, bool train = false) {
    Tensor x = random({n}), s = random({1}), b = random({1});
    BenchCase c{name, shape_text({n}), bytes_of(x, 2), false,
                [x, s, b] { return ska::star_relu(x, s, b); }};
    return train ? with_backward(c, {x, s, b}) : c;
  }

  BenchCase gelu(const std::string& name, int64_t n, bool train = false) {
    Tensor x = random({n});
    BenchCase c{name, shape_text({n}), bytes_of(x, 2), false, [x] { return ska::gelu(x); }};
    return train ? with_backward(c, {x}) : c;
  }

  // "<case>_fwd_bwd": the forward of `c` and the backward from a fixed output gradient into every
  // operand, whose gradients are cleared first. Work: GEMM-like ops count the forward's flops
  // three times (output, input and weight gradients); bandwidth-bound ops add the backward's
  // passes (grad_y and x read, grad_x written).
  // With `channels_last` the output gradient is laid out channels-last.
  BenchCase with_backward(BenchCase c, const ska::TensorList& leaves, bool channels_last = false) {
    Tensor grad_y = random(c.run().shape());
    if (channels_last) grad_y = to_channels_last(grad_y);
    for (Tensor leaf : leaves) leaf.set_requires_grad();
    c.name += "_fwd_bwd";
    c.work = c.counts_flops ? 3.0 * c.work : c.work + 1.5 * c.work;
    c.run = [forward = c.run, leaves, grad_y] {
      GradEnabled enabled;
      for (const Tensor& leaf : leaves) leaf.zero_grad();
      Tensor y = forward();
      y.backward(grad_y);
      return y;
    };
    return c;
  }

 private:
  Device device_;
  DType dtype_;
  ska::Generator gen_;
};

// The case list; scripts/benchmark_ops.py builds the same names and shapes.
std::vector<std::function<BenchCase(CaseBuilder&)>> case_list(const Batches& bs) {
  const int64_t vit_rows = bs.vit * 65, s1_rows = bs.caformer * 3136;
  return {
      [=](CaseBuilder& c) { return c.linear("vit_qkv_linear", vit_rows, 512, 1536); },
      [=](CaseBuilder& c) { return c.linear("vit_proj_linear", vit_rows, 512, 512); },
      [=](CaseBuilder& c) { return c.batched_abt("vit_attn_qk", bs.vit * 8, 65, 64, 65); },
      [=](CaseBuilder& c) { return c.linear("caf_s1_pw_linear", s1_rows, 64, 256); },
      [=](CaseBuilder& c) { return c.linear("caf_s3_qkv_linear", bs.caformer * 196, 320, 960); },
      [=](CaseBuilder& c) {
        return c.batched_abt("caf_s3_attn_qk", bs.caformer * 10, 196, 32, 196);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_stem_conv7x7s4", {bs.caformer, 3, 224, 224}, 64, 7, 4, 2, 1, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_dwconv7x7", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_down_conv3x3s2", {bs.caformer, 64, 56, 56}, 128, 3, 2, 1, 1, true);
      },
      // The same on channels-last operands, as CAFormer's token grids give them.
      [=](CaseBuilder& c) {
        return c.conv("caf_dwconv7x7_cl", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false,
                      false, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_down_conv3x3s2_cl", {bs.caformer, 64, 56, 56}, 128, 3, 2, 1, 1, true,
                      false, true);
      },
      // The depthwise one on this project's CUDA kernels (cuDNN's above). Ours only.
      [=](CaseBuilder& c) {
        return CaseBuilder::with_direct_depthwise(c.conv(
            "caf_dwconv7x7_cl", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false, false, true));
      },
      // CSKA-ViT-S's logit convolution (8 heads of 64 over the 8x8 grid, 65 keys each; grouped
      // 3x3), NCHW: the cska mixer's queries are a strided view, copied to NCHW for it.
      [=](CaseBuilder& c) {
        return c.conv("cska_logits_conv3x3g8", {bs.vit, 512, 8, 8}, 520, 3, 1, 1, 8, true);
      },
      [=](CaseBuilder& c) {
        return c.softmax("vit_softmax", {bs.vit * 8, 65, 65});
      },
      // The fused attention op: ViT-S's LSA (8 heads of 64, 65 tokens), the same as plain
      // multi-head attention, and CAFormer-S18's attention stages (3: 10 heads of 32 over 196
      // tokens; 4: 16 heads over 49). The PyTorch twin adds rows with each SDPA backend forced
      // (flash, efficient, cudnn, math), so cuDNN's fused attention is measured beside ours.
      [=](CaseBuilder& c) { return c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true); },
      [=](CaseBuilder& c) {
        return c.with_one_block_attention(
            c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true));
      },
      [=](CaseBuilder& c) { return c.attention("vit_mhsa_attention", bs.vit, 65, 8, 64, false); },
      [=](CaseBuilder& c) {
        return c.attention("caf_s3_attention", bs.caformer, 196, 10, 32, false);
      },
      [=](CaseBuilder& c) {
        return c.attention("caf_s4_attention", bs.caformer, 49, 16, 32, false);
      },
      // Swin-T's first stage on CIFAR (3 heads of 32, 16 windows of 4x4 over the 16x16 grid, the
      // relative position bias broadcast over images and windows) and CaiT-S's class attention
      // (the class token over itself and 64 patches, 8 heads of 64).
      [=](CaseBuilder& c) {
        return c.attention_qkv("swin_window_attention", {bs.vit, 3, 16}, 16, 16, 32,
                               {3, 1, 16, 16});
      },
      [=](CaseBuilder& c) {
        return c.attention_qkv("cait_class_attention", {bs.vit, 8}, 1, 65, 64, {});
      },
      [=](CaseBuilder& c) { return c.layer_norm("caf_s1_layer_norm", s1_rows, 64); },
      [=](CaseBuilder& c) { return c.layer_norm("vit_layer_norm", vit_rows, 512); },
      [=](CaseBuilder& c) { return c.column_sum("vit_bias_grad", vit_rows, 512); },
      [=](CaseBuilder& c) { return c.add("add_4M", 4 << 20); },
      [=](CaseBuilder& c) { return c.gelu("gelu_4M", 4 << 20); },
      [=](CaseBuilder& c) { return c.star_relu("caf_s1_star_relu", s1_rows * 256); },
      // Forward and backward (training) of the ops whose backward has its own kernels.
      [=](CaseBuilder& c) {
        return c.conv("caf_stem_conv7x7s4", {bs.caformer, 3, 224, 224}, 64, 7, 4, 2, 1, true, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_dwconv7x7", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_down_conv3x3s2", {bs.caformer, 64, 56, 56}, 128, 3, 2, 1, 1, true, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_dwconv7x7_cl", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false,
                      true, true);
      },
      [=](CaseBuilder& c) {
        return c.conv("caf_down_conv3x3s2_cl", {bs.caformer, 64, 56, 56}, 128, 3, 2, 1, 1, true,
                      true, true);
      },
      [=](CaseBuilder& c) {
        return CaseBuilder::with_direct_depthwise(c.conv(
            "caf_dwconv7x7_cl", {bs.caformer, 128, 56, 56}, 128, 7, 1, 3, 128, false, true, true));
      },
      [=](CaseBuilder& c) {
        return c.conv("cska_logits_conv3x3g8", {bs.vit, 512, 8, 8}, 520, 3, 1, 1, 8, true, true);
      },
      // CSKAFormer-S18's logit convolution (stage 2: 8 heads of 16 over the 28x28 grid, 784 keys
      // each), NCHW as the mixer runs it: its backward-input pass was 54% of the training step
      // (H200, 2026-11-26). The timed choice, then each form forced.
      [=](CaseBuilder& c) {
        return c.conv("cskaf_logits_conv3x3g8", {bs.caformer, 128, 28, 28}, 6272, 3, 1, 1, 8,
                      true, true);
      },
      [=](CaseBuilder& c) {
        return CaseBuilder::with_input_grad(
            c.conv("cskaf_logits_bwddata", {bs.caformer, 128, 28, 28}, 6272, 3, 1, 1, 8, true,
                   true),
            ska::ConvInputGrad::kBackwardData);
      },
      [=](CaseBuilder& c) {
        return CaseBuilder::with_input_grad(
            c.conv("cskaf_logits_rotated", {bs.caformer, 128, 28, 28}, 6272, 3, 1, 1, 8, true,
                   true),
            ska::ConvInputGrad::kRotatedForward);
      },
      // The same two logit convolutions as the mixers run them (queries in, logits out), through
      // the convolution, as im2col + GEMM and by this project's kernels (train.conv_logits).
      // Ours only.
      [=](CaseBuilder& c) {
        return c.conv_logits("cska_conv_logits_conv", bs.vit, 8, 64, 8, 65,
                             ska::nn::ConvLogitsForm::kConv);
      },
      [=](CaseBuilder& c) {
        return c.conv_logits("cska_conv_logits_gemm", bs.vit, 8, 64, 8, 65,
                             ska::nn::ConvLogitsForm::kGemm);
      },
      [=](CaseBuilder& c) {
        return c.conv_logits("cskaf_conv_logits_conv", bs.caformer, 8, 16, 28, 784,
                             ska::nn::ConvLogitsForm::kConv);
      },
      [=](CaseBuilder& c) {
        return c.conv_logits("cskaf_conv_logits_gemm", bs.caformer, 8, 16, 28, 784,
                             ska::nn::ConvLogitsForm::kGemm);
      },
      [=](CaseBuilder& c) {
        return c.conv_logits("cska_conv_logits_direct", bs.vit, 8, 64, 8, 65,
                             ska::nn::ConvLogitsForm::kDirect);
      },
      [=](CaseBuilder& c) {
        return c.conv_logits("cskaf_conv_logits_direct", bs.caformer, 8, 16, 28, 784,
                             ska::nn::ConvLogitsForm::kDirect);
      },
      // The direct form with its fragments by 32- and 16-bit loads, as before ldmatrix.
      [=](CaseBuilder& c) {
        return c.with_sync_loads(c.conv_logits("cska_conv_logits_direct", bs.vit, 8, 64, 8, 65,
                                               ska::nn::ConvLogitsForm::kDirect));
      },
      [=](CaseBuilder& c) {
        return c.with_sync_loads(c.conv_logits("cskaf_conv_logits_direct", bs.caformer, 8, 16, 28,
                                               784, ska::nn::ConvLogitsForm::kDirect));
      },
      // The direct form's filter gradient by blocks of a filter row (train.conv_logits_grad_w:
      // per_row).
      [=](CaseBuilder& c) {
        return c.with_switch(c.conv_logits("cska_conv_logits_direct", bs.vit, 8, 64, 8, 65,
                                           ska::nn::ConvLogitsForm::kDirect),
                             "_per_row", ska::set_cuda_conv_logits_grad_w_rows, true);
      },
      [=](CaseBuilder& c) {
        return c.with_switch(c.conv_logits("cskaf_conv_logits_direct", bs.caformer, 8, 16, 28, 784,
                                           ska::nn::ConvLogitsForm::kDirect),
                             "_per_row", ska::set_cuda_conv_logits_grad_w_rows, true);
      },
      [=](CaseBuilder& c) {
        return c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true, true);
      },
      [=](CaseBuilder& c) {
        return c.with_one_block_attention(
            c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true, true));
      },
      [=](CaseBuilder& c) {
        return c.with_one_pass_attention(
            c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true, true));
      },
      // The one-block forward and backward as persistent kernels (train.attention_schedule:
      // persistent).
      [=](CaseBuilder& c) {
        return c.with_switch(c.attention("vit_lsa_attention", bs.vit, 65, 8, 64, true, true),
                             "_persistent", ska::set_cuda_attention_persistent, true);
      },
      [=](CaseBuilder& c) {
        return c.attention("vit_mhsa_attention", bs.vit, 65, 8, 64, false, true);
      },
      [=](CaseBuilder& c) {
        return c.attention("caf_s3_attention", bs.caformer, 196, 10, 32, false, true);
      },
      [=](CaseBuilder& c) {
        return c.attention("caf_s4_attention", bs.caformer, 49, 16, 32, false, true);
      },
      [=](CaseBuilder& c) {
        return c.attention_qkv("swin_window_attention", {bs.vit, 3, 16}, 16, 16, 32, {3, 1, 16, 16},
                               true);
      },
      [=](CaseBuilder& c) {
        return c.attention_qkv("cait_class_attention", {bs.vit, 8}, 1, 65, 64, {}, true);
      },
      [=](CaseBuilder& c) { return c.layer_norm("caf_s1_layer_norm", s1_rows, 64, true); },
      [=](CaseBuilder& c) { return c.layer_norm("vit_layer_norm", vit_rows, 512, true); },
      [=](CaseBuilder& c) { return c.gelu("gelu_4M", 4 << 20, true); },
      [=](CaseBuilder& c) { return c.star_relu("caf_s1_star_relu", s1_rows * 256, true); },
  };
}

double seconds_of_one_call(const BenchCase& c, Device device) {
  ska::synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  c.run();
  ska::synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Timing {
  double median_s;
  int reps;
};

Timing time_case(const BenchCase& c, Device device) {
  double warmup = 0.0;
  for (int i = 0; i < kWarmupRuns; ++i) warmup = seconds_of_one_call(c, device);
  const int reps =
      std::clamp(static_cast<int>(kTargetSeconds / std::max(warmup, 1e-9)), kMinReps, kMaxReps);
  std::vector<double> times(reps);
  for (double& t : times) t = seconds_of_one_call(c, device);
  std::sort(times.begin(), times.end());
  const double median = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
  return {median, reps};
}

void print_result(const BenchCase& c, Device device, DType dtype, const Timing& t, bool json) {
  const double rate = c.work / t.median_s / 1e9;
  const char* unit = c.counts_flops ? "GFLOP/s" : "GB/s";
  if (json) {
    std::printf(
        "{\"case\": \"%s\", \"shape\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
        "\"median_ms\": %.4f, \"rate\": %.3f, \"unit\": \"%s\", \"reps\": %d, "
        "\"threads\": %d}\n",
        c.name.c_str(), c.shape.c_str(), device.str().c_str(), ska::dtype_name(dtype),
        t.median_s * 1e3, rate, unit, t.reps, omp_get_max_threads());
  } else {
    std::printf("%-20s %-4s %-5s %-34s %10.3f ms %10.2f %s\n", c.name.c_str(), device.str().c_str(),
                ska::dtype_name(dtype), c.shape.c_str(), t.median_s * 1e3, rate, unit);
  }
  std::fflush(stdout);
}

// A case the build cannot run (e.g. a dtype a kernel lacks) is reported and skipped.
void print_failure(const std::string& name, Device device, const std::exception& e, bool json) {
  if (json) {
    std::printf(
        "{\"case\": \"%s\", \"device\": \"%s\", \"error\": \"see stderr\", "
        "\"threads\": %d}\n",
        name.c_str(), device.str().c_str(), omp_get_max_threads());
  }
  std::fprintf(stderr, "%s on %s failed: %s\n", name.c_str(), device.str().c_str(), e.what());
}

void run_device(Device device, const Options& options) {
  CaseBuilder builder(device, options.dtype);
  const Batches batches = device.is_cpu() ? kCpuBatches : kCudaBatches;
  for (const auto& make_case : case_list(batches)) {
    std::string name = "?";
    try {
      const BenchCase c = make_case(builder);
      if (c.name.empty()) continue;  // a case this device does not run
      name = c.name;
      if (!selected(c.name, options.cases)) continue;
      print_result(c, device, options.dtype, time_case(c, device), options.json);
    } catch (const std::exception& e) {
      print_failure(name, device, e, options.json);
    }
  }
}

void print_usage() {
  std::fprintf(
      stderr,
      "usage: benchmark_ops [--device cpu|cuda|all] [--dtype f32|bf16] [--cases A,B] [--json]\n"
      "  Times ViT-S / CAFormer-S18 op shapes; prints median time and GFLOP/s or GB/s.\n"
      "  --cases: only the cases whose name contains one of the comma-separated parts.\n");
}

// Returns false (after printing why) when the command line is not understood.
bool parse_options(int argc, char** argv, Options* options) {
  std::string device = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--json") {
      options->json = true;
    } else if (arg == "--cases" && has_value) {
      std::stringstream parts(argv[++i]);
      for (std::string part; std::getline(parts, part, ',');) {
        if (!part.empty()) options->cases.push_back(part);
      }
    } else if (arg == "--device" && has_value) {
      device = argv[++i];
    } else if (arg == "--dtype" && has_value) {
      const std::string dtype = argv[++i];
      if (dtype != "f32" && dtype != "bf16") {
        std::fprintf(stderr, "benchmark_ops: --dtype must be f32 or bf16, got '%s'\n",
                     dtype.c_str());
        return false;
      }
      options->dtype = ska::dtype_from_name(dtype);
    } else {
      std::fprintf(stderr, "benchmark_ops: unknown or incomplete argument '%s'\n", arg.c_str());
      return false;
    }
  }
  if (device != "cpu" && device != "cuda" && device != "all") {
    std::fprintf(stderr, "benchmark_ops: --device must be cpu, cuda or all, got '%s'\n",
                 device.c_str());
    return false;
  }
  if (device != "cuda") options->devices.push_back(Device::cpu());
  if (device == "cuda" && !ska::cuda_is_available()) {
    std::fprintf(stderr, "benchmark_ops: --device cuda, but no CUDA device is available\n");
    return false;
  }
  if (device != "cpu" && ska::cuda_is_available()) options->devices.push_back(Device::cuda());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse_options(argc, argv, &options)) {
    print_usage();
    return 2;
  }
  try {
    ska::NoGradGuard no_grad;
    if (!options.json) {
      std::printf("# benchmark_ops: %d OpenMP threads, dtype %s, median of timed calls\n",
                  omp_get_max_threads(), ska::dtype_name(options.dtype));
      std::fflush(stdout);
    }
    for (Device device : options.devices) run_device(device, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
