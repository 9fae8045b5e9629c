// The parameter-free MetaFormer baseline mixers: `pooling` (PoolFormer's avgpool(x) - x, padding
// not counted) and `identity`.
#pragma once

#include <cstdint>

#include "nn/mixers/mixer.h"
#include "nn/module.h"

namespace ska::nn {

// x [B, N, C] on a grid without class token -> avg_pool_kxk(x) - x, stride 1, "same" padding,
// averaging only over the positions inside the image (count_include_pad = False).
class Pooling : public Module {
 public:
  Pooling(const TokenGrid& grid, int64_t pool_size);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Pooling"; }

 private:
  TokenGrid grid_;
  int64_t pool_size_;
};

}  // namespace ska::nn
