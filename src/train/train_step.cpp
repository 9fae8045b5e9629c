// The micro-step and the update (see train_step.h).
#include "train/train_step.h"

#include <cmath>
#include <optional>

#include "autograd/grad_mode.h"
#include "backend/backend.h"
#include "ops/autocast.h"
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
      params_(model.parameters(true)),
      device_(params_.empty() ? Device::cpu() : params_.front().device()) {
  if (comm.backend() != "single") {  // several workers, or one forced through Gloo / NCCL
    dist::ReducerOptions ro;
    ro.bucket_mb = distributed.bucket_mb;
    ro.reduce_dtype = distributed.reduce_dtype;
    reducer_ = std::make_unique<dist::GradReducer>(params_, comm, ro);
  }
}

Tensor TrainStep::micro_step(const Tensor& images, const Tensor& target, bool last) {
  const AutocastState autocast_state = train_.autocast();
  // Forward and loss under autocast (train.precision); backward runs outside it.
  std::optional<AutocastGuard> autocast(std::in_place, autocast_state.dtype,
                                        autocast_state.enabled);
  std::optional<AutocastParamCasts> param_casts;
  if (autocast_state.enabled && train_.kernels.weight_casts == "per_step") {
    param_casts.emplace(params_);
  }
  const Tensor logits = model_(images);
  const bool soft = target.dtype() != DType::kI64;
  const Tensor loss = cross_entropy(logits, target, soft ? 0.0 : train_.label_smoothing);
  param_casts.reset();
  autocast.reset();
  const Tensor value = loss.detach().to(DType::kF32);
  const Tensor objective =
      train_.accumulate > 1 ? mul(loss, 1.0 / static_cast<double>(train_.accumulate)) : loss;
  if (reducer_) reducer_->prepare(last);
  (scaler_ ? scaler_->scale(objective) : objective).backward();
  if (reducer_ && last) reducer_->finish();
  return value;
}

UpdateOutcome TrainStep::apply_update(const Tensor& local_loss_sum, double lr) {
  NoGradGuard no_grad;
  UpdateOutcome out;
  Tensor loss_sum = local_loss_sum.to(device_);
  if (reducer_) {  // a NaN on any worker makes the sum NaN on every worker
    Tensor t = loss_sum.to(comm_.device()).clone();
    comm_.all_reduce(t, dist::ReduceOp::kAverage);
    loss_sum = t.to(device_);
  }
  out.loss = mul(loss_sum, 1.0 / static_cast<double>(train_.accumulate));
  // The gradients are identical on every worker after the all-reduce, so are these checks. The
  // flags are u8 tensors on the device; `either` joins two of them without reading either.
  const auto either = [](const Tensor& a, const Tensor& b) { return where(a, a, b); };
  // One sweep over the grads: fp16's unscale, the check, the norm; a second one clips.
  const Tensor grads_flag = optim::unscale_check_clip(params_, scaler_ ? scaler_->inv_scale() : 1.0,
                                                      train_.clip_grad);
  const Tensor skip = either(optim::nonfinite_flag(loss_sum), grads_flag.to(device_)).reshape({});
  // The loss scale is a host number: fp16 reads the flag here, as GradScaler does.
  if (scaler_) scaler_->update(skip.item() != 0.0);
  optimizer_.set_lr(lr);
  if (sharding_) sharding_->before_step(optimizer_);  // this worker updates its share only
  optimizer_.step(skip);
  optimizer_.zero_grad();
  if (sharding_) sharding_->after_step();  // ... and receives the others' from them
  if (ema_) ema_->update(model_, skip);
  out.skip = skip;
  return out;
}

UpdateStats::UpdateStats(Device device) : stats_(Tensor::zeros({5}, DType::kF32, device)) {}

void UpdateStats::record(const UpdateOutcome& outcome) {
  SKA_KERNEL(stats_.device(), record_update)(stats_, outcome.loss.to(DType::kF32), outcome.skip);
}

UpdateStats::Window UpdateStats::read() {
  const std::vector<float> v = stats_.to_vector<float>();
  stats_.narrow(0, 0, 3).fill_(0.0);  // the window's sums; the runs carry over
  Window w;
  w.loss_sum = v[0];
  w.applied = static_cast<int64_t>(v[1]);
  w.skipped = static_cast<int64_t>(v[2]);
  w.longest_skip_run = static_cast<int64_t>(v[4]);
  return w;
}

}  // namespace ska::train
