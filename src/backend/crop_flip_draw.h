// The per-sample draws of augment_crop_flip, shared by its CPU and CUDA kernels: the crop offset
// and flip of one sample, taken from the same Philox words as the host pipeline's SampleRng.
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"
#include "core/random.h"

namespace ska {

// The argument checks of both backends' augment_crop_flip (ValueError, ShapeError, DTypeError);
// sets the ranges of the crop offsets (padded size - output size).
void check_crop_flip_args(const Tensor& images, const Tensor& index, const CropFlipParams& p,
                          const Tensor& out, int64_t* range_y, int64_t* range_x);

struct CropFlipDraw {
  int64_t top = 0, left = 0;  // crop origin in the padded image
  bool flip = false;
};

// The host pipeline (data/transforms) runs RandomCrop then RandomHorizontalFlip on a
// SampleRng(seed, stream) with stream = (epoch << 40) ^ index: key seed ^ (stream * golden ratio),
// words of counter 0 in order. RandomCrop draws top then left as randint(0, range) =
// int(u * (range + 1)) with u the word's 24-bit uniform in double; the flip draws one more word
// and flips when u < p. A step that is off draws nothing. tests/train/test_device_resident.cpp
// checks that the results equal the host DataLoader's.
SKA_HOST_DEVICE CropFlipDraw crop_flip_draw(const CropFlipParams& p, uint64_t index,
                                            int64_t range_y, int64_t range_x) {
  const uint64_t stream = (p.epoch << 40) ^ index;
  const PhiloxOut r = philox4x32_10(p.seed ^ (stream * 0x9E3779B97F4A7C15ull), 0);
  CropFlipDraw d;
  int word = 0;
  if (p.padding > 0) {
    d.top = static_cast<int64_t>(static_cast<double>(philox_uniform(r.w[word++])) *
                                 static_cast<double>(range_y + 1));
    d.left = static_cast<int64_t>(static_cast<double>(philox_uniform(r.w[word++])) *
                                  static_cast<double>(range_x + 1));
  }
  if (p.flip_p > 0) d.flip = static_cast<double>(philox_uniform(r.w[word])) < p.flip_p;
  return d;
}

}  // namespace ska
