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

KernelChoices KernelChoices::from_config(const ConfigNode& t) {
  KernelChoices k;
  // "mma": the mma.sync kernels' name while they were not yet the default (run folders of then).
  k.attention =
      t.get_choice("attention", k.attention, {"fused", "wmma", "scalar", "unfused", "mma"});
  if (k.attention == "mma") k.attention = "fused";
  k.attention_backward =
      t.get_choice("attention_backward", k.attention_backward, {"split", "one_block"});
  k.attention_forward =
      t.get_choice("attention_forward", k.attention_forward, {"tiled", "one_block"});
  k.elementwise = t.get_choice("elementwise", k.elementwise, {"fast", "reference"});
  k.norm_output = t.get_choice("norm_output", k.norm_output, {"autocast", "f32"});
  k.residual_norm = t.get_choice("residual_norm", k.residual_norm, {"unfused", "fused"});
  k.gelu_dropout = t.get_choice("gelu_dropout", k.gelu_dropout, {"unfused", "fused"});
  k.dropout_add = t.get_choice("dropout_add", k.dropout_add, {"unfused", "fused"});
  k.talking_heads = t.get_choice("talking_heads", k.talking_heads, {"unfused", "fused"});
  k.weight_casts = t.get_choice("weight_casts", k.weight_casts, {"per_use", "per_step"});
  k.linear_grads = t.get_choice("linear_grads", k.linear_grads, {"autocast", "f32"});
  k.conv_logits = t.get_choice("conv_logits", k.conv_logits, {"conv", "gemm", "auto", "direct"});
  k.depthwise_conv = t.get_choice("depthwise_conv", k.depthwise_conv, {"cudnn", "direct", "auto"});
  k.cudnn_benchmark = t.get<bool>("cudnn_benchmark", k.cudnn_benchmark);
  k.cudnn_deterministic = t.get<bool>("cudnn_deterministic", k.cudnn_deterministic);
  return k;
}

void KernelChoices::apply() const {
  nn::set_fused_attention(attention != "unfused");
  set_cuda_attention_tensor_cores(attention == "fused" || attention == "wmma");
  set_cuda_attention_mma(attention == "fused");
  set_cuda_attention_one_block_backward(attention_backward == "one_block");
  set_cuda_attention_one_block_forward(attention_forward == "one_block");
  set_cuda_elementwise_fast_paths(elementwise == "fast");
  nn::set_norm_autocast_outputs(norm_output == "autocast");
  nn::set_fused_residual_norm(residual_norm == "fused");
  nn::set_fused_gelu_dropout(gelu_dropout == "fused");
  nn::set_fused_dropout_add(dropout_add == "fused");
  nn::set_fused_talking_heads(talking_heads == "fused");
  set_linear_f32_grads(linear_grads == "f32");
  nn::set_conv_logits_form(conv_logits == "gemm"     ? nn::ConvLogitsForm::kGemm
                           : conv_logits == "auto"   ? nn::ConvLogitsForm::kAuto
                           : conv_logits == "direct" ? nn::ConvLogitsForm::kDirect
                                                     : nn::ConvLogitsForm::kConv);
  set_cuda_depthwise_conv(depthwise_conv == "direct" ? DepthwiseConv::kDirect
                          : depthwise_conv == "auto" ? DepthwiseConv::kTimed
                                                     : DepthwiseConv::kCudnn);
  set_cudnn_benchmark(cudnn_benchmark);
  set_cudnn_deterministic(cudnn_deterministic);
}

std::string KernelChoices::describe() const {
  std::string out;
  if (attention != "fused") out += " [" + attention + " attention]";
  if (attention_backward != "split") out += " [" + attention_backward + " attention backward]";
  if (attention_forward != "tiled") out += " [" + attention_forward + " attention forward]";
  if (elementwise != "fast") out += " [reference elementwise kernels]";
  if (norm_output != "autocast") out += " [f32 norm outputs]";
  if (residual_norm != "unfused") out += " [" + residual_norm + " residual norm]";
  if (gelu_dropout != "unfused") out += " [" + gelu_dropout + " GELU dropout]";
  if (dropout_add != "unfused") out += " [" + dropout_add + " dropout add]";
  if (talking_heads != "unfused") out += " [" + talking_heads + " talking heads]";
  if (weight_casts != "per_use") out += " [weight casts " + weight_casts + "]";
  if (linear_grads != "autocast") out += " [" + linear_grads + " linear grads]";
  if (conv_logits != "auto") out += " [conv logits: " + conv_logits + "]";
  if (depthwise_conv != "cudnn") out += " [depthwise conv: " + depthwise_conv + "]";
  if (!cudnn_benchmark) out += " [cuDNN heuristics]";
  if (cudnn_deterministic) out += " [deterministic cuDNN]";
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
