// The evaluation image transform (see eval_transform.h), on OpenCV: decode, channel conversion,
// shorter-side resize, centre crop and normalisation into a CHW float32 tensor.
#include "data/eval_transform.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#ifdef SKA_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

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
    const std::string expected = channels == 1 ? "expected 1 value (one channel)"
                                               : "expected 1 or " + std::to_string(channels) +
                                                     " values (one per channel)";
    data.fail(key, expected + ", got " + std::to_string(values.size()));
  }
  if (key == "std" && std::any_of(values.begin(), values.end(), [](double v) { return v <= 0; })) {
    data.fail(key, "standard deviations must be positive");
  }
  return values;
}

#ifdef SKA_WITH_OPENCV
cv::Mat to_model_channels(const cv::Mat& image, int64_t channels) {
  if (image.channels() == channels) return image;
  cv::Mat converted;
  if (image.channels() == 1) {
    cv::cvtColor(image, converted, cv::COLOR_GRAY2RGB);
  } else if (image.channels() == 3) {
    cv::cvtColor(image, converted, cv::COLOR_RGB2GRAY);
  } else {
    SKA_FAIL(ValueError, "eval transform: images with ", image.channels(),
             " channels are not supported (1 or 3)");
  }
  return converted;
}

// Shorter side to eval_resize_size, the longer one in proportion (torchvision's Resize(int)).
cv::Mat resize_shorter_side(const cv::Mat& image, const EvalTransform& t) {
  const int64_t target = eval_resize_size(t);
  const int64_t h = image.rows, w = image.cols;
  const int64_t new_h = h <= w ? target : target * h / w;
  const int64_t new_w = h <= w ? target * w / h : target;
  if (new_h == h && new_w == w) return image;
  cv::Mat resized;
  const int mode = t.interpolation == Interpolation::kBicubic ? cv::INTER_CUBIC : cv::INTER_LINEAR;
  cv::resize(image, resized, cv::Size(static_cast<int>(new_w), static_cast<int>(new_h)), 0, 0,
             mode);
  return resized;
}

cv::Mat centre_crop(const cv::Mat& image, int64_t size) {
  const int top = static_cast<int>(std::lround((image.rows - size) / 2.0));
  const int left = static_cast<int>(std::lround((image.cols - size) / 2.0));
  return image(cv::Rect(left, top, static_cast<int>(size), static_cast<int>(size)));
}

// HWC uint8 -> CHW float32, scaled to [0, 1] and normalised per channel.
Tensor normalise_to_chw(const cv::Mat& image, const EvalTransform& t) {
  const int64_t c = t.channels, size = t.image_size;
  Tensor out = Tensor::empty({c, size, size}, DType::kF32);
  float* dst = out.data<float>();
  for (int64_t y = 0; y < size; ++y) {
    const uint8_t* row = image.ptr<uint8_t>(static_cast<int>(y));
    for (int64_t x = 0; x < size; ++x) {
      for (int64_t ch = 0; ch < c; ++ch) {
        const double value = row[x * c + ch] / 255.0;
        dst[(ch * size + y) * size + x] = static_cast<float>((value - t.mean[ch]) / t.std[ch]);
      }
    }
  }
  return out;
}
#else
[[noreturn]] void fail_without_opencv(const std::string& what) {
  SKA_FAIL(IOError, what, ": this build has no image decoding; reconfigure with -DSKA_OPENCV=ON ",
           "(Debian/Ubuntu: apt-get install libopencv-dev)");
}
#endif

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
  t.interpolation = data.get_choice("interpolation", "bicubic", {"bicubic", "bilinear"}) == "bicubic"
                        ? Interpolation::kBicubic
                        : Interpolation::kBilinear;
  return t;
}

int64_t eval_resize_size(const EvalTransform& t) {
  return static_cast<int64_t>(std::floor(static_cast<double>(t.image_size) / t.crop_pct));
}

#ifdef SKA_WITH_OPENCV
Tensor preprocess_pixels(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels,
                         const EvalTransform& t) {
  SKA_CHECK(height > 0 && width > 0, ValueError, "eval transform: empty image ", height, "x", width);
  SKA_CHECK(static_cast<int64_t>(t.mean.size()) == t.channels &&
                static_cast<int64_t>(t.std.size()) == t.channels,
            ValueError, "eval transform: mean/std need ", t.channels, " values");
  const cv::Mat wrapped(static_cast<int>(height), static_cast<int>(width),
                        CV_8UC(static_cast<int>(channels)), const_cast<uint8_t*>(pixels));
  const cv::Mat image = to_model_channels(wrapped, t.channels);
  const cv::Mat cropped = centre_crop(resize_shorter_side(image, t), t.image_size);
  return normalise_to_chw(cropped, t);
}

Tensor load_eval_image(const std::string& path, const EvalTransform& t) {
  // Checked first: OpenCV would also log a warning of its own for a missing file.
  SKA_CHECK(std::ifstream(path).good(), IOError, path,
            ": cannot read or decode the image (cannot open the file)");
  const int mode = t.channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;
  cv::Mat image;
  try {
    image = cv::imread(path, mode);
  } catch (const cv::Exception& e) {
    SKA_FAIL(IOError, path, ": cannot decode the image: ", e.what());
  }
  SKA_CHECK(!image.empty(), IOError, path,
            ": cannot read or decode the image (missing file or unsupported format)");
  if (image.channels() == 3) cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  if (!image.isContinuous()) image = image.clone();
  return preprocess_pixels(image.data, image.rows, image.cols, image.channels(), t);
}

#else
Tensor preprocess_pixels(const uint8_t*, int64_t, int64_t, int64_t, const EvalTransform&) {
  fail_without_opencv("eval transform");
}

Tensor load_eval_image(const std::string& path, const EvalTransform&) { fail_without_opencv(path); }
#endif

}  // namespace ska::data
