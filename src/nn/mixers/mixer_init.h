// How a token mixer initialises its Linear and Conv2d weights, by the family that hosts it:
// the MetaFormer and CvT references use trunc_normal(.02) with zero biases, the others PyTorch's.
#pragma once

#include <string>

#include "nn/init.h"

namespace ska::nn {

inline Init mixer_init_for(const std::string& family) {
  return family == "metaformer" || family == "cvt" ? Init::kTruncNormal : Init::kTorchDefault;
}

}  // namespace ska::nn
