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

// Which implementation the kernels with a fast path and a reference take (`train.attention`,
// `train.elementwise`, `train.norm_output`, `train.residual_norm`, `train.gelu_dropout`,
// `train.dropout_add`, `train.talking_heads`, `train.weight_casts`, `train.linear_grads`,
// `train.conv_logits`, `train.depthwise_conv`, `train.cudnn_benchmark`,
// `train.cudnn_deterministic`): the fast ones by default; the others to
// compare, or to work around a fast path that misbehaves on some GPU without rebuilding.
// Process-wide switches, set by apply().
struct KernelChoices {
  // fused (the fused attention op; on CUDA bf16/f16 on the tensor cores, the mma.sync kernels),
  // wmma (the same on the WMMA tensor-core kernels), scalar (the same op on CUDA's f32-FMA
  // kernels; on the CPU wmma and scalar are the same as fused) or unfused (matmul, softmax,
  // matmul).
  std::string attention = "fused";
  // The mma.sync kernels' backward pass for sequences of at most 80 tokens with head dims up to
  // 64: split (a dK/dV kernel and a dQ kernel) or one_block (one block per head that loads every
  // operand once; set_cuda_attention_one_block_backward, not yet measured on a GPU).
  std::string attention_backward = "split";
  // The mma.sync attention's forward where the longer side has 65 to 80 rows (ViT-S's 65 tokens):
  // tiled (blocks of up to 64 queries, key tiles of 64) or one_block (one block per head, every
  // key in one tile; set_cuda_attention_one_block_forward, not yet measured on a GPU).
  std::string attention_forward = "tiled";
  std::string elementwise = "fast";      // CUDA elementwise kernels: fast or reference indexing
  std::string norm_output = "autocast";  // autocast: norms read by one matmul write bf16/f16
  // A pre-norm block's residual add and the norm after it: unfused (two ops) or fused (one
  // kernel each way, add_layer_norm; the same bits; nn::set_fused_residual_norm, not yet measured
  // on a GPU).
  std::string residual_norm = "unfused";
  // An MLP's GELU and the dropout after it in training: unfused (two ops) or fused (one kernel
  // each way, gelu_dropout; the same bits; nn::set_fused_gelu_dropout, not yet measured on a GPU).
  std::string gelu_dropout = "unfused";
  // The dropout closing a ViT or CaiT block's branch and the residual sum it feeds, in training:
  // unfused (the dropout op first) or fused (in the sum's kernels, dropout_add / scaled_residual;
  // the same bits; nn::set_fused_dropout_add, not yet run on a GPU).
  std::string dropout_add = "unfused";
  // CaiT's talking-heads attention weights: unfused (mix, softmax, mix as ops) or fused (one kernel
  // each way, talking_heads_softmax; within the dtype's tolerances; nn::set_fused_talking_heads,
  // not yet run on a GPU).
  std::string talking_heads = "unfused";
  // Autocast's casts of the f32 parameters in a training step: per_use (the op that reads one
  // casts it: a launch per parameter) or per_step (all of them before the forward pass, a launch
  // per 32 parameters: AutocastParamCasts; the same bits; read by TrainStep, not yet run on a
  // GPU).
  std::string weight_casts = "per_use";
  // The gradients of the linear layers' f32 weights and biases under autocast: autocast (a 16-bit
  // gradient cast to f32, as torch.autocast gives them) or f32 (written in f32 by the backward
  // GEMM and column sum, not rounded to 16 bits: set_linear_f32_grads; not yet run on a GPU).
  std::string linear_grads = "autocast";
  // CSKA's logit convolution (nn::conv_logits): conv (the convolution; cuDNN on CUDA), gemm
  // (each query's 3x3 neighbourhood times the filters: im2col + batched GEMM) or auto (on CUDA
  // under cudnn_benchmark, the faster of the two for each shape, timed on its first call; conv
  // elsewhere) or direct (the grid_conv_logits op: on CUDA this project's tensor-core kernels,
  // no im2col; not yet measured on a GPU).
  std::string conv_logits = "auto";
  // Channels-last depthwise convolutions with stride 1 and 3x3 to 7x7 filters (MetaFormer's
  // separable convolutions) on CUDA: cudnn, direct (this project's kernels,
  // cuda/kernels/conv2d_depthwise.cu; not yet measured on a GPU) or auto (under cudnn_benchmark,
  // the faster of the two for each shape and pass, timed on its first call).
  std::string depthwise_conv = "cudnn";
  // Time cuDNN's convolution algorithms on the first call of each shape and keep the fastest
  // (core/precision.h's cudnn_benchmark; timm's training scripts set it too). CUDA only.
  bool cudnn_benchmark = true;
  // Only deterministic cuDNN algorithms (core/precision.h's cudnn_deterministic). CUDA only.
  bool cudnn_deterministic = false;
  static KernelChoices from_config(const ConfigNode& train);
  void apply() const;
  // What differs from the defaults, as " [unfused attention]" etc. for a status line; "" if none.
  std::string describe() const;
};

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
