// Losses. Cross-entropy is fused with log-softmax and supports label smoothing and soft targets.
#pragma once

#include "core/tensor.h"

namespace ska {

// logits [N, C]; target i64 [N] (class indices) or floating [N, C] (soft targets, e.g. mixup).
// Returns the mean loss over the batch as a 0-d f32 tensor (f64 for f64 logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0);

}  // namespace ska
