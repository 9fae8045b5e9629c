// The `sepconv` token mixer of ConvFormer/CAFormer: an inverted separable convolution
// (MobileNetV2): pointwise expand -> activation -> depthwise k x k -> pointwise project.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "nn/layers.h"
#include "nn/mixers/mixer.h"

namespace ska::nn {

struct SepConvOptions {
  double expansion_ratio = 2.0;
  int64_t kernel_size = 7;  // odd; padding keeps the grid ("same")
  std::string activation = "starrelu";
  bool bias = false;
  Init init = Init::kTruncNormal;

  static SepConvOptions from_config(const ConfigNode& cfg);
};

// x [B, N, C] on a grid without class token -> [B, N, C].
class SepConv : public Module {
 public:
  SepConv(int64_t dim, const TokenGrid& grid, const SepConvOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SepConv"; }
  bool reads_input_by_matmul_only() const override { return true; }  // pwconv1 first

 private:
  TokenGrid grid_;
  int64_t hidden_;
  std::shared_ptr<Linear> pwconv1_, pwconv2_;
  std::shared_ptr<Activation> act1_;
  std::shared_ptr<Conv2d> dwconv_;
};

}  // namespace ska::nn
