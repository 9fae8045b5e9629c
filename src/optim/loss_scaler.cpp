// Dynamic loss scaling (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <cmath>

#include "core/error.h"
#include "ops/pointwise.h"
#include "optim/grad_utils.h"

namespace ska::optim {

namespace {

double as_f32(double v) { return static_cast<double>(static_cast<float>(v)); }

}  // namespace

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  SKA_CHECK(options_.growth_factor > 1.0, ValueError,
            "loss scaler: growth_factor must be > 1, got ", options_.growth_factor);
  SKA_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0, ValueError,
            "loss scaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  SKA_CHECK(options_.growth_interval >= 1, ValueError,
            "loss scaler: growth_interval must be >= 1, got ", options_.growth_interval);
  load(options_.init_scale, 0);
}

Tensor LossScaler::scale(const Tensor& loss) const { return mul(loss, scale_); }

Tensor LossScaler::unscale_and_check(const TensorList& params) const {
  return unscale_grads_nonfinite(params, inv_scale());
}

double LossScaler::inv_scale() const { return as_f32(1.0 / scale_); }

void LossScaler::update(bool found_nonfinite) {
  if (found_nonfinite) {
    scale_ = as_f32(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  const double grown = as_f32(scale_ * options_.growth_factor);
  if (std::isfinite(grown)) scale_ = grown;
  growth_tracker_ = 0;
}

void LossScaler::load(double scale, int64_t growth_tracker) {
  SKA_CHECK(std::isfinite(as_f32(scale)) && scale > 0.0 && as_f32(scale) == scale, ValueError,
            "loss scaler: scale must be a positive finite f32 number, got ", scale);
  SKA_CHECK(growth_tracker >= 0 && growth_tracker < options_.growth_interval, ValueError,
            "loss scaler: growth tracker must be in [0, ", options_.growth_interval, "), got ",
            growth_tracker);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace ska::optim
