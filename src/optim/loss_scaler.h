// Dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's rule): the loss is
// multiplied by a scale before backward so that small f16 gradients do not flush to zero; the
// grads are unscaled together with the non-finite check; an overflow halves the scale and skips
// the update, and every `growth_interval` finite updates in a row double it.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ska::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// The scale is a host value (an f32 number, as PyTorch keeps it), so scaling and unscaling are
// scalar multiplies on the device and update() needs only the non-finite flag that the training
// step reads anyway: the scaler adds no host round trip.
class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // loss * scale (differentiable).
  Tensor scale(const Tensor& loss) const;
  // Divides every grad by the scale in place and returns the non-finite flag of the unscaled
  // grads (u8, one element on the grads' device: see grads_nonfinite).
  Tensor unscale_and_check(const TensorList& params) const;
  // 1 / scale rounded to f32: what unscaling multiplies the grads by.
  double inv_scale() const;
  // After an update decision: a non-finite step multiplies the scale by backoff_factor and resets
  // the count of finite steps; otherwise the count grows, and at growth_interval the scale is
  // multiplied by growth_factor (kept when that overflows f32) and the count restarts.
  void update(bool found_nonfinite);

  double scale_value() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // Restores a saved state; ValueError when scale is not a positive finite f32 number or
  // growth_tracker is outside [0, growth_interval).
  void load(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  double scale_;                // always exactly an f32 value
  int64_t growth_tracker_ = 0;  // finite updates since the last change of scale
};

}  // namespace ska::optim
