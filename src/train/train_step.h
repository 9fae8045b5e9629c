// The training step as a small engine with two seams: a micro-step (forward and loss under
// autocast, backward, and on the update's last micro-step the gradient all-reduce across
// workers, overlapped with backward) and the update (non-finite check agreed by every worker,
// loss-scale update, clipping, optimizer, EMA).
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

struct UpdateOutcome {
  bool applied = false;  // false: skipped for a non-finite loss or gradient
  double loss = 0.0;     // the update's mean loss over micro-batches and workers
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
  // update's last micro-batch. Returns the micro-batch's loss on this worker.
  double micro_step(const Tensor& images, const Tensor& target, bool last);
  // The update after `accumulate` micro-steps whose losses summed to `local_loss_sum`; at
  // learning rate `lr` when applied. Every worker reaches the same decision.
  UpdateOutcome apply_update(double local_loss_sum, double lr);

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
  std::unique_ptr<dist::GradReducer> reducer_;  // null for one worker
};

}  // namespace ska::train
