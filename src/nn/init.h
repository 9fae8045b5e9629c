// Parameter initialisers with the semantics of PyTorch's and timm's (drawn from a Generator on
// the host, so a seed reproduces a model exactly on any device).
#pragma once

#include <cstdint>

#include "core/random.h"
#include "core/tensor.h"

namespace ska::nn {

// The generator initialisers draw from unless one is given: the host default generator.
Generator& init_generator();

Tensor init_uniform(const Shape& shape, double lo, double hi, Generator* gen = nullptr);
Tensor init_normal(const Shape& shape, double mean, double std, Generator* gen = nullptr);
// timm's trunc_normal_: N(0, std) truncated to the absolute interval [lo, hi] (resampling).
Tensor init_trunc_normal(const Shape& shape, double std, double lo = -2.0, double hi = 2.0,
                         Generator* gen = nullptr);
// PyTorch's default for nn.Linear / nn.Conv2d weights: kaiming_uniform(a = sqrt(5)), i.e.
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the same bound for their biases.
Tensor init_torch_default(const Shape& shape, int64_t fan_in, Generator* gen = nullptr);

// How a layer's weights start (per family: MetaFormer/CvT trunc_normal, ViT/Swin PyTorch default).
enum class Init { kTorchDefault, kTruncNormal };

}  // namespace ska::nn
