// The device-resident batch's crop-and-flip kernel (cuda/kernels/augment.cu) on host memory, run
// by tests/simt (tests/simt/augment_host.cpp builds the kernel file for the host), launched as
// augment_crop_flip launches it: out [B, C, Ho, Wo] from images [N, H, W, C] (u8) at index [B].
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"

namespace ska::simt::augment {

template <typename T>
void crop_flip(const uint8_t* images, int64_t n, int64_t h, int64_t w, int64_t c,
               const int64_t* index, int64_t batch, int64_t ho, int64_t wo, const CropFlipParams& p,
               T* out);

}  // namespace ska::simt::augment
