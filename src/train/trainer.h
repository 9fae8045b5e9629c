// The trainer: builds model, data, optimizer and schedule from an experiment config, runs the
// epochs (accumulation, clipping, non-finite skipping, EMA, per-epoch evaluation), writes the run
// folder (config.yaml, summary.csv, metrics.jsonl) and checkpoints, and resumes exactly.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "core/device.h"
#include "core/random.h"
#include "data/datasets/dataset.h"
#include "data/transforms/augment_factory.h"
#include "nn/module.h"
#include "ops/autocast.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/batch_source.h"
#include "train/checkpoint.h"
#include "train/loader.h"

namespace ska::train {

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
  // fp32, bf16 (autocast to bf16, f32 master weights) or fp16 (autocast to f16 with dynamic loss
  // scaling); on either device (the CPU emulates 16-bit math: f32 compute, 16-bit rounding).
  std::string precision = "fp32";
  static TrainOptions from_config(const ConfigNode& train);
  // The autocast state of the forward pass (disabled for fp32).
  AutocastState autocast() const;
};

// The `data:` keys the trainer reads (besides dataset/root and the normalisation keys).
struct DataOptions {
  std::string dataset, root;
  int64_t batch_size = 128;
  int64_t eval_batch_size = 256;
  int workers = 2;
  int64_t train_subset = 0;  // first N training images only; 0: all
  int64_t eval_subset = 0;   // first N test images only; 0: all
  std::vector<double> mean, std;
  data::TrainAugment augment;  // data.augment / data.mixup (src/data/transforms/augment_factory.h)
  DeviceResidentOptions device_resident;  // data.device_resident (train/batch_source.h)
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

// Loads a split as an in-memory dataset shaped for the model: grey 28x28 images are zero-padded
// and replicated (pad_and_replicate) when the model wants a larger or 3-channel input; `subset`
// keeps the first N images (0: all). ValueError when the sizes cannot be reconciled.
std::unique_ptr<data::InMemoryDataset> load_training_dataset(const DataOptions& options,
                                                             const std::string& split,
                                                             int64_t image_size, int64_t channels,
                                                             int64_t subset);

// Loads a split for the trainer: in-memory datasets as load_training_dataset does; folder datasets
// (imagenet) stay on disk and the loader decodes each sample. For those, `subset` N keeps N images
// spread evenly over the split (the folders are sorted by class, so the first N would be one).
std::unique_ptr<data::Dataset> load_dataset_split(const DataOptions& options,
                                                  const std::string& split, int64_t image_size,
                                                  int64_t channels, int64_t subset);

// The loader options for `dataset`. Training: data.batch_size, workers, the seed and data.augment's
// per-sample transform, which must crop datasets of varying image sizes to the model's size
// (ConfigError naming data.augment.random_resized_crop otherwise). Evaluation: eval_batch_size,
// dataset order, no augmentation; datasets decoded per sample get the eval transform (shorter
// side to image_size / crop_pct, centre crop).
LoaderOptions train_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                   uint64_t seed);
LoaderOptions eval_loader_options(const DataOptions& options, const data::Dataset& dataset);

struct EvalResult {
  double loss = 0.0, top1 = 0.0, top5 = 0.0;  // accuracies in percent
  int64_t count = 0;
};
// Evaluates `model` (eval mode, no grad, under `autocast`) on every batch of `loader`.
EvalResult evaluate(nn::Module& model, DataLoader& loader, Device device,
                    const AutocastState& autocast = AutocastState());

// A progress report during an epoch (for the console line).
struct Progress {
  int64_t epoch = 0, epochs = 0;
  int64_t batch = 0, batches = 0;
  double images_per_s = 0.0, eta_s = 0.0, loss = 0.0, lr = 0.0;
};

struct TrainerSetup {
  std::string run_dir;         // created; config.yaml, logs and checkpoints go here
  std::string resume;          // a checkpoint or run folder to continue from; "" starts fresh
  Device device = Device::cpu();
  std::function<void(const std::string&)> log;        // one finished line (may be null)
  std::function<void(const Progress&)> progress;      // in-place progress (may be null)
};

struct TrainResult {
  EvalResult final_eval;
  double best_top1 = -1.0;
  int64_t best_epoch = -1;
  EvalResult final_ema_eval;      // the EMA weights' (count 0 without train.ema_decay)
  double best_ema_top1 = -1.0;
  int64_t best_ema_epoch = -1;
  int64_t steps = 0;
  int64_t epochs_done = 0;
  double train_seconds = 0.0;   // wall-clock of this process's training loop (eval included)
  double images_per_s = 0.0;    // training images per second in this process
  std::string last_checkpoint;
};

class Trainer {
 public:
  // Reads every section of `config` (model, data, optim, sched, train, checkpoint) and checks
  // that no key is left unread; builds everything; loads the checkpoint when resuming.
  Trainer(const Config& config, TrainerSetup setup);
  ~Trainer();

  TrainResult fit();

  nn::Module& model() { return *model_; }
  const TrainState& state() const { return state_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

 private:
  void log(const std::string& line) const;
  void train_epoch(int64_t epoch, TrainResult& result, bool& stop);
  bool update(double micro_loss_sum);  // one optimizer update; false when skipped
  void save(bool is_best);
  void restore(const Checkpoint& checkpoint);
  void capture_rngs();
  TensorMap ema_tensors() const;
  EvalResult evaluate_ema();

  TrainerSetup setup_;
  std::string config_text_;
  TrainOptions train_;
  DataOptions data_;
  CheckpointOptions ckpt_;
  nn::ModulePtr model_;
  TensorList params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<optim::ModelEma> ema_;
  nn::ModulePtr ema_model_;                     // evaluates the EMA weights
  std::unique_ptr<optim::LossScaler> scaler_;   // fp16 only
  AutocastState autocast_state_;                // from train.precision
  std::unique_ptr<data::Dataset> train_set_, eval_set_;
  std::unique_ptr<DataLoader> train_loader_, eval_loader_;
  std::unique_ptr<BatchSource> train_batches_;  // train_loader_'s batches on the device
  std::unique_ptr<CheckpointManager> checkpoints_;
  Generator rng_;  // the trainer's own stream (batch-level augmentation)
  TrainState state_;
  int64_t steps_per_epoch_ = 0;
  int64_t consecutive_nonfinite_ = 0;
  int64_t last_saved_step_ = -1;
};

// The folder a new run writes to: <parent>/<config name>-<YYYYmmdd-HHMMSS> (created).
std::string make_run_dir(const std::string& parent, const std::string& config_name);
// The newest run folder <parent>/<config name>-* holding a complete checkpoint; "" when none.
std::string find_latest_run(const std::string& parent, const std::string& config_name);

}  // namespace ska::train
