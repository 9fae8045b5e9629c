// Packing augmented uint8 images into the normalised float32 [B, C, H, W] batch.
#include "data/transforms/transform.h"

#include <cstdint>

#include "core/error.h"
#include "core/simd_clones.h"

namespace ska::data {

namespace {

// HWC RGB bytes to three normalised f32 planes (out: R, then G, then B, `plane` floats each):
// v * scale + shift per channel, a multiply and an add each (this file is compiled without
// contraction into FMAs, so every ISA of the clones gives the baseline's bits).
SKA_CPU_SIMD_CLONES
void normalise_rgb(const uint8_t* px, size_t plane, const float* scale, const float* shift,
                   float* out) {
  float* r = out;
  float* g = out + plane;
  float* b = out + 2 * plane;
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
  const float t0 = shift[0], t1 = shift[1], t2 = shift[2];
  for (size_t p = 0; p < plane; ++p) {
    r[p] = px[3 * p] * s0 + t0;
    g[p] = px[3 * p + 1] * s1 + t1;
    b[p] = px[3 * p + 2] * s2 + t2;
  }
}

}  // namespace

Tensor to_normalized_batch(const std::vector<Image>& images, const std::vector<double>& mean,
                           const std::vector<double>& std) {
  SKA_CHECK(!images.empty(), ValueError, "to_normalized_batch: no images");
  const int h = images[0].height, w = images[0].width, c = images[0].channels;
  SKA_CHECK(mean.size() == static_cast<size_t>(c) && std.size() == static_cast<size_t>(c),
            ValueError, "to_normalized_batch: mean and std need ", c, " values, got ", mean.size(),
            " and ", std.size());
  std::vector<float> scale(c), shift(c);
  for (int k = 0; k < c; ++k) {
    SKA_CHECK(std[k] > 0, ValueError, "to_normalized_batch: std must be > 0");
    scale[k] = static_cast<float>(1.0 / (255.0 * std[k]));
    shift[k] = static_cast<float>(-mean[k] / std[k]);
  }
  const int64_t b = static_cast<int64_t>(images.size());
  Tensor out = Tensor::empty(Shape{b, c, h, w}, DType::kF32);
  float* dst = out.data<float>();
  const size_t plane = static_cast<size_t>(h) * w;
  for (int64_t n = 0; n < b; ++n) {
    const Image& im = images[n];
    SKA_CHECK(im.height == h && im.width == w && im.channels == c && im.pixels.size() == plane * c,
              ValueError, "to_normalized_batch: image ", n, " is ", im.height, "x", im.width, "x",
              im.channels, ", expected ", h, "x", w, "x", c);
    float* base = dst + static_cast<size_t>(n) * c * plane;
    if (c == 3) {
      normalise_rgb(im.pixels.data(), plane, scale.data(), shift.data(), base);
      continue;
    }
    for (size_t p = 0; p < plane; ++p) {
      for (int k = 0; k < c; ++k) base[k * plane + p] = im.pixels[p * c + k] * scale[k] + shift[k];
    }
  }
  return out;
}

}  // namespace ska::data
