// Learning-rate schedules as pure functions of the step: cosine (timm's CosineLRScheduler with
// cycle_limit 1, k_decay 1, warmup_prefix off) with linear warmup and cooldown at min_lr,
// step decay, and constant; stepped per epoch or per optimizer update.
#pragma once

#include <cstdint>
#include <string>

namespace ska {
class ConfigNode;
}

namespace ska::optim {

// What configures a schedule (the `sched:` section of a config, plus the optimizer's lr and the
// training length, which live elsewhere).
struct ScheduleOptions {
  std::string name = "cosine";  // cosine | step | constant
  double base_lr = 1e-3;
  int64_t epochs = 1;  // the decay length; cooldown comes after it
  int64_t warmup_epochs = 0;
  double warmup_lr = 0.0;       // lr at t = 0, rising linearly to base_lr at t = warmup
  double min_lr = 0.0;          // cosine: the floor, and the lr of the cooldown epochs
  int64_t cooldown_epochs = 0;  // trained at min_lr after `epochs`
  bool per_step = false;        // t counts optimizer updates instead of epochs
  int64_t step_size = 30;       // step: epochs between decays
  double gamma = 0.1;           // step: decay factor

  // Reads and range-checks `node` (the sched map); base_lr and epochs come from the caller.
  static ScheduleOptions from_config(const ConfigNode& node, double base_lr, int64_t epochs);
};

class LrSchedule {
 public:
  explicit LrSchedule(const ScheduleOptions& options);

  // The lr for update `step_in_epoch` of `epoch` (both from 0). Per-epoch schedules ignore the
  // step: t = epoch; per-step ones use t = epoch * steps_per_epoch + step_in_epoch with every
  // length in epochs multiplied by steps_per_epoch (timm's updates_per_epoch).
  double lr(int64_t epoch, int64_t step_in_epoch = 0, int64_t steps_per_epoch = 1) const;
  // The lr at t in units of the schedule (epochs, or updates with `steps_per_epoch`).
  double lr_at(int64_t t, int64_t steps_per_epoch = 1) const;
  // Epochs to train: epochs + cooldown_epochs.
  int64_t total_epochs() const { return options_.epochs + options_.cooldown_epochs; }
  const ScheduleOptions& options() const { return options_; }

 private:
  ScheduleOptions options_;
};

}  // namespace ska::optim
