// Initialisers.
#include "nn/init.h"

#include <cmath>
#include <cstdint>

#include "ops/ops.h"

namespace ska::nn {

Generator& init_generator() { return default_generator(Device::cpu()); }

Tensor init_uniform(const Shape& shape, double lo, double hi, Generator* gen) {
  Generator& g = gen ? *gen : init_generator();
  return add(mul(rand(shape, DType::kF32, Device::cpu(), &g), hi - lo), lo);
}

Tensor init_normal(const Shape& shape, double mean, double std, Generator* gen) {
  Generator& g = gen ? *gen : init_generator();
  return add(mul(randn(shape, DType::kF32, Device::cpu(), &g), std), mean);
}

Tensor init_trunc_normal(const Shape& shape, double std, double lo, double hi, Generator* gen) {
  SKA_CHECK(lo < hi && std > 0, ValueError, "trunc_normal: need lo < hi and std > 0");
  Generator& g = gen ? *gen : init_generator();
  Tensor t = init_normal(shape, 0.0, std, &g).contiguous();
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    // Redraw outside the bounds (with timm's defaults and std 0.02 this essentially never runs).
    for (int tries = 0; (p[i] < lo || p[i] > hi) && tries < 1000; ++tries) {
      p[i] = static_cast<float>(init_normal({1}, 0.0, std, &g).item());
    }
  }
  return t;
}

Tensor init_torch_default(const Shape& shape, int64_t fan_in, Generator* gen) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  return init_uniform(shape, -bound, bound, gen);
}

}  // namespace ska::nn
