// The evaluation-time image preprocessing (timm's eval transform): decode, resize the shorter side
// to image_size / crop_pct, centre-crop image_size, scale to [0, 1], normalise, CHW float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace ska::data {

enum class Interpolation { kBilinear, kBicubic };

struct EvalTransform {
  int64_t image_size = 224;
  int64_t channels = 3;      // 1: decoded as grey; 3: RGB (grey files replicated)
  std::vector<double> mean;  // one per channel
  std::vector<double> std;
  double crop_pct = 0.875;
  Interpolation interpolation = Interpolation::kBicubic;
};

// Reads the optional keys of a config's `data:` map (a null node gives every default):
//   mean, std:      lists of 1 or `channels` values; default ImageNet's for images > 64 pixels,
//                   the paper's CIFAR recipe's otherwise; 1-channel models get their average.
//   crop_pct:       (0, 1]; default 0.875 for images > 64 pixels, 1.0 otherwise.
//   interpolation:  bicubic | bilinear; default bicubic.
// Only 1- and 3-channel models can take images (ConfigError otherwise).
EvalTransform read_eval_transform(const ConfigNode& data, int64_t image_size, int64_t channels);

// The side the shorter image side is resized to: floor(image_size / crop_pct), as timm.
int64_t eval_resize_size(const EvalTransform& t);

// Decodes an image file (JPEG, PNG; with OpenCV also BMP, PNM, TIFF, WebP: decode_image_rgb) and
// returns the preprocessed [channels, image_size, image_size] float32 tensor, equal to timm's eval
// transform on the Pillow image. IOError naming the file when it cannot be read or decoded.
Tensor load_eval_image(const std::string& path, const EvalTransform& t);

// The same preprocessing for pixels already in memory: `pixels` is [height, width, channels]
// uint8 (RGB order, or grey when channels == 1), row-major. Resizing and cropping are Pillow's
// (antialiased bilinear or bicubic; crop offsets rounded half to even, as torchvision's).
Tensor preprocess_pixels(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels,
                         const EvalTransform& t);

}  // namespace ska::data
