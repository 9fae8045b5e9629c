// Tests of the evaluation image transform: config defaults and errors, exact values without a
// resize, shorter-side resize and centre crop, grey/colour conversion, and decoding files.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/eval_transform.h"
#include "support/test_util.h"

namespace {

using namespace ska;
using Catch::Matchers::Contains;

data::EvalTransform transform_from(const std::string& yaml, int64_t size, int64_t channels) {
  Config config = Config::parse(yaml);
  data::EvalTransform t = data::read_eval_transform(config.root()["data"], size, channels);
  config.check_unused();
  return t;
}

std::vector<uint8_t> gradient_pixels(int64_t h, int64_t w, int64_t c) {
  std::vector<uint8_t> pixels(h * w * c);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 7) % 256);
  return pixels;
}

}  // namespace

TEST_CASE("eval transform: defaults by resolution, and config errors", "[cpu][data]") {
  const data::EvalTransform imagenet = transform_from("{}", 224, 3);
  REQUIRE(imagenet.crop_pct == 0.875);
  REQUIRE(data::eval_resize_size(imagenet) == 256);
  REQUIRE(imagenet.mean == std::vector<double>{0.485, 0.456, 0.406});
  REQUIRE(imagenet.interpolation == data::Interpolation::kBicubic);
  const data::EvalTransform cifar = transform_from("{}", 32, 3);
  REQUIRE(cifar.crop_pct == 1.0);
  REQUIRE(cifar.std == std::vector<double>{0.2023, 0.1994, 0.2010});
  const data::EvalTransform grey = transform_from("{}", 32, 1);
  REQUIRE(grey.mean.size() == 1);
  REQUIRE(grey.mean[0] == Approx((0.4914 + 0.4822 + 0.4465) / 3));

  const auto t = transform_from(
      "data: {crop_pct: 1.0, interpolation: bilinear, mean: [0.1, 0.2, 0.3]}", 224, 3);
  REQUIRE(t.interpolation == data::Interpolation::kBilinear);
  REQUIRE(data::eval_resize_size(t) == 224);

  REQUIRE_THROWS_WITH(transform_from("data: {mean: [0.1, 0.2]}", 32, 3),
                      Contains("data.mean") && Contains("expected 1 or 3 values"));
  REQUIRE_THROWS_WITH(transform_from("data: {interpolation: nearest}", 32, 3),
                      Contains("data.interpolation"));
  REQUIRE_THROWS_WITH(transform_from("data: {crop_pct: 1.5}", 32, 3), Contains("data.crop_pct"));
  REQUIRE_THROWS_WITH(transform_from("data: {std: [0]}", 32, 3), Contains("positive"));
  REQUIRE_THROWS_WITH(transform_from("data: {crop: 1.0}", 32, 3), Contains("data.crop"));
  REQUIRE_THROWS_WITH(transform_from("{}", 32, 4), Contains("1- or 3-channel"));
}

TEST_CASE("eval transform: per-channel messages for one channel", "[cpu][data][hardening]") {
  try {
    transform_from("data: {mean: [0.1, 0.2]}", 32, 1);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Contains("data.mean: expected 1 value (one channel), got 2"));
    CHECK_THAT(message, !Contains("1 or 1"));
  }
}

TEST_CASE("eval transform: exact values when no resize is needed", "[cpu][data]") {
  const auto t = transform_from("data: {mean: [0.5, 0.25, 0], std: [0.5, 0.25, 1]}", 4, 3);
  const std::vector<uint8_t> pixels = gradient_pixels(4, 4, 3);
  const Tensor x = data::preprocess_pixels(pixels.data(), 4, 4, 3, t);
  REQUIRE(x.shape() == Shape{3, 4, 4});
  const std::vector<float> v = x.to_vector<float>();
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t p = 0; p < 16; ++p) {
      const double expected = (pixels[p * 3 + c] / 255.0 - t.mean[c]) / t.std[c];
      REQUIRE(v[c * 16 + p] == Approx(expected).epsilon(1e-6));
    }
  }
}

