// The augmentation contract: a per-sample Transform acting on a host uint8 image with a
// deterministic per-sample random source, and batch-level transforms (mixup/cutmix) on tensors.
// Determinism: a sample's randomness depends only on (seed, epoch, dataset index), so a resumed
// run augments every sample exactly as the uninterrupted run would.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/random.h"
#include "core/tensor.h"
#include "data/image_window.h"

namespace ska::data {

// An image on the host: uint8, [height, width, channels] row-major (HWC), as datasets store them.
struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
  uint8_t& at(int y, int x, int c) { return pixels[(static_cast<size_t>(y) * width + x) * channels + c]; }
  uint8_t at(int y, int x, int c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * channels + c];
  }
};

// Counter-based random numbers for one sample: stream = hash(epoch, index); draws are Philox
// words taken in order, so the same (seed, stream) always gives the same augmentation.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t stream) : seed_(seed ^ (stream * 0x9E3779B97F4A7C15ull)) {}
  static uint64_t stream_of(uint64_t epoch, uint64_t index) { return (epoch << 40) ^ index; }
  uint32_t next_u32() {
    if (word_ == 4) {
      block_ = philox4x32_10(seed_, counter_++);
      word_ = 0;
    }
    return block_.w[word_++];
  }
  double uniform() { return philox_uniform(next_u32()); }            // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int randint(int lo, int hi) {                                      // [lo, hi] inclusive
    return lo + static_cast<int>(uniform() * (hi - lo + 1));
  }
  bool bernoulli(double p) { return uniform() < p; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  PhiloxOut block_{};
  int word_ = 4;
};

// A transform that begins by drawing a window from the image's size alone and then reads no pixel
// outside it (RandomResizedCrop, or a Compose that starts with one). The loader uses it to decode
// only the window (datasets/image_decode.h). The contract, tested bit for bit: for every image and
// random source, apply(image, rng) equals draw_window(height, width, rng), then
// apply_to_window(the window's pixels, rng), from the same random state.
class WindowFirst {
 public:
  virtual ~WindowFirst() = default;
  virtual CropBox draw_window(int height, int width, SampleRng& rng) const = 0;
  // `window` holds exactly the drawn box's pixels.
  virtual void apply_to_window(Image& window, SampleRng& rng) const = 0;
};

// One augmentation step applied to a single image (random crop, flip, RandAugment, ...).
class Transform {
 public:
  virtual ~Transform() = default;
  virtual void apply(Image& image, SampleRng& rng) const = 0;
  virtual std::string name() const = 0;
  // This transform as a WindowFirst one, or null when it reads the whole image.
  virtual const WindowFirst* window_first() const { return nullptr; }
};

// Applies transforms in order.
class Compose : public Transform, public WindowFirst {
 public:
  explicit Compose(std::vector<std::unique_ptr<Transform>> steps) : steps_(std::move(steps)) {}
  void apply(Image& image, SampleRng& rng) const override {
    for (const auto& t : steps_) t->apply(image, rng);
  }
  std::string name() const override { return "Compose"; }
  size_t size() const { return steps_.size(); }

  // A WindowFirst transform when the first step is one.
  const WindowFirst* window_first() const override {
    return !steps_.empty() && steps_.front()->window_first() != nullptr ? this : nullptr;
  }
  CropBox draw_window(int height, int width, SampleRng& rng) const override {
    return steps_.front()->window_first()->draw_window(height, width, rng);
  }
  void apply_to_window(Image& window, SampleRng& rng) const override {
    steps_.front()->window_first()->apply_to_window(window, rng);
    for (size_t i = 1; i < steps_.size(); ++i) steps_[i]->apply(window, rng);
  }

 private:
  std::vector<std::unique_ptr<Transform>> steps_;
};

// Packs images into a float32 [B, C, H, W] batch, scaled to [0, 1] and normalised per channel:
// (x / 255 - mean[c]) / std[c]. Images must share one size.
Tensor to_normalized_batch(const std::vector<Image>& images, const std::vector<double>& mean,
                           const std::vector<double>& std);

}  // namespace ska::data
