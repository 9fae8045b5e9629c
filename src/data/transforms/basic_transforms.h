// The geometric and colour training transforms of torchvision/timm on uint8 HWC images:
// RandomCrop, CenterCrop, RandomHorizontalFlip, PadReplicate, RandomResizedCrop, ColorJitter.
#pragma once

#include <array>
#include <cstdint>

#include "data/transforms/image_ops.h"
#include "data/transforms/transform.h"

namespace ska::data {

// torchvision RandomCrop(size, padding, fill): pad every side by `padding` with `fill`, then crop
// size x size at offsets (top, left) drawn uniformly from [0, padded - size] (top first).
class RandomCrop : public Transform {
 public:
  RandomCrop(int size, int padding, uint8_t fill = 0);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "RandomCrop"; }

 private:
  int size_, padding_;
  uint8_t fill_;
};

// torchvision CenterCrop(size): top = round((H - size) / 2), left likewise.
class CenterCrop : public Transform {
 public:
  explicit CenterCrop(int size);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "CenterCrop"; }

 private:
  int size_;
};

// torchvision RandomHorizontalFlip(p): one uniform draw, flip when it is < p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "RandomHorizontalFlip"; }

 private:
  double p_;
};

// Fashion-MNIST's layout: zero-pad equally to size x size (torchvision Pad((size - H) / 2)) and
// replicate a single channel to `channels`. ValueError when the padding is not even.
class PadReplicate : public Transform {
 public:
  PadReplicate(int size, int channels);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "PadReplicate"; }

 private:
  int size_, channels_;
};

// The crop window RandomResizedCrop draws (torchvision/timm get_params).
// Up to 10 attempts: area fraction ~ U(scale), log aspect ~ U(log ratio), w = round(sqrt(A r)),
// h = round(sqrt(A / r)); accepted when it fits, then top/left uniform. Otherwise the centre crop
// of the whole image clamped to the ratio range.
CropBox random_resized_crop_box(int height, int width, std::array<double, 2> scale,
                                std::array<double, 2> ratio, SampleRng& rng);

// timm RandomResizedCropAndInterpolation(size, scale, ratio, bicubic). It reads only the window it
// draws, so the loader decodes only that window (WindowFirst).
class RandomResizedCrop : public Transform, public WindowFirst {
 public:
  RandomResizedCrop(int size, std::array<double, 2> scale = {0.08, 1.0},
                    std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0},
                    Resample resample = Resample::kBicubic);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "RandomResizedCrop"; }
  const WindowFirst* window_first() const override { return this; }
  CropBox draw_window(int height, int width, SampleRng& rng) const override;
  void apply_to_window(Image& window, SampleRng& rng) const override;

 private:
  int size_;
  std::array<double, 2> scale_, ratio_;
  Resample resample_;
};

// torchvision ColorJitter(brightness, contrast, saturation) as timm builds it (hue 0): a random
// order of the three, each factor ~ U(max(0, 1 - v), 1 + v), applied with PIL's ImageEnhance.
class ColorJitter : public Transform {
 public:
  ColorJitter(double brightness, double contrast, double saturation);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "ColorJitter"; }

 private:
  double brightness_, contrast_, saturation_;
};

}  // namespace ska::data
