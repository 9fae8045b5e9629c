// Reading the trainer's config sections (see options.h).
#include "train/options.h"

#include <cstdint>

#include "backend/device_runtime.h"
#include "core/error.h"
#include "core/precision.h"
#include "data/datasets/factory.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "ops/linear.h"

namespace ska::train {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kBF16: return "bf16";
    case Precision::kFP16: return "fp16";
    case Precision::kFP32: break;
  }
  return "fp32";
}

Precision precision_from_name(const std::string& name) {
  if (name == "fp32") return Precision::kFP32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16") return Precision::kFP16;
  SKA_FAIL(ValueError, "precision must be fp32, bf16 or fp16, got '", name, "'");
}

AutocastState autocast_state(Precision p) {
  AutocastState s;
  s.enabled = p != Precision::kFP32;
  s.dtype = p == Precision::kFP16 ? DType::kF16 : DType::kBF16;
  return s;
}

TrainOptions TrainOptions::from_config(const ConfigNode& t) {
  TrainOptions o;
  o.epochs = t.get_int_in("epochs", o.epochs, 1, 1 << 20);
  o.seed = static_cast<uint64_t>(t.get_int_in("seed", 42, 0, INT64_MAX));
  o.accumulate = t.get_int_in("accumulate", 1, 1, 1 << 16);
  o.clip_grad = t.get_double_in("clip_grad", 0.0, 0.0, 1e30);
  o.label_smoothing = t.get_double_in("label_smoothing", 0.0, 0.0, 0.999);
  o.max_nonfinite_steps = t.get_int_in("max_nonfinite_steps", 10, 1, 1 << 30);
  o.log_every = t.get_int_in("log_every", 50, 1, 1 << 30);
  o.eval_every = t.get_int_in("eval_every", 1, 1, 1 << 20);
  o.max_steps = t.get_int_in("max_steps", 0, 0, INT64_MAX);
  o.ema_decay = t.get_double_in("ema_decay", 0.0, 0.0, 0.999999);
  o.precision = precision_from_name(t.get_choice("precision", "fp32", {"fp32", "bf16", "fp16"}));
  o.cuda_graph = t.get_choice("cuda_graph", "off", {"auto", "on", "off"});
  o.kernels = KernelChoices::from_config(t);
  return o;
}

