// Normalisation ops: layer norm over the last dim and batch norm over channels.
#pragma once

#include <optional>

#include "core/random.h"
#include "core/tensor.h"

namespace ska {

// weight and bias [C] or undefined (the MetaFormer norms have no bias). `out_dtype`: the output's
// dtype, x's when undefined; an f32 x (after autocast's cast) may ask for bf16 or f16, the f32
// result rounded once, so the same bits as casting the f32 output after, without writing and
// reading it in f32 (nn::LayerNorm asks so under autocast when only matrix products read it, which
// would cast it anyway). The gradient then flows back in that dtype.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  std::optional<DType> out_dtype = std::nullopt);
// A pre-norm block's residual add and the layer norm after it: sum = x + y, normed =
// layer_norm(sum, weight, bias, eps, out_dtype), both differentiable, with the values (and the
// gradients) of add followed by layer_norm, bit for bit. Where it can, one kernel writes sum and
// normed, and in the backward pass one kernel adds the gradient reaching sum directly to the one
// through the norm and writes y's 16-bit copy of it: x, y of one shape, y of x's dtype or (f32 x)
// bf16/f16, the parameters of x's dtype, and no autocast cast needed; or,
// under autocast, a bf16/f16 x and y with f32 parameters (normalised as layer_norm normalises
// autocast's f32 copy of the sum; the output f32 unless out_dtype says otherwise). Otherwise it
// runs the two ops.
// y_drop > 0: the branch ends in a training dropout of that probability, sum = x +
// dropout(y, y_drop, true, gen): the same draws (generator offsets), values and gradients as the
// dropout op before the sum, bit for bit. The one kernel takes it in, without writing the dropped
// branch, where it takes the sum and x is f32, bf16 or f16 with rows of a multiple of 8 elements;
// otherwise the dropout op runs first. Pass 0 outside training.
// y_scale: undefined, or a per-channel factor of the branch ([C], C the last dim: CaiT's
// LayerScale), sum = x + dropout(y) * y_scale: the values and gradients of scaled_residual
// (ops/pointwise.h) followed by layer_norm, bit for bit, y_scale's gradient summed from the
// gradient reaching the sum as scaled_residual's kernels sum it (so the same bits as those ops on
// either device). The one kernel takes it in where y_scale has x's dtype (no 16-bit stream with
// f32 parameters) and x is not an f64 CUDA tensor; otherwise scaled_residual runs first.
struct ResidualNorm {
  Tensor sum;
  Tensor normed;
};
ResidualNorm add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                            const Tensor& bias, double eps = 1e-5,
                            std::optional<DType> out_dtype = std::nullopt, double y_drop = 0.0,
                            Generator* gen = nullptr, const Tensor& y_scale = Tensor());
// Layer norm over dim 1 of x [N, C, ...] (channels-first layout).
Tensor layer_norm_channels_first(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 double eps = 1e-6);
// x [N, C, ...]. In training, batch statistics are used and running_mean / running_var are updated
// in place (momentum as in PyTorch); in eval the running statistics are used. weight and bias in
// x's dtype, or f32 for a bf16/f16 x: the output is in x's dtype (under autocast, a 16-bit
// convolution's output is normalised as it is, with f32 parameters, as torch.autocast does).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);

}  // namespace ska