TEST_CASE("eval transform: shorter-side resize, centre crop, channel conversion", "[cpu][data]") {
  // 0.5 crop of 4: resize the shorter side to 8 (16x8 -> 16x8 unchanged), crop rows 6..9,
  // cols 2..5.
  const auto t = transform_from("data: {crop_pct: 0.5, mean: [0], std: [1]}", 4, 3);
  std::vector<uint8_t> pixels(16 * 8 * 3);
  for (int64_t y = 0; y < 16; ++y) {
    for (int64_t x = 0; x < 8; ++x) {
      for (int64_t c = 0; c < 3; ++c)
        pixels[(y * 8 + x) * 3 + c] = static_cast<uint8_t>(y * 10 + x);
    }
  }
  const Tensor crop = data::preprocess_pixels(pixels.data(), 16, 8, 3, t);
  REQUIRE(crop.shape() == Shape{3, 4, 4});
  REQUIRE(crop.select(0, 1).select(0, 0).select(0, 0).item() == Approx(62 / 255.0));  // y 6, x 2
  REQUIRE(crop.select(0, 2).select(0, 3).select(0, 3).item() == Approx(95 / 255.0));  // y 9, x 5

  // A constant image stays constant through a real (bicubic) resize.
  const auto resize = transform_from("data: {crop_pct: 0.875}", 7, 3);
  std::vector<uint8_t> flat(30 * 20 * 3, 100);
  const Tensor y = data::preprocess_pixels(flat.data(), 30, 20, 3, resize);
  REQUIRE(y.shape() == Shape{3, 7, 7});
  test::require_close(y.select(0, 0), Tensor::full({7, 7}, (100 / 255.0 - 0.4914) / 0.2023),
                      {1e-5, 1e-5});

  // Grey replicated to three channels; colour averaged (BT.601) for a 1-channel model.
  const auto rgb = transform_from("data: {mean: [0], std: [1]}", 2, 3);
  std::vector<uint8_t> grey = {0, 51, 102, 255};
  const Tensor g3 = data::preprocess_pixels(grey.data(), 2, 2, 1, rgb);
  test::require_close(g3.select(0, 0), g3.select(0, 2), {0, 0});
  const auto mono = transform_from("data: {mean: [0], std: [1]}", 2, 1);
  std::vector<uint8_t> colour(2 * 2 * 3, 200);
  const Tensor g1 = data::preprocess_pixels(colour.data(), 2, 2, 3, mono);
  REQUIRE(g1.shape() == Shape{1, 2, 2});
  REQUIRE(g1.to_vector<float>()[0] == Approx(200 / 255.0).margin(1e-6));
}

TEST_CASE("eval transform: equal to torchvision's Resize, CenterCrop, ToTensor, Normalize",
          "[cpu][data][golden]") {
  // tests/fixtures/images/eval.txt (scripts/make_image_fixtures.py): torchvision 0.14 on Pillow
  // images, the same JPEG files decoded, at sizes that downscale, upscale and crop at a half pixel.
  const std::string images = std::string(SKA_TEST_FIXTURES) + "/images/";
  std::ifstream in(images + "eval.txt");
  REQUIRE(in.good());
  int cases = 0;
  for (std::string line; std::getline(in, line); ++cases) {
    std::istringstream fields(line);
    std::string name, crop_pct, interpolation;
    int64_t size = 0, channels = 0;
    fields >> name >> size >> crop_pct >> interpolation >> channels;
    std::vector<double> expected;
    for (double v; fields >> v;) expected.push_back(v);
    INFO(line.substr(0, 48));
    const std::string stats = channels == 3
                                  ? "mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]"
                                  : "mean: [0.449], std: [0.226]";
    const auto t = transform_from(
        "data: {crop_pct: " + crop_pct + ", interpolation: " + interpolation + ", " + stats + "}",
        size, channels);
    const Tensor x = data::load_eval_image(images + name, t);
    REQUIRE(x.shape() == Shape{channels, size, size});
    test::require_close(x, test::values(expected, x.shape()).to(DType::kF32), {2e-6, 1e-6});
  }
  CHECK(cases == 6);
}

#ifdef SKA_WITH_OPENCV  // PNM files are decoded by OpenCV
TEST_CASE("eval transform: decoding files", "[cpu][data]") {
  const std::string path =
      (std::filesystem::temp_directory_path() / "ska_test_eval_transform.pgm").string();
  std::ofstream(path, std::ios::binary) << "P5\n2 2\n255\n" << std::string("\x00\x40\x80\xff", 4);
  const auto t = transform_from("data: {mean: [0], std: [1]}", 2, 3);
  const Tensor x = data::load_eval_image(path, t);
  REQUIRE(x.shape() == Shape{3, 2, 2});
  REQUIRE(x.to_vector<float>()[3] == Approx(1.0));
  REQUIRE(x.to_vector<float>()[4 + 1] == Approx(64 / 255.0));
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(data::load_eval_image(path, t), Contains(path) && Contains("cannot open"));
}
#endif  // SKA_WITH_OPENCV
