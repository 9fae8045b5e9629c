// The micro-step and the update (see train_step.h).
#include "train/train_step.h"

#include <cmath>
#include <optional>

#include "ops/loss.h"
#include "ops/pointwise.h"
#include "optim/grad_utils.h"

namespace ska::train {

TrainStep::TrainStep(nn::Module& model, optim::Optimizer& optimizer, optim::LossScaler* scaler,
                     optim::ModelEma* ema, dist::Communicator& comm, const TrainOptions& train,
                     const DistributedOptions& distributed, dist::OptimizerSharding* sharding)
    : model_(model),
      optimizer_(optimizer),
      scaler_(scaler),
      ema_(ema),
      comm_(comm),
      sharding_(sharding),
      train_(train),
      params_(model.parameters(true)) {
  if (comm.backend() != "single") {  // several workers, or one forced through Gloo / NCCL
    dist::ReducerOptions ro;
    ro.bucket_mb = distributed.bucket_mb;
    ro.reduce_dtype = distributed.reduce_dtype;
    reducer_ = std::make_unique<dist::GradReducer>(params_, comm, ro);
  }
}

double TrainStep::micro_step(const Tensor& images, const Tensor& target, bool last) {
  const AutocastState autocast_state = train_.autocast();
  // Forward and loss under autocast (train.precision); backward runs outside it.
  std::optional<AutocastGuard> autocast(std::in_place, autocast_state.dtype,
                                        autocast_state.enabled);
  const Tensor logits = model_(images);
  const bool soft = target.dtype() != DType::kI64;
  const Tensor loss = cross_entropy(logits, target, soft ? 0.0 : train_.label_smoothing);
  autocast.reset();
  const double value = loss.item();
  const Tensor objective =
      train_.accumulate > 1 ? mul(loss, 1.0 / static_cast<double>(train_.accumulate)) : loss;
  if (reducer_) reducer_->prepare(last);
  (scaler_ ? scaler_->scale(objective) : objective).backward();
  if (reducer_ && last) reducer_->finish();
  return value;
}

UpdateOutcome TrainStep::apply_update(double local_loss_sum, double lr) {
  UpdateOutcome out;
  double loss_sum = local_loss_sum;
  if (reducer_) {  // a NaN on any worker makes the sum NaN on every worker
    Tensor t = Tensor::from_vector<double>({local_loss_sum}, {1}).to(comm_.device());
    comm_.all_reduce(t, dist::ReduceOp::kAverage);
    loss_sum = t.to_vector<double>()[0];
  }
  out.loss = loss_sum / static_cast<double>(train_.accumulate);
  // The gradients are identical on every worker after the all-reduce, so are these checks.
  bool nonfinite = !std::isfinite(loss_sum);
  if (!nonfinite) {
    // fp16: the grads are unscaled in the same sweep as the check (one host read either way).
    const Tensor flag =
        scaler_ ? scaler_->unscale_and_check(params_) : optim::grads_nonfinite(params_);
    nonfinite = flag.item() != 0.0;
  }
  if (!nonfinite && train_.clip_grad > 0) {
    nonfinite = !std::isfinite(optim::clip_grad_norm(params_, train_.clip_grad).item());
  }
  if (scaler_) scaler_->update(nonfinite);
  if (nonfinite) {
    optimizer_.zero_grad();
    return out;
  }
  optimizer_.set_lr(lr);
  if (sharding_) sharding_->before_step(optimizer_);  // this worker updates its share only
  optimizer_.step();
  optimizer_.zero_grad();
  if (sharding_) sharding_->after_step();  // ... and receives the others' from them
  if (ema_) ema_->update(model_);
  out.applied = true;
  return out;
}

}  // namespace ska::train
