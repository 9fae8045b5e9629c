// The basic layers every model is built from: Linear, Conv2d, LayerNorm, BatchNorm2d, Dropout,
// DropPath, activations (StarReLU with learnable scale/bias), per-channel Scale, and Mlp.
// Parameter names follow PyTorch's (weight, bias, running_mean, ...) so state dicts map 1:1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nn/init.h"
#include "nn/module.h"
#include "ops/norm.h"

namespace ska::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Init init = Init::kTorchDefault);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  Tensor weight, bias;  // [out, in], [out] or undefined
};

struct Conv2dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
  Init init = Init::kTorchDefault;
};

// x [N, C, H, W].
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  Tensor weight, bias;  // [out, in / groups, k, k], [out] or undefined
  Conv2dOptions options;
};

// Over the last dim ([..., C]); with channels_first, over dim 1 of [N, C, ...].
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true, bool channels_first = false);
  Tensor forward(const Tensor& x) override;
  // A pre-norm block's `sum = x + branch; normed = norm(sum)`: add_layer_norm's one kernel
  // (ops/norm.h) where set_fused_residual_norm allows it and no scale multiplies x, else the two
  // ops (scaled_residual's sum, then the norm); the same values and gradients either way.
  // x_scale / branch_scale: per-channel factors of x and of the branch (ScaledOperand),
  // branch_keep drop path's per-sample factors of the branch (DroppedOperand); a branch_scale
  // alone goes into add_layer_norm's kernels, with drop path's factors it takes the unfused form.
  // branch_drop: the probability of the dropout the branch ends in, taken over from it
  // (Module::take_output_dropout) and applied here first (0: none; pass 0 outside training):
  // inside add_layer_norm's kernels in the fused form where no drop path comes between, inside
  // the sum's kernels in the unfused form (residual_sum).
  ResidualNorm forward_residual(const Tensor& x, const Tensor& branch,
                                const Tensor& x_scale = Tensor(),
                                const Tensor& branch_scale = Tensor(),
                                const Tensor& branch_keep = Tensor(), double branch_drop = 0.0);
  std::string type_name() const override { return "LayerNorm"; }
  Tensor weight, bias;  // bias undefined when bias = false
  double eps;
  bool channels_first;
  // Set by a block whose next module reads this norm's output only through matrix products
  // (Module::reads_input_by_matmul_only): under autocast the output is then written in the
  // autocast dtype, rounded once from f32 as the matrix product's cast would (ops/norm.h), and
  // its gradient comes back in that dtype. Off for channels_first norms.
  bool autocast_output = false;

 private:
  std::optional<DType> output_dtype(const Tensor& x) const;  // layer_norm's out_dtype for x
};

// Whether LayerNorm::autocast_output takes effect (default true): a process-wide switch for
// comparisons (`benchmark --norm-output f32`) and tests.
bool norm_autocast_outputs_enabled();
void set_norm_autocast_outputs(bool enabled);

// Whether LayerNorm::forward_residual runs the residual add and the norm as one op (default
// true; `train.residual_norm`, `benchmark --residual-norm`).
bool fused_residual_norm_enabled();
void set_fused_residual_norm(bool enabled);

// Whether Mlp runs its GELU and the dropout after it as one op in training (gelu_dropout,
// ops/random.h; default true; `train.gelu_dropout`, `benchmark --gelu-dropout`).
bool fused_gelu_dropout_enabled();
void set_fused_gelu_dropout(bool enabled);

// x * x_scale + (dropout(branch, p) * branch_keep) * branch_scale, the scales and drop path's
// factors as scaled_residual takes them (ops/pointwise.h; undefined for none): the residual sum
// of a branch whose closing dropout the block took over (Module::take_output_dropout), p > 0 in
// training, 0 otherwise. With set_fused_dropout_add the dropout runs in the sum's
// own kernels (dropout_add without scales, ops/random.h; scaled_residual's otherwise), else as an
// op before it; the same values, draws and gradients either way.
Tensor residual_sum(const Tensor& x, const Tensor& branch, double p,
                    const Tensor& x_scale = Tensor(), const Tensor& branch_scale = Tensor(),
                    const Tensor& branch_keep = Tensor());
// `train.dropout_add`, `benchmark --dropout-add`: unfused or fused (the default).
bool fused_dropout_add_enabled();
void set_fused_dropout_add(bool enabled);

// x [N, C, ...]; running statistics in buffers (running_mean, running_var, num_batches_tracked).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BatchNorm2d"; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  double eps, momentum;
  // Synchronised batch norm (distributed.sync_bn): a differentiable sum of a tensor over the
  // workers of a data-parallel job. When set, training normalises with the statistics of every
  // worker's batch together (PyTorch's SyncBatchNorm); null: this worker's batch alone.
  std::function<Tensor(const Tensor&)> sum_across_workers;

 private:
  Tensor forward_synchronised(const Tensor& x);
};

