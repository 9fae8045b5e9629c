// Differentiable indexing along a dim: index_select and gather (relative position bias tables).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ska {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index: 1-D i64
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);        // torch.gather

}  // namespace ska
