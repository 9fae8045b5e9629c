// The sections of an experiment config the trainer reads, each with its defaults and checks:
// train:, data: (the trainer's keys), checkpoint: and distributed:.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/dtype.h"
#include "data/eval_transform.h"
#include "data/pipeline/batch_source.h"
#include "data/transforms/augment_factory.h"
#include "ops/autocast.h"
#include "train/evaluate.h"

namespace ska::train {

// train.precision: f32 everywhere, or autocast to a 16-bit type with f32 master weights (fp16
// adds dynamic loss scaling).
enum class Precision { kFP32, kBF16, kFP16 };
const char* precision_name(Precision p);         // "fp32", "bf16", "fp16"
Precision precision_from_name(const std::string& name);  // ValueError naming the value
AutocastState autocast_state(Precision p);       // disabled for fp32

// Where a run is, for KernelChoices::describe: what a choice can change depends on it.
struct KernelRun {
  bool cuda = true;      // on a CUDA device (the CPU has one implementation of most kernels)
  bool training = true;  // a training step (dropout, gradients), not evaluation or inference
  bool autocast = true;  // under autocast (bf16/f16 with f32 weights)
};

// Which implementation the kernels with a fast path and a reference take: the string choices
// listed, with their values and what each does, by kernel_choice_specs() (the `train:` key of each
// is the member's name, benchmark's flag the same with dashes), and the two cuDNN booleans. The
// fast ones by default (a fast path becomes the default once measured faster on a GPU); the
// others to compare, or to work around a fast path that misbehaves on some GPU without
// rebuilding. Process-wide switches, set by apply().
struct KernelChoices {
  std::string attention = "fused";
  std::string attention_backward = "one_block";
  std::string attention_forward = "one_block";
  std::string attention_registers = "compiler";
  std::string attention_schedule = "per_head";
  std::string attention_loads = "async";
  std::string elementwise = "fast";
  std::string norm_output = "autocast";
  std::string norm_forward = "loop";
  std::string norm_backward = "fused";
  std::string residual_norm = "fused";
  std::string gelu_dropout = "fused";
  std::string dropout_add = "fused";
  std::string talking_heads = "unfused";
  std::string projections = "separate";
  std::string weight_casts = "per_use";
  std::string linear_grads = "autocast";
  std::string conv_logits = "auto";
  std::string conv_logits_grad_w = "per_tap";
  std::string depthwise_conv = "auto";
  std::string gemm_algorithm = "heuristic";
  // Time cuDNN's convolution algorithms on the first call of each shape and keep the fastest
  // (core/precision.h's cudnn_benchmark; timm's training scripts set it too). CUDA only.
  bool cudnn_benchmark = true;
  // Only deterministic cuDNN algorithms (core/precision.h's cudnn_deterministic). CUDA only.
  bool cudnn_deterministic = false;
  static KernelChoices from_config(const ConfigNode& train);
  void apply() const;
  // What differs from the defaults and can change `run`, as " [attention: unfused]" etc. for a
  // status line; "" if none.
  std::string describe(const KernelRun& run = KernelRun()) const;
};

// One string choice of KernelChoices.
struct KernelChoiceSpec {
  // Where a choice can change anything (KernelChoices::describe leaves it out elsewhere).
  enum Scope : unsigned { kAnywhere = 0, kCudaOnly = 1, kTrainingOnly = 2, kAutocastOnly = 4 };
  const char* key;                     // the member's name: train.KEY, benchmark --KEY
  std::string KernelChoices::*member;  // its default is KernelChoices{}.*member
  std::vector<std::string> values;     // what it takes
  const char* help;                    // what each value does
  unsigned scope = kAnywhere;          // Scope flags
};
// Every string choice of KernelChoices, in the order of its members.
const std::vector<KernelChoiceSpec>& kernel_choice_specs();

// The `train:` section.
struct TrainOptions {
  int64_t epochs = 1;              // with sched.cooldown_epochs added by the schedule
  uint64_t seed = 42;
  int64_t accumulate = 1;          // micro-batches per optimizer update
  double clip_grad = 0.0;          // global grad-norm clip; 0: off
  double label_smoothing = 0.0;
  int64_t max_nonfinite_steps = 10;  // consecutive skipped updates before stopping with an error
  int64_t log_every = 50;          // optimizer updates between metrics.jsonl step records
  int64_t eval_every = 1;          // epochs between evaluations (the last epoch always evaluates)
  int64_t max_steps = 0;           // stop (with a checkpoint) after this many updates; 0: off
  double ema_decay = 0.0;          // model EMA decay; 0: off (else the EMA is evaluated too)
  // On either device (the CPU emulates 16-bit math: f32 compute, 16-bit rounding).
  Precision precision = Precision::kFP32;
  // Capture the training step as a CUDA Graph and replay it (train/graph_step.h): "on" (an error
  // where it cannot be), "auto" (where it can), "off".
  std::string cuda_graph = "off";
  KernelChoices kernels;
  static TrainOptions from_config(const ConfigNode& train);
  // The autocast state of the forward pass (disabled for fp32).
  AutocastState autocast() const { return autocast_state(precision); }
  // How the trainer (and `validate`) evaluate: under autocast(), the parameters cast once for
  // the pass with `train.weight_casts: per_step`.
  EvalPrecision eval_precision() const { return {autocast(), kernels.weight_casts == "per_step"}; }
};

// The `data:` keys the trainer reads (besides dataset/root and the normalisation keys).
struct DataOptions {
  std::string dataset, root;
  int64_t batch_size = 128;        // per worker: the global batch is workers x this x accumulate
  int64_t eval_batch_size = 256;
  int workers = 2;
  int64_t train_subset = 0;  // first N training images only; 0: all
  int64_t eval_subset = 0;   // first N test images only; 0: all
  std::vector<double> mean, std;
  data::TrainAugment augment;  // data.augment / data.mixup (src/data/transforms/augment_factory.h)
  data::DeviceResidentOptions device_resident;  // data.device_resident (data/pipeline/batch_source.h)
  data::EvalTransform eval;    // data.crop_pct / data.interpolation (src/data/eval_transform.h)
  // Reads `data` for a model taking `channels` x `image_size` input with `num_classes` outputs.
  static DataOptions from_config(const ConfigNode& data, int64_t image_size, int64_t channels,
                                 int64_t num_classes);
};

// The `checkpoint:` section.
struct CheckpointOptions {
  int keep = 3;              // recent checkpoints kept (plus `best`)
  int64_t every_epochs = 1;  // 0: only at the end
  int64_t every_steps = 0;   // also every N updates; 0: off
  static CheckpointOptions from_config(const ConfigNode& checkpoint);
};

// The `distributed:` section (data parallelism; ignored by a single worker).
struct DistributedOptions {
  double bucket_mb = 25.0;             // gradient bucket size
  DType reduce_dtype = DType::kF32;    // f32 or bf16 gradients on the wire
  double timeout_s = 600.0;            // a collective not done by then fails the worker
  bool sync_bn = false;                // batch norm over all workers' batches (else local)
  bool force_backend = false;          // one worker through Gloo / NCCL too (tests, overhead)
  bool shard_optimizer = false;        // ZeRO stage 1: each worker keeps its share of the state
  static DistributedOptions from_config(const ConfigNode& distributed);
};

}  // namespace ska::train