class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  double p;
  // Set by the module that applies this dropout last when it hands it over to its caller
  // (Module::take_output_dropout): forward then returns x.
  bool taken_over = false;
  // Sets taken_over and returns p: a take_output_dropout whose module ends in this dropout.
  double take_over() {
    taken_over = true;
    return p;
  }
};

// Stochastic depth: drops the whole residual branch per sample in training.
class DropPath : public Module {
 public:
  explicit DropPath(double p) : p(p) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DropPath"; }
  double p;
};

// A pointwise activation by name: identity, relu, gelu, gelu_tanh, quick_gelu, squared_relu,
// silu, sigmoid, starrelu (learnable scalar scale, init 1, and bias, init 0).
class Activation : public Module {
 public:
  explicit Activation(const std::string& name, double starrelu_scale = 1.0,
                      double starrelu_bias = 0.0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return kind_ == "starrelu" ? "StarReLU" : "Activation"; }
  static const std::vector<std::string>& names();
  const std::string& kind() const { return kind_; }  // one of names()
  Tensor scale, bias;  // starrelu only, shape [1]
  // Set by a module whose next step reads this activation only through a matrix product or a
  // convolution: under autocast StarReLU (f32 parameters, so an f32 result) then writes the
  // autocast dtype, rounded once as that op's cast would, and its gradient comes back in that
  // dtype (the same bits, without the f32 round trip; norm_autocast_outputs_enabled switches it
  // with the norms'). The other activations keep their input's dtype anyway.
  bool autocast_output = false;

 private:
  std::string kind_;
};

// The outputs of linear layers that read the same input, [..., out_i] each: with stacked
// projections on (`train.projections: stacked`), one matrix product of x with the layers' weights
// (and biases) stacked, split back into views of its output, so that x is read (and cast) once
// and its gradient comes from one product, summed in the product's f32 accumulators instead of
// two 16-bit gradients added in f32; else, and while a SummaryRecorder runs (its table lists each
// layer's call), each layer on x. The layers all have a bias or none has.
TensorList stacked_linear(const Tensor& x, const std::vector<Linear*>& layers);
// stacked_linear's one product, [..., sum of out_i], unsplit (to be split by the caller, into
// heads say: split_heads in nn/mixers/attention_core.h); undefined where stacked_linear would
// run the layers one by one.
Tensor stacked_product(const Tensor& x, const std::vector<Linear*>& layers);
// Whether stacked_linear stacks (default false: not yet timed on a GPU).
bool stacked_projections_enabled();
void set_stacked_projections(bool enabled);

// x * scale with a learnable per-channel scale over the last dim (LayerScale, res-scale).
class Scale : public Module {
 public:
  Scale(int64_t dim, double init_value);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Scale"; }
  Tensor scale;  // [dim]
};

// What a residual sum takes for `module(t)`, module a Scale or an identity (MetaFormer's
// res_scale, CaiT's LayerScale): t and the Scale's factor, for scaled_residual (ops/pointwise.h)
// to multiply in the same pass as the sum; or, while a SummaryRecorder runs (its table lists the
// module's call), module(t) and no factor.
struct ScaledOperand {
  Tensor value, scale;
};
ScaledOperand scaled_operand(Module& module, const Tensor& t);

// What a residual sum takes for `drop_path(t)`: t and the per-sample factors drop_path would
// multiply it by (drawn now, as the module draws them; undefined in eval or at rate 0), for
// scaled_residual to apply in the same pass as the sum; or, while a SummaryRecorder runs,
// drop_path(t) and no factors.
struct DroppedOperand {
  Tensor value, keep;
};
DroppedOperand dropped_operand(DropPath& drop_path, const Tensor& t);

// fc1 -> act -> drop -> fc2 -> drop over the last dim.
struct MlpOptions {
  int64_t hidden = 0;
  int64_t out = 0;  // 0: same as in
  std::string activation = "gelu";
  bool bias = true;
  double drop = 0.0;
  Init init = Init::kTorchDefault;
};
class Mlp : public Module {
 public:
  Mlp(int64_t dim, const MlpOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Mlp"; }
  bool reads_input_by_matmul_only() const override { return true; }  // fc1 first
  // The dropout after fc2 (the one after the activation stays).
  double take_output_dropout() override;

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
  std::shared_ptr<Activation> act_;
  std::shared_ptr<Dropout> drop_;  // after the activation and after fc2
  bool output_drop_taken_ = false;
};

}  // namespace ska::nn
