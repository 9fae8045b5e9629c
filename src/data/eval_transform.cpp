// The evaluation image transform (see eval_transform.h): decode, channel conversion, shorter-side
// resize and centre crop with Pillow's semantics (src/data/transforms/image_ops.h), and
// normalisation into a CHW float32 tensor.
#include "data/eval_transform.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "data/datasets/image_folder.h"
#include "data/transforms/image_ops.h"

namespace ska::data {
namespace {

// Above this size an image model is "ImageNet-like" for the defaults; at or below, "CIFAR-like".
constexpr int64_t kSmallImageMax = 64;
const std::vector<double> kImageNetMean = {0.485, 0.456, 0.406};
const std::vector<double> kImageNetStd = {0.229, 0.224, 0.225};
const std::vector<double> kCifarMean = {0.4914, 0.4822, 0.4465};  // the authors' CIFAR recipe
const std::vector<double> kCifarStd = {0.2023, 0.1994, 0.2010};

// `key` as `channels` values: the list given (1 value is broadcast) or the default.
std::vector<double> read_per_channel(const ConfigNode& data, const std::string& key,
                                     std::vector<double> fallback, int64_t channels) {
  if (channels == 1 && fallback.size() == 3) {
    fallback = {std::accumulate(fallback.begin(), fallback.end(), 0.0) / 3.0};
  }
  std::vector<double> values = data.get<std::vector<double>>(key, fallback);
  if (values.size() == 1) values.assign(channels, values[0]);
  if (static_cast<int64_t>(values.size()) != channels) {
    const std::string expected =
        channels == 1 ? "expected 1 value (one channel)"
                      : "expected 1 or " + std::to_string(channels) + " values (one per channel)";
    data.fail(key, expected + ", got " + std::to_string(values.size()));
  }
  if (key == "std" && std::any_of(values.begin(), values.end(), [](double v) { return v <= 0; })) {
    data.fail(key, "standard deviations must be positive");
  }
  return values;
}

// `image` with `channels` channels: grey replicated to RGB, or RGB to grey as Pillow's "L"
// conversion does (what timm's loader does for a 1-channel model: Image.convert("L")).
Image to_model_channels(Image image, int64_t channels) {
  if (image.channels == channels) return image;
  SKA_CHECK(image.channels == 1 || image.channels == 3, ValueError, "eval transform: images with ",
            image.channels, " channels are not supported (1 or 3)");
  const size_t pixels = static_cast<size_t>(image.height) * image.width;
  std::vector<uint8_t> out(pixels * static_cast<size_t>(channels));
  for (size_t p = 0; p < pixels; ++p) {
    if (channels == 3) {
      out[3 * p] = out[3 * p + 1] = out[3 * p + 2] = image.pixels[p];
    } else {
      const uint8_t* rgb = &image.pixels[3 * p];
      out[p] = grey_level(rgb[0], rgb[1], rgb[2]);
    }
  }
  image.pixels = std::move(out);
  image.channels = static_cast<int>(channels);
  return image;
}

// Shorter side to eval_resize_size, the longer one in proportion (torchvision's Resize(int)), with
// Pillow's antialiased filters.
void resize_shorter_side(Image& image, const EvalTransform& t) {
  const int64_t target = eval_resize_size(t);
  const int64_t h = image.height, w = image.width;
  const int64_t new_h = h <= w ? target : target * h / w;
  const int64_t new_w = h <= w ? target * w / h : target;
  if (new_h == h && new_w == w) return;
  image_resize(
      image, static_cast<int>(new_h), static_cast<int>(new_w),
      t.interpolation == Interpolation::kBicubic ? Resample::kBicubic : Resample::kBilinear);
}

// torchvision's CenterCrop: the offsets are Python's round((side - size) / 2), halves to even.
void centre_crop(Image& image, int64_t size) {
  SKA_CHECK(image.height >= size && image.width >= size, ValueError, "eval transform: a ",
            image.width, "x", image.height, " image cannot be centre-cropped to ", size, "x", size);
  const int top = static_cast<int>(std::nearbyint((image.height - size) / 2.0));
  const int left = static_cast<int>(std::nearbyint((image.width - size) / 2.0));
  image_crop(image, top, left, static_cast<int>(size), static_cast<int>(size));
}

// HWC uint8 -> CHW float32, scaled to [0, 1] and normalised per channel.
Tensor normalise_to_chw(const Image& image, const EvalTransform& t) {
  const int64_t c = t.channels, size = t.image_size;
  Tensor out = Tensor::empty({c, size, size}, DType::kF32);
  float* dst = out.data<float>();
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      for (int64_t ch = 0; ch < c; ++ch) {
        const double value =
            image.at(static_cast<int>(y), static_cast<int>(x), static_cast<int>(ch)) / 255.0;
        dst[(ch * size + y) * size + x] = static_cast<float>((value - t.mean[ch]) / t.std[ch]);
      }
    }
  }
  return out;
}

}  // namespace

EvalTransform read_eval_transform(const ConfigNode& data, int64_t image_size, int64_t channels) {
  SKA_CHECK(channels == 1 || channels == 3, ConfigError, data.path(),
            ": image inputs need a 1- or 3-channel model, this one has ", channels, " channels");
  const bool small = image_size <= kSmallImageMax;
  EvalTransform t;
  t.image_size = image_size;
  t.channels = channels;
  t.mean = read_per_channel(data, "mean", small ? kCifarMean : kImageNetMean, channels);
  t.std = read_per_channel(data, "std", small ? kCifarStd : kImageNetStd, channels);
  t.crop_pct = data.get_double_in("crop_pct", small ? 1.0 : 0.875, 1e-3, 1.0);
  t.interpolation =
      data.get_choice("interpolation", "bicubic", {"bicubic", "bilinear"}) == "bicubic"
          ? Interpolation::kBicubic
          : Interpolation::kBilinear;
  return t;
}

int64_t eval_resize_size(const EvalTransform& t) {
  return static_cast<int64_t>(std::floor(static_cast<double>(t.image_size) / t.crop_pct));
}

Tensor preprocess_pixels(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels,
                         const EvalTransform& t) {
  SKA_CHECK(height > 0 && width > 0, ValueError, "eval transform: empty image ", height, "x",
            width);
  SKA_CHECK(static_cast<int64_t>(t.mean.size()) == t.channels &&
                static_cast<int64_t>(t.std.size()) == t.channels,
            ValueError, "eval transform: mean/std need ", t.channels, " values");
  Image image;
  image.height = static_cast<int>(height);
  image.width = static_cast<int>(width);
  image.channels = static_cast<int>(channels);
  image.pixels.assign(pixels, pixels + height * width * channels);
  image = to_model_channels(std::move(image), t.channels);
  resize_shorter_side(image, t);
  centre_crop(image, t.image_size);
  return normalise_to_chw(image, t);
}

Tensor load_eval_image(const std::string& path, const EvalTransform& t) {
  const Tensor rgb = decode_image_rgb(path);
  return preprocess_pixels(rgb.data<uint8_t>(), rgb.size(0), rgb.size(1), 3, t);
}

}  // namespace ska::data
