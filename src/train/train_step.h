// The training step as a small engine with two seams: a micro-step (forward and loss under
// autocast, backward, and on the update's last micro-step the gradient all-reduce across
// workers, overlapped with backward) and the update (non-finite check agreed by every worker,
// loss-scale update, clipping, optimizer, EMA). Nothing in it reads a value back to the host
// (fp16's loss scale aside, as PyTorch's GradScaler): the losses and the decision to skip an
// update stay on the device, and the caller reads them when it logs.
#pragma once

#include <cstdint>
#include <memory>

#include "distributed/communicator.h"
#include "distributed/optimizer_sharding.h"
#include "distributed/reducer.h"
#include "nn/module.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/options.h"

namespace ska::train {

// One update's results, on the device.
struct UpdateOutcome {
  Tensor loss;  // f32, one element: the mean loss over the micro-batches and the workers
  Tensor skip;  // u8, one element: 1 when the update was skipped (non-finite loss or gradients)
};

class TrainStep {
 public:
  // Everything is borrowed and must outlive the step; `scaler` (fp16), `ema` and `sharding`
  // (distributed.shard_optimizer) may be null. With more than one worker `comm` synchronises
  // gradients (distributed.bucket_mb, distributed.reduce_dtype) and the skip decision.
  TrainStep(nn::Module& model, optim::Optimizer& optimizer, optim::LossScaler* scaler,
            optim::ModelEma* ema, dist::Communicator& comm, const TrainOptions& train,
            const DistributedOptions& distributed, dist::OptimizerSharding* sharding = nullptr);

  // One micro-batch: forward on `images`, cross-entropy against `target` (class indices, or soft
  // targets, which carry their own smoothing), backward of loss / accumulate. `last`: the
  // update's last micro-batch. Returns the micro-batch's loss on this worker (f32, one element,
  // on the device, detached).
  Tensor micro_step(const Tensor& images, const Tensor& target, bool last);
  // The update after `accumulate` micro-steps whose losses summed to `local_loss_sum` (as
  // micro_step returns them); at learning rate `lr` unless skipped. Every worker reaches the
  // same decision.
  UpdateOutcome apply_update(const Tensor& local_loss_sum, double lr);

  const TensorList& params() const { return params_; }

 private:
  nn::Module& model_;
  optim::Optimizer& optimizer_;
  optim::LossScaler* scaler_;
  optim::ModelEma* ema_;
  dist::Communicator& comm_;
  dist::OptimizerSharding* sharding_;
  TrainOptions train_;
  TensorList params_;
  Device device_;  // the parameters': where the loss, the flags and the optimizer state live
  std::unique_ptr<dist::GradReducer> reducer_;  // null for one worker
};

// The running statistics of the updates (loss, applied and skipped updates, runs of skipped
// ones), accumulated on the device one update at a time and read back by the caller when it
// logs: the only place the training loop waits for the device.
class UpdateStats {
 public:
  explicit UpdateStats(Device device);

  // Adds one update's outcome; no host synchronisation.
  void record(const UpdateOutcome& outcome);

  struct Window {
    double loss_sum = 0.0;        // over the applied updates
    int64_t applied = 0, skipped = 0;
    int64_t longest_skip_run = 0;  // the longest run of consecutive skipped updates so far
  };
  // The statistics since the previous read (a host synchronisation); a run of skipped updates
  // carries over to the next window.
  Window read();

 private:
  Tensor stats_;  // f32 [5] on the device, see record_update in backend/kernels.inc
};

}  // namespace ska::train
