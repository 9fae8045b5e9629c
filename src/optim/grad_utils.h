// Gradient utilities for the training step: zeroing, global-norm and value clipping, and a
// non-finite flag. Results stay on the grads' device (no host sync unless the caller reads them).
#pragma once

#include "core/tensor.h"

namespace ska::optim {

// Drops every grad (set_to_none) or fills it with zeros.
void zero_grad(const TensorList& params, bool set_to_none = true);

// The L2 norm of all grads together (parameters without a grad are skipped), as a one-element
// tensor on their device: f64 when the first grad is f64, else f32. Zero (CPU f32) when no
// parameter has a grad. All grads must be on one device.
Tensor grad_norm(const TensorList& params);

// torch.nn.utils.clip_grad_norm_: grads *= min(max_norm / (norm + 1e-6), 1) in place. Returns the
// norm before clipping (grad_norm). A non-finite norm makes the grads non-finite too, as in
// PyTorch; check grads_nonfinite / the returned norm to skip such steps.
Tensor clip_grad_norm(const TensorList& params, double max_norm);

// torch.nn.utils.clip_grad_value_: every grad element clamped to [-clip_value, clip_value].
void clip_grad_value(const TensorList& params, double clip_value);

// u8 0/1 of x's shape, on its device: 1 where x is inf or NaN (x * 0 is NaN exactly there).
Tensor nonfinite_flag(const Tensor& x);

// A u8 one-element tensor on the grads' device: 1 when any grad element is inf or NaN, else 0.
Tensor grads_nonfinite(const TensorList& params);

// Loss-scaling's unscale step fused with the check above, in one sweep over the grads: every
// grad is multiplied in place by inv_scale, and the flag of the results is returned.
Tensor unscale_grads_nonfinite(const TensorList& params, double inv_scale);

// What the training step does to the grads before the optimizer, in one sweep and one more when
// clipping: unscale (inv_scale; 1 for none), the non-finite flag, and with max_norm > 0
// clip_grad_norm. Returns the u8 flag (one element on the grads' device): non-finite grads, or
// with clipping a non-finite norm (the update is to be skipped).
Tensor unscale_check_clip(const TensorList& params, double inv_scale, double max_norm);

}  // namespace ska::optim