const std::vector<KernelChoiceSpec>& kernel_choice_specs() {
  using K = KernelChoiceSpec;
  using C = KernelChoices;
  static const std::vector<KernelChoiceSpec> specs = {
      {"attention",
       &C::attention,
       {"fused", "wmma", "scalar", "unfused"},
       "fused (the fused attention op wherever the logits are q k^T; on CUDA bf16/f16 on the "
       "tensor cores, the mma.sync kernels), wmma (the same on the WMMA tensor-core kernels), "
       "scalar (the same op on CUDA's f32-FMA kernels; on the CPU wmma and scalar are fused) or "
       "unfused (matmul, softmax, matmul: the weights stored)"},
      {"attention_backward",
       &C::attention_backward,
       {"split", "one_block", "one_pass"},
       "the mma.sync attention's backward for up to 80 tokens and head dims up to 64: split (a "
       "dK/dV kernel and a dQ kernel), one_block (one block per head that loads every operand "
       "once; the default: CSKA-ViT-S's bf16 training step 1.12x faster on an H200) or one_pass "
       "(the same block computing each weight once, shared through shared memory for dK and dV: "
       "five products instead of seven; not yet timed on a GPU)",
       K::kCudaOnly},
      {"attention_forward",
       &C::attention_forward,
       {"tiled", "one_block"},
       "the mma.sync attention's forward where the longer side has 65 to 80 rows (ViT-S's 65 "
       "tokens): tiled (blocks of up to 64 queries, key tiles of 64) or one_block (one block per "
       "head, every key in one tile; the default)",
       K::kCudaOnly},
      {"attention_registers",
       &C::attention_registers,
       {"compiler", "capped"},
       "the mma.sync one-block attention backward at head dim 64 (ViT-S, CSKA-ViT-S, CaiT-S): "
       "compiler (the registers ptxas takes, 147 a thread: two blocks of five warps per SM) or "
       "capped (held to 136, without spills: three blocks per SM); the same bits; not yet timed "
       "on a GPU",
       K::kCudaOnly | K::kTrainingOnly},
      {"attention_schedule",
       &C::attention_schedule,
       {"per_head", "persistent"},
       "the blocks of the mma.sync one-block attention kernels (train.attention_backward: "
       "one_block, and the one-block forward): per_head (one block per head) or persistent (as "
       "many blocks as fit on the GPU, each walking heads and staging the next head's operands "
       "into a second set of tiles while it computes the current one); the same bits; not yet "
       "timed on a GPU",
       K::kCudaOnly},
      {"attention_loads",
       &C::attention_loads,
       {"async", "sync"},
       "how the CUDA tensor-core attention kernels fill their shared tiles and read fragments "
       "from them: async (cp.async copies, all in flight before a thread waits; mma.sync "
       "fragments by ldmatrix) or sync (a load and a store per 16 bytes; fragments by 16- and "
       "32-bit loads); the same bits",
       K::kCudaOnly},
      {"elementwise",
       &C::elementwise,
       {"fast", "reference"},
       "CUDA elementwise kernels: fast (merged dims, 16-byte accesses, 32-bit offsets) or "
       "reference (64-bit offsets over every dim)",
       K::kCudaOnly},
      {"norm_output",
       &C::norm_output,
       {"autocast", "f32"},
       "under autocast, layer norms read only by a matrix product write: autocast (its 16-bit "
       "dtype, the same bits) or f32 (cast by the product after)",
       K::kAutocastOnly},
      {"norm_forward",
       &C::norm_forward,
       {"loop", "held"},
       "CUDA layer norm forward (and the fused residual add's) for rows of up to 1024 columns: "
       "loop (walks the row three times, each load waiting for the last) or held (each lane's "
       "columns loaded into registers in one burst, the row read once; the same bits; not yet "
       "measured on a GPU)",
       K::kCudaOnly},
      {"norm_backward",
       &C::norm_backward,
       {"split", "fused"},
       "CUDA layer norm backward for rows of up to 768 columns: split (a grad_x kernel and a "
       "column reduction) or fused (one pass that reads grad_y and x once; the default)",
       K::kCudaOnly | K::kTrainingOnly},
      {"residual_norm",
       &C::residual_norm,
       {"unfused", "fused"},
       "a pre-norm block's residual add and the layer norm after it: unfused (two ops) or fused "
       "(one kernel each way, add_layer_norm, with a ViT or CaiT branch's closing dropout inside "
       "in training and CaiT's LayerScale; sums with a scale of the stream stay scaled_residual "
       "and the norm; the same bits; the default)"},
      {"gelu_dropout",
       &C::gelu_dropout,
       {"unfused", "fused"},
       "an MLP's GELU and the dropout after it in training: unfused (two ops) or fused (one "
       "kernel each way, gelu_dropout; the same bits; the default)",
       K::kTrainingOnly},
      {"dropout_add",
       &C::dropout_add,
       {"unfused", "fused"},
       "the dropout closing a ViT or CaiT block's branch and the residual sum it feeds, in "
       "training: unfused (the dropout op first) or fused (in the sum's kernels, dropout_add / "
       "scaled_residual; the same bits; the default)",
       K::kTrainingOnly},
      {"talking_heads",
       &C::talking_heads,
       {"unfused", "fused"},
       "CaiT's talking-heads attention weights: unfused (mix, softmax, mix as ops) or fused (one "
       "kernel each way, talking_heads_softmax, nothing between stored; within the dtype's "
       "tolerances; its CUDA tests pass on an H200, its speed in CaiT is not yet measured)"},
      {"projections",
       &C::projections,
       {"separate", "stacked"},
       "linear projections that read the same tokens (CaiT's patch attention: to_q with to_kv or "
       "to_v): separate (a matrix product each) or stacked (one product on their weights "
       "stacked, its output split into views: the input read and cast once, its gradient from "
       "one product and its norm's output in the autocast dtype; within rounding of separate; "
       "not yet timed on a GPU)"},
      {"weight_casts",
       &C::weight_casts,
       {"per_use", "per_step"},
       "autocast's casts of the f32 parameters: per_use (the op that reads one casts it: a "
       "launch per parameter and use) or per_step (all of them before each forward pass, a "
       "launch per 32, and once per evaluation pass: AutocastParamCasts; the same bits; no "
       "faster on an H200, 2026-11-28)",
       K::kAutocastOnly},
      {"linear_grads",
       &C::linear_grads,
       {"autocast", "f32"},
       "the gradients of the linear layers' f32 weights and biases under autocast: autocast (a "
       "16-bit gradient cast to f32, as torch.autocast gives them) or f32 (written in f32 by the "
       "backward GEMM and column sum, not rounded to 16 bits; no faster on an H200, 2026-11-28)",
       K::kAutocastOnly | K::kTrainingOnly},
      {"conv_logits",
       &C::conv_logits,
       {"conv", "gemm", "auto", "direct"},
       "CSKA's logit convolution: conv (the convolution; cuDNN on CUDA), gemm (each query's 3x3 "
       "neighbourhood times the filters: im2col + batched GEMM), auto (on CUDA under "
       "cudnn_benchmark, the fastest of the three for each shape, timed on its first call; conv "
       "elsewhere) or direct (the grid_conv_logits op: on CUDA this project's tensor-core "
       "kernels, no im2col)"},
      {"conv_logits_grad_w",
       &C::conv_logits_grad_w,
       {"per_tap", "per_row"},
       "the filter gradient of CSKA's direct conv logits on CUDA (train.conv_logits: direct, or "
       "auto's choice of it): per_tap (a block per tap) or per_row (a block per row of a 3x3 "
       "filter at head dims up to 64: the gradient's rows staged once for three taps); the same "
       "bits; not yet timed on a GPU",
       K::kCudaOnly | K::kTrainingOnly},
      {"depthwise_conv",
       &C::depthwise_conv,
       {"cudnn", "direct", "auto"},
       "channels-last depthwise convolutions with stride 1 and 3x3 to 7x7 filters (MetaFormer's "
       "separable convolutions) on CUDA: cudnn, direct (this project's kernels) or auto (the "
       "default: under cudnn_benchmark, the faster of the two for each shape and pass, timed on "
       "its first call; CAFormer-S18's bf16 training step 1.7x faster than on cuDNN on an H200)",
       K::kCudaOnly},
      {"gemm_algorithm",
       &C::gemm_algorithm,
       {"heuristic", "timed"},
       "cuBLASLt's algorithm for each matrix-product problem on CUDA: heuristic (its first "
       "answer, as PyTorch takes it) or timed (under cudnn_benchmark, up to 8 of its answers "
       "timed on the problem's first call, the fastest kept; not yet measured on a GPU)",
       K::kCudaOnly},
  };
  return specs;
}

