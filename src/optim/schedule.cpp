// Learning-rate schedules: timm's cosine / step formulas re-derived as pure functions of t.
#include "optim/schedule.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace ska::optim {

LrSchedule::LrSchedule(const ScheduleOptions& options) : options_(options) {
  SKA_CHECK(options.name == "cosine" || options.name == "step" || options.name == "constant",
            ValueError, "unknown schedule '", options.name, "'; known: constant, cosine, step");
  SKA_CHECK(options.epochs > 0, ValueError, "schedule: epochs must be > 0, got ", options.epochs);
  SKA_CHECK(options.warmup_epochs >= 0 && options.cooldown_epochs >= 0, ValueError,
            "schedule: warmup_epochs and cooldown_epochs must be >= 0");
  SKA_CHECK(options.step_size > 0, ValueError, "schedule: step_size must be > 0");
}

double LrSchedule::lr(int64_t epoch, int64_t step_in_epoch, int64_t steps_per_epoch) const {
  if (!options_.per_step) return lr_at(epoch, 1);
  SKA_CHECK(steps_per_epoch > 0, ValueError, "per-step schedule needs steps_per_epoch > 0");
  return lr_at(epoch * steps_per_epoch + step_in_epoch, steps_per_epoch);
}

double LrSchedule::lr_at(int64_t t, int64_t steps_per_epoch) const {
  const ScheduleOptions& o = options_;
  const int64_t unit = o.per_step ? steps_per_epoch : 1;
  const int64_t warmup_t = o.warmup_epochs * unit;
  if (t < warmup_t) {
    return o.warmup_lr +
           static_cast<double>(t) * (o.base_lr - o.warmup_lr) / static_cast<double>(warmup_t);
  }
  if (o.name == "constant") return o.base_lr;
  if (o.name == "step") {
    return o.base_lr * std::pow(o.gamma, static_cast<double>(t / (o.step_size * unit)));
  }
  // Cosine over [0, t_initial) counted from t = 0 (warmup_prefix off), then min_lr for good.
  const int64_t t_initial = o.epochs * unit;
  if (t >= t_initial) return o.min_lr;
  const double progress = static_cast<double>(t) / static_cast<double>(t_initial);
  return o.min_lr + 0.5 * (o.base_lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace ska::optim
