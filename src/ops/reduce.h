// Differentiable reductions (sum, mean, max, min over chosen dims) and argmax / top-k (no grad).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ska {

// An empty `dims` reduces over every dim.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max / min values; the gradient is shared equally among tied maxima (as torch.amax).
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Sum of `x` over the dims that broadcasting added or expanded, so the result has `shape`.
// Used by backward passes of broadcasting ops.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);       // i64
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1);  // values, i64 indices

}  // namespace ska
