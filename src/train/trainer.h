// The trainer: builds model, data, optimizer and schedule from an experiment config and runs the
// epochs (accumulation, clipping, non-finite skipping, EMA, per-epoch evaluation), alone or as
// one worker of a data-parallel job; writes the run folder (rank 0) and resumes exactly.
// The pieces live beside it: options.h (config sections), run_data.h (datasets, loader options),
// train_step.h (micro-step and update), evaluate.h, run_output.h, checkpoint.h.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "core/device.h"
#include "core/random.h"
#include "train/graph_step.h"
#include "data/datasets/dataset.h"
#include "distributed/communicator.h"
#include "nn/module.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "data/pipeline/batch_source.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "data/pipeline/loader.h"
#include "train/options.h"
#include "train/run_data.h"
#include "train/run_lock.h"
#include "train/run_output.h"
#include "train/train_step.h"

namespace ska::train {

// A progress report during an epoch (for the console line).
struct Progress {
  int64_t epoch = 0, epochs = 0;
  int64_t batch = 0, batches = 0;
  double images_per_s = 0.0, eta_s = 0.0, loss = 0.0, lr = 0.0;
};

struct TrainerSetup {
  std::string run_dir;         // created; config.yaml, logs and checkpoints go here (rank 0)
  std::string resume;          // a checkpoint or run folder to continue from; "" starts fresh
  Device device = Device::cpu();
  // The workers of a data-parallel job (every rank passes the same run_dir and resume); null: a
  // single worker. Must outlive the trainer.
  dist::Communicator* comm = nullptr;
  // The run folder's lock when the caller already holds it (apps/train takes it before opening
  // train.log); null: rank 0 takes it itself.
  std::shared_ptr<RunFolderLock> lock;
  std::function<void(const std::string&)> log;        // one finished line (may be null)
  std::function<void(const Progress&)> progress;      // in-place progress (may be null)
  // A request to stop early: returns a signal number (see stop_signal.h) once one came, else 0;
  // null: never. Asked after every update by one worker, every train.log_every updates and at
  // epoch ends by every worker of a job (they agree in one small collective). The run then writes
  // a checkpoint and fit() returns with TrainResult::stop_signal set.
  std::function<int()> stop_signal;
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
  double images_per_s = 0.0;    // training images per second, all workers together
  std::string last_checkpoint;
  int stop_signal = 0;          // the signal that stopped the run early (after a checkpoint); 0: none
  bool stopped_at_max_steps = false;  // train.max_steps ended it before its last epoch did
};

class Trainer {
 public:
  // Reads every section of `config` (model, data, optim, sched, train, checkpoint, distributed)
  // and checks that no key is left unread; builds everything; loads the checkpoint when resuming.
  Trainer(const Config& config, TrainerSetup setup);
  ~Trainer();

  TrainResult fit();
  // True when there is nothing left to train: every epoch done, or train.max_steps reached (a
  // resumed run that had finished).
  bool finished() const;

  nn::Module& model() { return *model_; }
  const TrainState& state() const { return state_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int world_size() const { return comm_->world_size(); }
  // Images per optimizer update over all workers: world size x data.batch_size x accumulate.
  int64_t global_batch() const;

 private:
  void log(const std::string& line) const { output_->line(line); }
  void train_epoch(int64_t epoch, TrainResult& result, bool& stop);
  void update(const Tensor& micro_loss_sum);
  // train.cuda_graph: the whole update on this batch through the captured step (captured first,
  // after a few eager updates); false when it ran no update (the batch is then stepped eagerly).
  bool replay_update(const Tensor& images, const Tensor& target);
  // Reads the update statistics back (see UpdateStats): the epoch's and the log window's loss,
  // the skipped updates (a warning; an error once train.max_nonfinite_steps are in a row).
  void read_update_stats();
  void finish_epoch(int64_t epoch, double train_loss, double seconds, TrainResult& result);
  EvalResult evaluate_model(nn::Module& model);
  void sync_buffers(nn::Module& model);
  void save(bool is_best);
  // The stop request every worker agrees on at this point (TrainerSetup::stop_signal): one
  // worker asks at every call; a job only where `every_worker_here` (all workers make the same
  // calls), in one all-gather, taking the first rank's request. 0: go on.
  int agreed_stop_signal(bool every_worker_here);
  // When the workers agree on a stop here (agreed_stop_signal): writes a checkpoint of where the
  // run stands (unless it has one), waits for every worker, sets result.stop_signal; true.
  bool stop_if_asked(bool every_worker_here, TrainResult& result);
  void restore(const Checkpoint& checkpoint);
  void capture_rngs();
  void seed_rank_generators();
  TensorMap ema_tensors() const;

  TrainerSetup setup_;
  std::unique_ptr<dist::Communicator> own_comm_;  // the single-worker pass-through
  dist::Communicator* comm_ = nullptr;
  std::string config_text_;
  TrainOptions train_;
  DataOptions data_;
  CheckpointOptions ckpt_;
  DistributedOptions dist_;
  nn::ModulePtr model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<optim::ModelEma> ema_;
  nn::ModulePtr ema_model_;                     // evaluates the EMA weights
  std::unique_ptr<optim::LossScaler> scaler_;   // fp16 only
  std::unique_ptr<dist::OptimizerSharding> sharding_;  // distributed.shard_optimizer
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<UpdateStats> stats_;
  // train.cuda_graph: whether to capture, the eager updates so far, and the captured step.
  bool graph_wanted_ = false;
  int64_t eager_updates_ = 0;
  std::unique_ptr<GraphedStep> graphed_;
  std::unique_ptr<RunOutput> output_;
  std::unique_ptr<data::Dataset> train_set_, eval_set_;
  std::unique_ptr<data::DataLoader> train_loader_, eval_loader_;
  std::unique_ptr<data::BatchSource> train_batches_;  // train_loader_'s batches on the device
  std::unique_ptr<CheckpointManager> checkpoints_;
  Generator rng_;  // the trainer's own stream (kept in checkpoints)
  TrainState state_;
  int64_t steps_per_epoch_ = 0;
  // What read_update_stats has read: this epoch's and this log window's applied updates.
  struct LossSums {
    double loss_sum = 0.0;
    int64_t applied = 0;
    double mean() const { return applied ? loss_sum / static_cast<double>(applied) : NAN; }
  };
  LossSums epoch_loss_, window_loss_;
  int64_t stats_read_step_ = 0;  // state_.step at the last read
  int64_t last_saved_step_ = -1;
  bool logged_state_bytes_ = false;
};

// The folder a new run writes to: <parent>/<config name>-<YYYYmmdd-HHMMSS> (created).
std::string make_run_dir(const std::string& parent, const std::string& config_name);
// The newest run folder <parent>/<config name>-* holding a complete checkpoint; "" when none.
std::string find_latest_run(const std::string& parent, const std::string& config_name);

// The seed of a worker's own random streams (dropout, drop path): `seed` itself for rank 0, so
// that one worker draws what a single process draws, and a distinct mix of both otherwise.
uint64_t rank_seed(uint64_t seed, int rank);

}  // namespace ska::train
