// Reduced models of every family a shipped weight map serves (configs/weight_maps/*.yaml), for the
// weight-map tests: YAML with MIXER standing for the attention variant.
#pragma once

#include <string>

namespace ska::test {

// `text` with every "MIXER" replaced by `mixer`.
inline std::string with_mixer(std::string text, const std::string& mixer) {
  for (size_t at = text.find("MIXER"); at != std::string::npos; at = text.find("MIXER", at)) {
    text.replace(at, 5, mixer);
  }
  return text;
}

// A reduced MetaFormer with every mixer whose names the maps must carry.
inline const char* kSmallMetaFormer = R"(
family: metaformer
image_size: 32
in_channels: 3
num_classes: 5
depths: [1, 1, 1, 1]
dims: [8, 16, 32, 32]
mixers: [sepconv, cska, ska, mhsa]
mlp_ratio: 2
head_mlp_ratio: 2
)";

inline const char* kSmallVit = R"(
family: vit
image_size: 8
in_channels: 3
num_classes: 3
patch_size: 2
dim: 16
depth: 2
mlp_dim: 24
mixer: {type: MIXER, heads: 2, head_dim: 4}
)";

inline const char* kSmallCait = R"(
family: cait
image_size: 8
in_channels: 3
num_classes: 3
patch_size: 2
dim: 16
depth: 2
cls_depth: 2
heads: 2
head_dim: 4
mlp_dim: 24
mixer: MIXER
)";

// Two stages, the second with 4 blocks (layers.0 and layers.1 pairs on their side).
inline const char* kSmallSwin = R"(
family: swin
image_size: 16
in_channels: 3
num_classes: 3
mixer: MIXER
hidden_dim: 8
depths: [2, 4]
heads: [1, 2]
head_dim: 4
window_size: 2
downscaling_factors: [2, 2]
mlp_ratio: 2
)";

// CvT-13's shape in miniature: three stages, the class token in the last (stage 2).
inline const char* kSmallCvt = R"(
family: cvt
image_size: 16
in_channels: 3
num_classes: 3
mixers: [MIXER, MIXER, MIXER]
dims: [4, 6, 8]
heads: [1, 2, 2]
depths: [1, 1, 2]
kernels: [3, 3, 3]
strides: [2, 2, 2]
paddings: [1, 1, 1]
mlp_ratio: 2
)";

}  // namespace ska::test