KernelChoices KernelChoices::from_config(const ConfigNode& t) {
  KernelChoices k;
  for (const KernelChoiceSpec& spec : kernel_choice_specs()) {
    std::vector<std::string> accepted = spec.values;
    // "mma": the mma.sync kernels' name while they were not yet the default (run folders of then).
    if (spec.member == &KernelChoices::attention) accepted.push_back("mma");
    std::string& value = k.*spec.member;
    value = t.get_choice(spec.key, value, accepted);
    if (value == "mma") value = "fused";
  }
  k.cudnn_benchmark = t.get<bool>("cudnn_benchmark", k.cudnn_benchmark);
  k.cudnn_deterministic = t.get<bool>("cudnn_deterministic", k.cudnn_deterministic);
  return k;
}

void KernelChoices::apply() const {
  nn::set_fused_attention(attention != "unfused");
  set_cuda_attention_tensor_cores(attention == "fused" || attention == "wmma");
  set_cuda_attention_mma(attention == "fused");
  set_cuda_attention_one_block_backward(attention_backward != "split");
  set_cuda_attention_one_pass_backward(attention_backward == "one_pass");
  set_cuda_attention_one_block_forward(attention_forward == "one_block");
  set_cuda_attention_register_cap(attention_registers == "capped");
  set_cuda_attention_persistent(attention_schedule == "persistent");
  set_cuda_attention_async_loads(attention_loads == "async");
  set_cuda_elementwise_fast_paths(elementwise == "fast");
  nn::set_norm_autocast_outputs(norm_output == "autocast");
  set_cuda_layer_norm_held_forward(norm_forward == "held");
  set_cuda_layer_norm_fused_backward(norm_backward == "fused");
  nn::set_fused_residual_norm(residual_norm == "fused");
  nn::set_fused_gelu_dropout(gelu_dropout == "fused");
  nn::set_fused_dropout_add(dropout_add == "fused");
  nn::set_fused_talking_heads(talking_heads == "fused");
  nn::set_stacked_projections(projections == "stacked");
  set_linear_f32_grads(linear_grads == "f32");
  nn::set_conv_logits_form(conv_logits == "gemm"     ? nn::ConvLogitsForm::kGemm
                           : conv_logits == "auto"   ? nn::ConvLogitsForm::kAuto
                           : conv_logits == "direct" ? nn::ConvLogitsForm::kDirect
                                                     : nn::ConvLogitsForm::kConv);
  set_cuda_conv_logits_grad_w_rows(conv_logits_grad_w == "per_row");
  set_cuda_depthwise_conv(depthwise_conv == "direct" ? DepthwiseConv::kDirect
                          : depthwise_conv == "auto" ? DepthwiseConv::kTimed
                                                     : DepthwiseConv::kCudnn);
  set_cuda_gemm_algorithm(gemm_algorithm == "timed" ? GemmAlgorithm::kTimed
                                                    : GemmAlgorithm::kHeuristic);
  set_cudnn_benchmark(cudnn_benchmark);
  set_cudnn_deterministic(cudnn_deterministic);
}

