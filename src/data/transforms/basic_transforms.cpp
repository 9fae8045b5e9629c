// Crop, flip, pad-and-replicate, random resized crop and colour jitter.
#include "data/transforms/basic_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace ska::data {

RandomCrop::RandomCrop(int size, int padding, uint8_t fill)
    : size_(size), padding_(padding), fill_(fill) {
  SKA_CHECK(size > 0 && padding >= 0, ValueError, "RandomCrop: size must be > 0 and padding >= 0");
}

void RandomCrop::apply(Image& image, SampleRng& rng) const {
  if (padding_ > 0) image_pad(image, padding_, padding_, padding_, padding_, fill_);
  SKA_CHECK(image.height >= size_ && image.width >= size_, ValueError, "RandomCrop: a ",
            image.height, "x", image.width, " image is smaller than the crop ", size_);
  const int top = rng.randint(0, image.height - size_);
  const int left = rng.randint(0, image.width - size_);
  image_crop(image, top, left, size_, size_);
}

CenterCrop::CenterCrop(int size) : size_(size) {
  SKA_CHECK(size > 0, ValueError, "CenterCrop: size must be > 0");
}

void CenterCrop::apply(Image& image, SampleRng&) const {
  SKA_CHECK(image.height >= size_ && image.width >= size_, ValueError, "CenterCrop: a ",
            image.height, "x", image.width, " image is smaller than the crop ", size_);
  const int top = static_cast<int>(std::lround((image.height - size_) / 2.0));
  const int left = static_cast<int>(std::lround((image.width - size_) / 2.0));
  image_crop(image, top, left, size_, size_);
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  SKA_CHECK(p >= 0.0 && p <= 1.0, ValueError, "RandomHorizontalFlip: p must be in [0, 1]");
}

void RandomHorizontalFlip::apply(Image& image, SampleRng& rng) const {
  if (rng.uniform() < p_) image_hflip(image);
}

PadReplicate::PadReplicate(int size, int channels) : size_(size), channels_(channels) {
  SKA_CHECK(size > 0 && channels > 0, ValueError, "PadReplicate: size and channels must be > 0");
}

void PadReplicate::apply(Image& image, SampleRng&) const {
  const int dy = size_ - image.height, dx = size_ - image.width;
  SKA_CHECK(dy >= 0 && dx >= 0 && dy % 2 == 0 && dx % 2 == 0, ValueError, "PadReplicate: a ",
            image.height, "x", image.width, " image cannot be padded evenly to ", size_);
  image_pad(image, dy / 2, dy / 2, dx / 2, dx / 2, 0);
  if (image.channels == channels_) return;
  SKA_CHECK(image.channels == 1, ValueError, "PadReplicate: cannot replicate ", image.channels,
            " channels to ", channels_);
  std::vector<uint8_t> out(image.pixels.size() * channels_);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    std::fill_n(&out[i * channels_], channels_, image.pixels[i]);
  }
  image.pixels.swap(out);
  image.channels = channels_;
}

CropBox random_resized_crop_box(int height, int width, std::array<double, 2> scale,
                                std::array<double, 2> ratio, SampleRng& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox box{0, 0, h, w};
      box.top = rng.randint(0, height - h);
      box.left = rng.randint(0, width - w);
      return box;
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  CropBox box{0, 0, height, width};
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    box.height = static_cast<int>(std::lround(width / std::min(ratio[0], ratio[1])));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    box.width = static_cast<int>(std::lround(height * std::max(ratio[0], ratio[1])));
  }
  box.top = (height - box.height) / 2;
  box.left = (width - box.width) / 2;
  return box;
}

RandomResizedCrop::RandomResizedCrop(int size, std::array<double, 2> scale,
                                     std::array<double, 2> ratio, Resample resample)
    : size_(size), scale_(scale), ratio_(ratio), resample_(resample) {
  SKA_CHECK(
      size > 0 && scale[0] > 0 && scale[0] <= scale[1] && ratio[0] > 0 && ratio[0] <= ratio[1],
      ValueError, "RandomResizedCrop: needs size > 0, 0 < scale lo <= hi, 0 < ratio lo <= hi");
}

void RandomResizedCrop::apply(Image& image, SampleRng& rng) const {
  const CropBox box = random_resized_crop_box(image.height, image.width, scale_, ratio_, rng);
  image_resized_crop(image, box.top, box.left, box.height, box.width, size_, size_, resample_);
}

CropBox RandomResizedCrop::draw_window(int height, int width, SampleRng& rng) const {
  return random_resized_crop_box(height, width, scale_, ratio_, rng);
}

void RandomResizedCrop::apply_to_window(Image& window, SampleRng&) const {
  image_resized_crop(window, 0, 0, window.height, window.width, size_, size_, resample_);
}

ColorJitter::ColorJitter(double brightness, double contrast, double saturation)
    : brightness_(brightness), contrast_(contrast), saturation_(saturation) {
  SKA_CHECK(brightness >= 0 && contrast >= 0 && saturation >= 0, ValueError,
            "ColorJitter: strengths must be >= 0");
}

void ColorJitter::apply(Image& image, SampleRng& rng) const {
  // The order first (a random permutation), then the factors, as torchvision's get_params.
  std::array<int, 3> order{0, 1, 2};
  for (int i = 2; i > 0; --i) std::swap(order[i], order[rng.randint(0, i)]);
  const double strength[3] = {brightness_, contrast_, saturation_};
  double factor[3] = {1.0, 1.0, 1.0};
  for (int k = 0; k < 3; ++k) {
    if (strength[k] > 0)
      factor[k] = rng.uniform(std::max(0.0, 1.0 - strength[k]), 1.0 + strength[k]);
  }
  for (int k : order) {
    if (strength[k] <= 0) continue;
    if (k == 0) image_brightness(image, factor[0]);
    if (k == 1) image_contrast(image, factor[1]);
    if (k == 2 && image.channels == 3) image_color(image, factor[2]);
  }
}

}  // namespace ska::data