std::string KernelChoices::describe(const KernelRun& run) const {
  static const KernelChoices defaults;
  std::string out;
  for (const KernelChoiceSpec& spec : kernel_choice_specs()) {
    if (((spec.scope & KernelChoiceSpec::kCudaOnly) && !run.cuda) ||
        ((spec.scope & KernelChoiceSpec::kTrainingOnly) && !run.training) ||
        ((spec.scope & KernelChoiceSpec::kAutocastOnly) && !run.autocast)) {
      continue;
    }
    const std::string& value = this->*spec.member;
    if (value != defaults.*spec.member) out += " [" + std::string(spec.key) + ": " + value + "]";
  }
  if (!cudnn_benchmark && run.cuda) out += " [cuDNN heuristics]";
  if (cudnn_deterministic && run.cuda) out += " [deterministic cuDNN]";
  return out;
}

DataOptions DataOptions::from_config(const ConfigNode& d, int64_t image_size, int64_t channels,
                                     int64_t num_classes) {
  DataOptions o;
  const data::DatasetSpec spec = data::read_dataset_spec(d);
  o.dataset = spec.name;
  o.root = spec.root;
  o.batch_size = d.get_int_in("batch_size", o.batch_size, 1, 1 << 20);
  o.eval_batch_size = d.get_int_in("eval_batch_size", o.eval_batch_size, 1, 1 << 20);
  o.workers = static_cast<int>(d.get_int_in("workers", 2, 0, 256));
  o.train_subset = d.get_int_in("train_subset", 0, 0, INT64_MAX);
  o.eval_subset = d.get_int_in("eval_subset", 0, 0, INT64_MAX);
  const data::EvalTransform norm = data::read_eval_transform(d, image_size, channels);
  o.mean = norm.mean;
  o.std = norm.std;
  o.eval = norm;
  o.augment = data::read_train_augment(d, image_size, channels, num_classes, o.mean);
  o.device_resident = data::DeviceResidentOptions::from_config(d, o.augment, image_size);
  return o;
}

CheckpointOptions CheckpointOptions::from_config(const ConfigNode& c) {
  CheckpointOptions o;
  o.keep = static_cast<int>(c.get_int_in("keep", o.keep, 1, 1000));
  o.every_epochs = c.get_int_in("every_epochs", 1, 0, 1 << 20);
  o.every_steps = c.get_int_in("every_steps", 0, 0, INT64_MAX);
  return o;
}

DistributedOptions DistributedOptions::from_config(const ConfigNode& d) {
  DistributedOptions o;
  o.bucket_mb = d.get_double_in("bucket_mb", o.bucket_mb, 0.001, 1 << 16);
  o.reduce_dtype = d.get_choice("reduce_dtype", "f32", {"f32", "bf16"}) == "bf16" ? DType::kBF16
                                                                                 : DType::kF32;
  o.timeout_s = d.get_double_in("timeout_s", o.timeout_s, 1.0, 7 * 24 * 3600.0);
  o.sync_bn = d.get<bool>("sync_bn", false);
  o.force_backend = d.get<bool>("force_backend", false);
  o.shard_optimizer = d.get<bool>("shard_optimizer", false);
  return o;
}

}  // namespace ska::train
