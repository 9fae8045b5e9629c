// Training augmentations: determinism, each op against hand-computed values on tiny images, the
// statistics of the random ones, torchvision/PIL golden outputs (scripts/make_augment_fixtures.py),
// mixup/cutmix targets, random erasing, and the config factory.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "data/transforms/augment_factory.h"
#include "data/transforms/basic_transforms.h"
#include "data/transforms/batch_augment.h"
#include "data/transforms/image_ops.h"
#include "data/transforms/rand_augment.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::data;
using Catch::Matchers::Contains;

namespace {

Image make_image(int h, int w, int c, uint8_t value = 0) {
  Image im;
  im.height = h;
  im.width = w;
  im.channels = c;
  im.pixels.assign(static_cast<size_t>(h) * w * c, value);
  return im;
}

// The pixel formula of scripts/make_augment_fixtures.py.
Image fixture_base() {
  Image im = make_image(12, 10, 3);
  for (size_t i = 0; i < im.pixels.size(); ++i) {
    im.pixels[i] = static_cast<uint8_t>(((static_cast<uint32_t>(i) * 2654435761u) >> 7) % 161 + 40);
  }
  return im;
}

// tests/fixtures/augment/<file>: one image a line, "name height width channels values..." (HWC).
std::map<std::string, Image> load_fixtures(const std::string& file = "ops.txt") {
  std::ifstream in(std::string(SKA_TEST_FIXTURES) + "/augment/" + file);
  REQUIRE(in.good());
  std::map<std::string, Image> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string name;
    Image im;
    s >> name >> im.height >> im.width >> im.channels;
    int v;
    while (s >> v) im.pixels.push_back(static_cast<uint8_t>(v));
    REQUIRE(im.pixels.size() == static_cast<size_t>(im.height) * im.width * im.channels);
    out[name] = im;
  }
  return out;
}

int max_abs_diff(const Image& a, const Image& b) {
  REQUIRE(a.pixels.size() == b.pixels.size());
  int worst = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    worst = std::max(worst, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
  }
  return worst;
}

Compose cifar_pipeline() {
  std::vector<std::unique_ptr<Transform>> steps;
  steps.push_back(std::make_unique<TorchvisionRandAugment>());
  steps.push_back(std::make_unique<RandomCrop>(12, 4));
  steps.push_back(std::make_unique<RandomHorizontalFlip>(0.5));
  return Compose(std::move(steps));
}

}  // namespace

TEST_CASE("transforms: to_normalized_batch packs HWC images into normalised NCHW", "[cpu][data]") {
  Image a = make_image(1, 2, 3), b = make_image(1, 2, 3);
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    a.pixels[i] = static_cast<uint8_t>(i * 40);
    b.pixels[i] = 255;
  }
  const Tensor t = to_normalized_batch({a, b}, {0.5, 0.25, 0.0}, {0.5, 0.25, 1.0});
  REQUIRE(t.shape() == Shape{2, 3, 1, 2});
  const auto v = t.to_vector<double>();
  // sample 0, channel 1, x 1 is pixel index 4: 160 / 255.
  CHECK(v[3] == Approx((160.0 / 255 - 0.25) / 0.25).epsilon(1e-6));
  CHECK(v[0] == Approx((0.0 - 0.5) / 0.5).margin(1e-6));
  CHECK(v[6 + 4] == Approx(1.0).margin(1e-6));
  REQUIRE_THROWS_AS(to_normalized_batch({a, make_image(2, 2, 3)}, {0, 0, 0}, {1, 1, 1}),
                    ValueError);
  REQUIRE_THROWS_AS(to_normalized_batch({a}, {0}, {1}), ValueError);
  // The RGB path (vector clones) and the generic one give the plain formula's bits: the f32
  // multiply by 1 / (255 std), then the add of -mean / std, each rounded.
  std::mt19937 rng(3);
  for (const int c : {1, 3, 4}) {
    std::vector<Image> images;
    for (int n = 0; n < 3; ++n) {
      Image im = make_image(7, 13, c);
      for (auto& p : im.pixels) p = static_cast<uint8_t>(rng() & 255);
      images.push_back(im);
    }
    const std::vector<double> mean = {0.485, 0.456, 0.406, 0.5}, std = {0.229, 0.224, 0.225, 0.3};
    const std::vector<double> m(mean.begin(), mean.begin() + c), sd(std.begin(), std.begin() + c);
    const Tensor got = to_normalized_batch(images, m, sd);
    const float* g = got.data<float>();
    int64_t mismatches = 0;
    for (int n = 0; n < 3; ++n)
      for (int k = 0; k < c; ++k) {
        const float scale = static_cast<float>(1.0 / (255.0 * sd[k]));
        const float shift = static_cast<float>(-m[k] / sd[k]);
        for (int p = 0; p < 7 * 13; ++p) {
          volatile float product = images[n].pixels[p * c + k] * scale;  // rounded here
          const float want = product + shift;
          mismatches += g[(n * c + k) * 7 * 13 + p] != want;
        }
      }
    INFO(c << " channels");
    CHECK(mismatches == 0);
  }
}

TEST_CASE("transforms: augmentation is deterministic per (seed, stream) and varies across streams",
          "[cpu][data]") {
  const Compose pipeline = cifar_pipeline();
  const Image base = fixture_base();
  auto run = [&](uint64_t seed, uint64_t stream) {
    Image im = base;
    SampleRng rng(seed, stream);
    pipeline.apply(im, rng);
    return im.pixels;
  };
  std::set<std::vector<uint8_t>> distinct;
  for (uint64_t s = 0; s < 20; ++s) {
    const uint64_t stream = SampleRng::stream_of(3, s);
    CHECK(run(42, stream) == run(42, stream));
    distinct.insert(run(42, stream));
  }
  CHECK(distinct.size() >= 18);
  CHECK(run(42, 7) != run(43, 7));
}

TEST_CASE("transforms: RandomCrop pads with zeros and crops at the drawn offset", "[cpu][data]") {
  Image base = make_image(4, 4, 1);
  for (int i = 0; i < 16; ++i) base.pixels[i] = static_cast<uint8_t>(i + 1);
  const RandomCrop crop(4, 2);
  std::set<std::pair<int, int>> offsets;
  for (uint64_t s = 0; s < 400; ++s) {
    SampleRng rng(1, s), probe(1, s);
    const int top = probe.randint(0, 4), left = probe.randint(0, 4);
    offsets.insert({top, left});
    Image im = base;
    crop.apply(im, rng);
    REQUIRE(im.height == 4);
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 4; ++x) {
        const int sy = y + top - 2, sx = x + left - 2;
        const int expected = (sy < 0 || sy >= 4 || sx < 0 || sx >= 4) ? 0 : sy * 4 + sx + 1;
        REQUIRE(im.at(y, x, 0) == expected);
      }
    }
  }
  CHECK(offsets.size() == 25);  // every (top, left) in [0, 4]^2

  Image c = make_image(5, 6, 1);
  for (int i = 0; i < 30; ++i) c.pixels[i] = static_cast<uint8_t>(i);
  SampleRng rng(0, 0);
  CenterCrop(3).apply(c, rng);  // top = round(1.0) = 1, left = round(1.5) = 2
  CHECK(c.at(0, 0, 0) == 1 * 6 + 2);
  CHECK(c.at(2, 2, 0) == 3 * 6 + 4);
}

TEST_CASE("transforms: RandomHorizontalFlip mirrors rows and flips at rate p", "[cpu][data]") {
  Image im = make_image(2, 3, 2);
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i);
  SampleRng rng(0, 0);
  Image flipped = im;
  RandomHorizontalFlip(1.0).apply(flipped, rng);
  CHECK(flipped.at(0, 0, 0) == im.at(0, 2, 0));
  CHECK(flipped.at(1, 2, 1) == im.at(1, 0, 1));
  CHECK(flipped.at(1, 1, 1) == im.at(1, 1, 1));
  Image kept = im;
  RandomHorizontalFlip(0.0).apply(kept, rng);
  CHECK(kept.pixels == im.pixels);

  const RandomHorizontalFlip flip(0.3);
  int count = 0;
  for (uint64_t s = 0; s < 10000; ++s) {
    Image x = im;
    SampleRng r(9, s);
    flip.apply(x, r);
    count += x.pixels != im.pixels;
  }
  CHECK(std::abs(count / 10000.0 - 0.3) < 0.02);  // 4.4 sigma
}

TEST_CASE("transforms: PadReplicate pads 28x28 grey to 32x32x3", "[cpu][data]") {
  Image im = make_image(28, 28, 1, 9);
  SampleRng rng(0, 0);
  PadReplicate(32, 3).apply(im, rng);
  REQUIRE(im.height == 32);
  REQUIRE(im.channels == 3);
  CHECK(im.at(1, 1, 2) == 0);
  CHECK(im.at(2, 2, 0) == 9);
  CHECK(im.at(29, 29, 1) == 9);
  CHECK(im.at(30, 29, 1) == 0);
  Image odd = make_image(27, 27, 1);
  REQUIRE_THROWS_AS(PadReplicate(32, 3).apply(odd, rng), ValueError);
}

TEST_CASE("transforms: lookup-table ops match hand-computed values", "[cpu][data]") {
  Image im = make_image(1, 4, 1);
  im.pixels = {3, 100, 178, 255};
  Image p = im;
  image_posterize(p, 7);
  CHECK(p.pixels == std::vector<uint8_t>{2, 100, 178, 254});
  image_posterize(p = im, 4);
  CHECK(p.pixels == std::vector<uint8_t>{0, 96, 176, 240});
  Image s = im;
  image_solarize(s, 178.5);
  CHECK(s.pixels == std::vector<uint8_t>{3, 100, 178, 0});
  image_solarize(s = im, 100);
  CHECK(s.pixels == std::vector<uint8_t>{3, 155, 77, 0});

  Image a = make_image(1, 3, 1);
  a.pixels = {50, 100, 150};
  image_autocontrast(a);  // scale 2.55, offset -127.5: int(0), int(127.5), int(255)
  CHECK(a.pixels == std::vector<uint8_t>{0, 127, 255});

  // 300 x 50, 300 x 100, 24 x 150: step = (624 - 24) / 255 = 2, lut = (1 + cumsum) / 2.
  Image e = make_image(1, 624, 1);
  for (int i = 0; i < 624; ++i) e.pixels[i] = i < 300 ? 50 : i < 600 ? 100 : 150;
  image_equalize(e);
  CHECK(e.pixels[0] == 0);
  CHECK(e.pixels[300] == 150);
  CHECK(e.pixels[623] == 255);
  Image flat = make_image(2, 2, 1, 77);
  image_equalize(flat);
  CHECK(flat.pixels[0] == 77);
}

TEST_CASE("transforms: affine ops move a single bright pixel where PIL puts it", "[cpu][data]") {
  auto bright = [](int y, int x) {
    Image im = make_image(5, 5, 1, 100);
    im.at(y, x, 0) = 255;
    return im;
  };
  // ShearX 0.5: the output (x, y) samples floor(x + 0.5 + 0.5 (y + 0.5)) on row y.
  Image sx = bright(2, 3);
  tv_apply_op(sx, TvOp::kShearX, 0.5, Resample::kNearest, {7});
  CHECK(sx.at(2, 2, 0) == 255);
  CHECK(sx.at(2, 3, 0) == 100);
  CHECK(sx.at(2, 4, 0) == 7);  // samples column 5: outside, the fill
  CHECK(sx.at(0, 4, 0) == 100);
  // ShearY -0.5: rows move the other way with the column.
  Image sy = bright(1, 4);
  tv_apply_op(sy, TvOp::kShearY, -0.5, Resample::kNearest, {0});
  CHECK(sy.at(3, 4, 0) == 255);  // floor(3.5 - 0.5 * 4.5) = 1
  // TranslateX 2.7 truncates to 2 pixels: content moves right, the left columns are filled.
  Image tx = bright(3, 1);
  tv_apply_op(tx, TvOp::kTranslateX, 2.7, Resample::kNearest, {0});
  CHECK(tx.at(3, 3, 0) == 255);
  CHECK(tx.at(3, 1, 0) == 0);
  CHECK(tx.at(0, 4, 0) == 100);
  Image ty = bright(3, 1);
  tv_apply_op(ty, TvOp::kTranslateY, -2.2, Resample::kNearest, {0});
  CHECK(ty.at(1, 1, 0) == 255);
  CHECK(ty.at(4, 1, 0) == 0);
  // Rotate 90 degrees counter-clockwise about the centre: (x 3, y 1) -> (x 1, y 1).
  Image r = bright(1, 3);
  tv_apply_op(r, TvOp::kRotate, 90.0, Resample::kNearest, {0});
  int bright_count = 0;
  for (uint8_t v : r.pixels) bright_count += v == 255;
  CHECK(bright_count == 1);
  CHECK(r.at(1, 1, 0) == 255);
  Image r180 = bright(1, 3);
  image_rotate(r180, 180.0, Resample::kNearest, {0});
  CHECK(r180.at(3, 1, 0) == 255);
}

TEST_CASE("transforms: torchvision RandAugment ops match torchvision 0.14 / PIL golden outputs",
          "[cpu][data][golden]") {
  const auto fixtures = load_fixtures();
  const Image base = fixture_base();
  REQUIRE(fixtures.at("base").pixels == base.pixels);
  const double t = 150.0 / 331.0 * 9 / 30;
  const std::vector<std::pair<std::string, std::pair<TvOp, double>>> cases = {
      {"ShearX+", {TvOp::kShearX, 0.09}},
      {"ShearX-", {TvOp::kShearX, -0.09}},
      {"ShearY+", {TvOp::kShearY, 0.09}},
      {"ShearY-", {TvOp::kShearY, -0.09}},
      {"TranslateX+", {TvOp::kTranslateX, t * 10}},
      {"TranslateX-", {TvOp::kTranslateX, -t * 10}},
      {"TranslateY+", {TvOp::kTranslateY, t * 12}},
      {"TranslateY-", {TvOp::kTranslateY, -t * 12}},
      {"Rotate+", {TvOp::kRotate, 9.0}},
      {"Rotate-", {TvOp::kRotate, -9.0}},
      {"Brightness+", {TvOp::kBrightness, 0.27}},
      {"Brightness-", {TvOp::kBrightness, -0.27}},
      {"Color+", {TvOp::kColor, 0.27}},
      {"Color-", {TvOp::kColor, -0.27}},
      {"Contrast+", {TvOp::kContrast, 0.27}},
      {"Contrast-", {TvOp::kContrast, -0.27}},
      {"Sharpness+", {TvOp::kSharpness, 0.27}},
      {"Sharpness-", {TvOp::kSharpness, -0.27}},
      {"Posterize7", {TvOp::kPosterize, 7.0}},
      {"Posterize4", {TvOp::kPosterize, 4.0}},
      {"Solarize", {TvOp::kSolarize, 178.5}},
      {"AutoContrast", {TvOp::kAutoContrast, 0.0}},
      {"Equalize", {TvOp::kEqualize, 0.0}},
  };
  for (const auto& [name, op] : cases) {
    INFO(name);
    Image im = base;
    tv_apply_op(im, op.first, op.second, Resample::kNearest, {0});
    CHECK(max_abs_diff(im, fixtures.at(name)) == 0);
  }
  // timm's bicubic geometry (PIL: cubic a = -1, truncated).
  Image rot = base;
  image_rotate(rot, 13.0, Resample::kBicubic, {124, 116, 104});
  CHECK(max_abs_diff(rot, fixtures.at("BicubicRotate")) == 0);
  Image tr = base;
  image_affine(tr, {1, 0, 2.7, 0, 1, 0}, Resample::kBicubic, {124, 116, 104});
  CHECK(max_abs_diff(tr, fixtures.at("BicubicTranslate")) == 0);
  // RandomResizedCrop's resize: PIL's antialiased separable filter, down and up.
  const std::vector<std::tuple<std::string, int, int, Resample>> resizes = {
      {"ResizeBicubicDown", 5, 7, Resample::kBicubic},
      {"ResizeBicubicUp", 17, 23, Resample::kBicubic},
      {"ResizeBilinearDown", 9, 4, Resample::kBilinear}};
  for (const auto& [name, h, w, mode] : resizes) {
    INFO(name);
    Image im = base;
    image_resize(im, h, w, mode);
    CHECK(max_abs_diff(im, fixtures.at(name)) == 0);
  }
}

namespace {

// PIL's resize (Resample.c) written plainly, one output sample at a time: each output's window
// [lo, hi) of inputs and its normalised, 22-bit quantised weights, the horizontal pass rounded to
// uint8 before the vertical one, int32 sums. The specification image_resize's tiled, vectorised
// passes must meet bit for bit.
std::vector<std::pair<int, std::vector<int32_t>>> reference_coeffs(int in_size, int out_size,
                                                                   Resample mode) {
  const double support_base = mode == Resample::kBicubic ? 2.0 : 1.0;
  auto filter = [mode](double x) {
    x = std::abs(x);
    if (mode == Resample::kBilinear) return x < 1.0 ? 1.0 - x : 0.0;
    const double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
  };
  const double scale = static_cast<double>(in_size) / out_size;
  const double fscale = std::max(scale, 1.0), support = support_base * fscale;
  std::vector<std::pair<int, std::vector<int32_t>>> out;
  for (int o = 0; o < out_size; ++o) {
    const double centre = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(centre - support + 0.5));
    const int hi = std::min(in_size, static_cast<int>(centre + support + 0.5));
    std::vector<double> w;
    double total = 0.0;
    for (int i = lo; i < hi; ++i) {
      w.push_back(filter((i - centre + 0.5) / fscale));
      total += w.back();
    }
    std::vector<int32_t> q;
    for (double v : w) {
      const double x = (total != 0.0 ? v / total : v) * (1 << 22);
      q.push_back(static_cast<int32_t>(x < 0 ? x - 0.5 : x + 0.5));
    }
    out.emplace_back(lo, q);
  }
  return out;
}

uint8_t reference_u8(int32_t acc) { return static_cast<uint8_t>(std::clamp(acc >> 22, 0, 255)); }

Image reference_resize(const Image& in, int height, int width, Resample mode) {
  Image im = in;
  const int ch = im.channels;
  if (width != im.width) {
    const auto cx = reference_coeffs(im.width, width, mode);
    Image out = make_image(im.height, width, ch);
    for (int y = 0; y < im.height; ++y)
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < ch; ++c) {
          int32_t acc = 1 << 21;
          for (size_t k = 0; k < cx[x].second.size(); ++k)
            acc += im.at(y, cx[x].first + static_cast<int>(k), c) * cx[x].second[k];
          out.at(y, x, c) = reference_u8(acc);
        }
    im = out;
  }
  if (height != im.height) {
    const auto cy = reference_coeffs(im.height, height, mode);
    Image out = make_image(height, im.width, ch);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < im.width; ++x)
        for (int c = 0; c < ch; ++c) {
          int32_t acc = 1 << 21;
          for (size_t k = 0; k < cy[y].second.size(); ++k)
            acc += im.at(cy[y].first + static_cast<int>(k), x, c) * cy[y].second[k];
          out.at(y, x, c) = reference_u8(acc);
        }
    im = out;
  }
  return im;
}

}  // namespace

TEST_CASE("transforms: resized crops equal PIL's crop then resize (Pillow 9.4 golden outputs)",
          "[cpu][data]") {
  // scripts/make_resize_fixtures.py: windows of 30x27 images, several 16-row tiles tall.
  struct Case {
    int channels, top, left, height, width;
    Resample mode;
  };
  const std::map<std::string, Case> cases = {
      {"CropDownBicubic", {3, 2, 3, 27, 22, Resample::kBicubic}},
      {"CropUpBicubic", {3, 5, 7, 13, 9, Resample::kBicubic}},
      {"CropMixedBilinear", {3, 0, 0, 30, 27, Resample::kBilinear}},
      {"CropKeepWidth", {3, 1, 4, 29, 20, Resample::kBicubic}},
      {"CropKeepHeight", {3, 3, 2, 25, 21, Resample::kBicubic}},
      {"CropGreyDownBicubic", {1, 1, 1, 28, 25, Resample::kBicubic}},
      {"CropGreyUpBilinear", {1, 5, 10, 20, 10, Resample::kBilinear}}};
  int seen = 0;
  for (const auto& [name, want] : load_fixtures("resize.txt")) {
    INFO(name);
    REQUIRE(cases.count(name) == 1);
    const Case& c = cases.at(name);
    Image base = make_image(30, 27, c.channels);
    for (size_t i = 0; i < base.pixels.size(); ++i) {
      base.pixels[i] =
          static_cast<uint8_t>(((static_cast<uint32_t>(i) * 2654435761u) >> 7) % 161 + 40);
    }
    Image got = base;
    image_resized_crop(got, c.top, c.left, c.height, c.width, want.height, want.width, c.mode);
    CHECK(max_abs_diff(got, want) == 0);
    Image two_steps = base;  // image_crop then image_resize: the same
    image_crop(two_steps, c.top, c.left, c.height, c.width);
    image_resize(two_steps, want.height, want.width, c.mode);
    CHECK(max_abs_diff(two_steps, want) == 0);
    ++seen;
  }
  CHECK(seen == static_cast<int>(cases.size()));
}

TEST_CASE("transforms: image_resize and image_resized_crop give the plain PIL algorithm's bits",
          "[cpu][data]") {
  // Random sizes (tiles of 16 RGB or 48 grey rows, whole and partial; down, up, one axis fixed),
  // windows anywhere in the image, 1 to 4 channels, both filters; and nearest on windows.
  std::mt19937 rng(7);
  auto draw = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const int ch = std::vector<int>{1, 2, 3, 3, 4, 5, 6, 8}[draw(0, 7)];
    Image base = make_image(draw(1, 70), draw(1, 70), ch);
    for (auto& p : base.pixels) p = static_cast<uint8_t>(draw(0, 255));
    if (trial % 7 == 0)  // extremes: 0/255 edges make the cubic's overshoot clip
      for (auto& p : base.pixels) p = p < 128 ? 0 : 255;
    const int h = draw(1, base.height), w = draw(1, base.width);
    const int top = draw(0, base.height - h), left = draw(0, base.width - w);
    const int out_h = trial % 5 == 0 ? h : draw(1, 80), out_w = trial % 5 == 1 ? w : draw(1, 80);
    const Resample mode = std::vector<Resample>{Resample::kBicubic, Resample::kBilinear,
                                                Resample::kNearest}[trial % 3];
    INFO("trial " << trial << ": " << base.height << "x" << base.width << "x" << ch << " window ("
                  << top << ", " << left << ", " << h << ", " << w << ") to " << out_h << "x"
                  << out_w);
    Image cropped = base;
    image_crop(cropped, top, left, h, w);
    Image want;
    if (mode == Resample::kNearest) {
      want = make_image(out_h, out_w, ch);
      for (int y = 0; y < out_h; ++y)
        for (int x = 0; x < out_w; ++x)
          for (int c = 0; c < ch; ++c)
            want.at(y, x, c) =
                cropped.at(std::min(h - 1, static_cast<int>((y + 0.5) * h / out_h)),
                           std::min(w - 1, static_cast<int>((x + 0.5) * w / out_w)), c);
    } else {
      want = reference_resize(cropped, out_h, out_w, mode);
    }
    Image got = base;
    image_resized_crop(got, top, left, h, w, out_h, out_w, mode);
    REQUIRE(got.height == out_h);
    REQUIRE(got.width == out_w);
    REQUIRE(got.channels == ch);
    CHECK(max_abs_diff(got, want) == 0);
    Image resized = cropped;
    image_resize(resized, out_h, out_w, mode);
    CHECK(max_abs_diff(resized, want) == 0);
  }
  // A window whose size is the output's: a crop, nothing resampled.
  Image base = make_image(9, 11, 3);
  for (size_t i = 0; i < base.pixels.size(); ++i) base.pixels[i] = static_cast<uint8_t>(i * 7);
  for (const Resample mode : {Resample::kBicubic, Resample::kBilinear, Resample::kNearest}) {
    Image got = base, want = base;
    image_resized_crop(got, 2, 3, 5, 6, 5, 6, mode);
    image_crop(want, 2, 3, 5, 6);
    REQUIRE(got.height == 5);
    REQUIRE(got.width == 6);
    CHECK(max_abs_diff(got, want) == 0);
  }
  Image im = make_image(4, 5, 3);
  CHECK_THROWS_WITH(image_resized_crop(im, 1, 0, 4, 5, 2, 2, Resample::kBicubic),
                    Contains("outside a 4x5 image"));
  CHECK_THROWS_WITH(image_resized_crop(im, 0, 0, 4, 5, 0, 2, Resample::kBicubic),
                    Contains("target size must be positive"));
}

TEST_CASE("transforms: torchvision RandAugment magnitudes at bin 9 of 31 and uniform op choice",
          "[cpu][data]") {
  CHECK(tv_magnitude(TvOp::kShearX, 9, 31, 32, 32) == Approx(0.09));
  CHECK(tv_magnitude(TvOp::kTranslateX, 9, 31, 32, 32) == Approx(150.0 / 331.0 * 32 * 0.3));
  CHECK(tv_magnitude(TvOp::kRotate, 9, 31, 32, 32) == Approx(9.0));
  CHECK(tv_magnitude(TvOp::kSharpness, 9, 31, 32, 32) == Approx(0.27));
  CHECK(tv_magnitude(TvOp::kPosterize, 9, 31, 32, 32) == 7.0);
  CHECK(tv_magnitude(TvOp::kPosterize, 30, 31, 32, 32) == 4.0);
  CHECK(tv_magnitude(TvOp::kSolarize, 9, 31, 32, 32) == Approx(178.5));
  CHECK(tv_magnitude(TvOp::kEqualize, 9, 31, 32, 32) == 0.0);

  const TorchvisionRandAugment ra;
  std::vector<int> count(kTvOpCount, 0);
  int signed_total = 0, negative = 0;
  const int n = 14000;
  for (int s = 0; s < n; ++s) {
    SampleRng rng(5, s);
    const auto ops = ra.draw(32, 32, rng);
    REQUIRE(ops.size() == 2);
    for (const auto& d : ops) {
      ++count[static_cast<int>(d.op)];
      if (tv_op_signed(d.op)) {
        ++signed_total;
        negative += d.magnitude < 0;
      }
    }
  }
  for (int k = 0; k < kTvOpCount; ++k) {
    INFO(tv_op_name(static_cast<TvOp>(k)));
    CHECK(std::abs(count[k] - 2 * n / kTvOpCount) < 220);  // ~5 sigma
  }
  CHECK(std::abs(static_cast<double>(negative) / signed_total - 0.5) < 0.02);
}

TEST_CASE("transforms: timm RandAugment strings parse as timm does", "[cpu][data]") {
  const auto c = parse_timm_rand_augment("rand-m9-mstd0.5-inc1");
  CHECK(c.magnitude == 9.0);
  CHECK(c.magnitude_std == 0.5);
  CHECK(c.increasing);
  CHECK(c.num_layers == 2);
  CHECK(c.prob == 0.5);
  CHECK(c.magnitude_max == 10.0);
  const auto d = parse_timm_rand_augment("rand-m7-n3");
  CHECK(d.magnitude == 7.0);
  CHECK(d.num_layers == 3);
  CHECK_FALSE(d.increasing);
  CHECK(std::isinf(parse_timm_rand_augment("rand-mstd101").magnitude_std));
  CHECK(parse_timm_rand_augment("rand-p0.3-mmax15").prob == Approx(0.3));
  CHECK(parse_timm_rand_augment("rand-m9-mmax15").magnitude_max == 15.0);
  REQUIRE_THROWS_WITH(parse_timm_rand_augment("rnd-m9"), Contains("must start with 'rand'"));
  REQUIRE_THROWS_WITH(parse_timm_rand_augment("rand-x3"), Contains("unknown section 'x3'"));
  REQUIRE_THROWS_WITH(parse_timm_rand_augment("rand-m9-tweights"), Contains("not supported"));
  REQUIRE_THROWS_WITH(parse_timm_rand_augment("rand-m9x"), Contains("malformed"));
}

TEST_CASE("transforms: timm RandAugment: op gate 0.5, magnitude noise, increasing ops",
          "[cpu][data]") {
  const TimmRandAugment ra(parse_timm_rand_augment("rand-m9-mstd0.5-inc1"));
  const int n = 20000;
  int applied = 0;
  double sum = 0, sum2 = 0;
  std::vector<int> count(kTimmOpCount, 0);
  for (int s = 0; s < n; ++s) {
    SampleRng rng(11, s);
    const TimmOpDraw d = ra.draw_layer(rng);
    ++count[static_cast<int>(d.op)];
    if (!d.applied) continue;
    ++applied;
    REQUIRE(d.magnitude >= 0.0);
    REQUIRE(d.magnitude <= 10.0);
    sum += d.magnitude;
    sum2 += d.magnitude * d.magnitude;
  }
  CHECK(std::abs(applied / double(n) - 0.5) < 0.02);
  const double mean = sum / applied, sd = std::sqrt(sum2 / applied - mean * mean);
  CHECK(std::abs(mean - 9.0) < 0.03);
  CHECK(sd > 0.45);
  CHECK(sd < 0.52);
  for (int k = 0; k < kTimmOpCount; ++k) CHECK(std::abs(count[k] - n / kTimmOpCount) < 180);

  SampleRng rng(0, 0);
  Image im = make_image(1, 4, 1);
  im.pixels = {30, 20, 200, 100};
  Image post = im;  // increasing posterize at m 9 keeps 4 - int(3.6) = 1 bit
  timm_apply_op(post, TimmOp::kPosterize, true, 9.0, 0.45, Resample::kBicubic, {0}, rng);
  CHECK(post.pixels == std::vector<uint8_t>{0, 0, 128, 0});
  Image sol = im;  // increasing solarize at m 9: threshold 256 - int(230.4) = 26
  timm_apply_op(sol, TimmOp::kSolarize, true, 9.0, 0.45, Resample::kBicubic, {0}, rng);
  CHECK(sol.pixels == std::vector<uint8_t>{225, 20, 55, 155});
  Image add = im;  // solarize-add at m 9: +99 below 128
  timm_apply_op(add, TimmOp::kSolarizeAdd, true, 9.0, 0.45, Resample::kBicubic, {0}, rng);
  CHECK(add.pixels == std::vector<uint8_t>{129, 119, 200, 199});
  // Translation by 0.45 * 0.9 of the width fills with the mean pixel.
  Image tr = make_image(4, 10, 3, 0);
  timm_apply_op(tr, TimmOp::kTranslateXRel, true, 9.0, 0.45, Resample::kBicubic, {124, 116, 104},
                rng);
  const bool left_filled = tr.at(0, 0, 0) == 124 && tr.at(0, 0, 2) == 104;
  const bool right_filled = tr.at(0, 9, 0) == 124 && tr.at(0, 9, 1) == 116;
  CHECK(left_filled != right_filled);
}

// The loader decodes only the window of a WindowFirst transform: apply() on the whole image must
// equal draw_window, then apply_to_window on the window's pixels, from the same random state.
TEST_CASE("transforms: RandomResizedCrop and the timm pipeline read only the window they draw",
          "[cpu][data]") {
  const Config timm = Config::parse(
      "augment: {random_resized_crop: true, hflip: 0.5, randaugment: rand-m9-mstd0.5-inc1,\n"
      "          color_jitter: 0.4, interpolation: bilinear}");
  const Config jitter = Config::parse("augment: {random_resized_crop: true, color_jitter: 0.4}");
  const std::vector<std::shared_ptr<const Transform>> transforms = {
      std::make_shared<RandomResizedCrop>(12),
      std::make_shared<RandomResizedCrop>(20, std::array<double, 2>{0.5, 1.0},
                                          std::array<double, 2>{0.2, 5.0}, Resample::kBilinear),
      read_train_augment(timm.root(), 16, 3, 10, {0.5, 0.4, 0.3}).transform,
      read_train_augment(jitter.root(), 16, 3, 10, {0.5, 0.4, 0.3}).transform};
  std::mt19937 gen(4);
  int compared = 0;
  for (const auto& t : transforms) {
    INFO(t->name());
    const WindowFirst* windowed = t->window_first();
    REQUIRE(windowed != nullptr);
    for (int s = 0; s < 60; ++s) {
      Image source = make_image(23 + s % 17, 31 + (s * 7) % 23, s % 5 == 0 ? 1 : 3);
      for (uint8_t& v : source.pixels) v = static_cast<uint8_t>(gen());
      SampleRng whole_rng(9, s), window_rng(9, s);
      Image whole = source;
      t->apply(whole, whole_rng);
      const CropBox box = windowed->draw_window(source.height, source.width, window_rng);
      Image window = source;
      image_crop(window, box.top, box.left, box.height, box.width);
      REQUIRE(window.height == box.height);
      REQUIRE(window.width == box.width);
      windowed->apply_to_window(window, window_rng);
      REQUIRE(window.height == whole.height);
      REQUIRE(window.width == whole.width);
      REQUIRE(window.pixels == whole.pixels);
      REQUIRE(window_rng.next_u32() == whole_rng.next_u32());  // the same draws, in order
      ++compared;
    }
  }
  CHECK(compared == 240);
  // The CIFAR recipe crops after padding: it reads the whole image.
  const Config cifar = Config::parse("augment: {crop_padding: 4, hflip: 0.5}");
  CHECK(read_train_augment(cifar.root(), 32, 3, 10, {0.5, 0.5, 0.5}).transform->window_first() ==
        nullptr);
  CHECK(RandomHorizontalFlip(0.5).window_first() == nullptr);
}

TEST_CASE(
    "transforms: RandomResizedCrop boxes respect scale and ratio, fallback is the centre crop",
    "[cpu][data]") {
  const int h = 64, w = 48;
  double min_area = 1, max_area = 0;
  for (int s = 0; s < 5000; ++s) {
    SampleRng rng(3, s);
    const CropBox b = random_resized_crop_box(h, w, {0.08, 1.0}, {0.75, 4.0 / 3.0}, rng);
    REQUIRE(b.top >= 0);
    REQUIRE(b.left >= 0);
    REQUIRE(b.top + b.height <= h);
    REQUIRE(b.left + b.width <= w);
    const double area = double(b.height) * b.width / (h * w);
    min_area = std::min(min_area, area);
    max_area = std::max(max_area, area);
    if (b.height == h && b.width == w) continue;  // the fallback
    const double ratio = double(b.width) / b.height;
    // Rounding each side to whole pixels moves the ratio by at most ~1 pixel's worth.
    REQUIRE(ratio >= 0.75 * (1 - 1.0 / b.height) * (1 - 1.0 / b.width) - 1e-9);
    REQUIRE(ratio <= 4.0 / 3.0 * (1 + 1.0 / b.width) * (1 + 1.0 / b.height) + 1e-9);
    REQUIRE(area >= 0.08 * 0.85);
  }
  CHECK(min_area < 0.1);
  CHECK(max_area > 0.9);
  SampleRng rng(0, 0);
  const CropBox f = random_resized_crop_box(10, 100, {0.5, 1.0}, {0.75, 4.0 / 3.0}, rng);
  CHECK(f.height == 10);
  CHECK(f.width == 13);
  CHECK(f.top == 0);
  CHECK(f.left == 43);

  Image im = make_image(40, 30, 3, 50);
  SampleRng r(1, 1);
  RandomResizedCrop(16).apply(im, r);
  CHECK(im.height == 16);
  CHECK(im.width == 16);
  CHECK(im.at(5, 5, 1) == 50);
}

TEST_CASE("transforms: ColorJitter is deterministic, identity at strength 0", "[cpu][data]") {
  const Image base = fixture_base();
  Image a = base, b = base, c = base;
  SampleRng r1(1, 2), r2(1, 2), r3(1, 2);
  ColorJitter(0.4, 0.4, 0.4).apply(a, r1);
  ColorJitter(0.4, 0.4, 0.4).apply(b, r2);
  ColorJitter(0.0, 0.0, 0.0).apply(c, r3);
  CHECK(a.pixels == b.pixels);
  CHECK(a.pixels != base.pixels);
  CHECK(c.pixels == base.pixels);
}

TEST_CASE("transforms: Mixup: lambda ~ Beta(0.8, 0.8), mixed images and smoothed soft targets",
          "[cpu][data]") {
  MixupOptions mix_only;
  mix_only.cutmix_alpha = 0.0;
  const MixupCutmix mixup(mix_only, 10);
  double sum = 0, sum2 = 0;
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    const MixupDraw d = mixup.draw(8, 8, 7, s);
    REQUIRE(!d.cutmix);
    sum += d.lambda;
    sum2 += d.lambda * d.lambda;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 0.025);
  CHECK(std::abs(var - 0.64 / (2.56 * 2.6)) < 0.01);  // ab / ((a + b)^2 (a + b + 1))

  // Sample i holds the constant i; after mixup it is lam i + (1 - lam) (B - 1 - i).
  const int64_t batch = 4;
  std::vector<float> v;
  for (int64_t i = 0; i < batch; ++i) v.insert(v.end(), 2 * 3 * 3, static_cast<float>(i));
  Tensor x = Tensor::from_vector(v, Shape{batch, 2, 3, 3});
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 1}, Shape{batch});
  MixupDraw d;
  const Tensor targets = mixup.apply(x, labels, 7, 12, &d);
  REQUIRE(d.mixed);
  const auto xv = x.to_vector<double>();
  for (int64_t i = 0; i < batch; ++i) {
    CHECK(xv[i * 18 + 5] == Approx(d.lambda * i + (1 - d.lambda) * (batch - 1 - i)).margin(1e-5));
  }
  REQUIRE(targets.shape() == Shape{batch, 10});
  const auto t = targets.to_vector<double>();
  for (int64_t i = 0; i < batch; ++i) {
    double row = 0;
    for (int k = 0; k < 10; ++k) row += t[i * 10 + k];
    CHECK(row == Approx(1.0).margin(1e-5));
  }
  // Sample 1 (label 2) mixes with sample 2 (label 3): off 0.01, on 0.91.
  CHECK(t[1 * 10 + 0] == Approx(0.01).margin(1e-6));
  CHECK(t[1 * 10 + 2] == Approx(d.lambda * 0.91 + (1 - d.lambda) * 0.01).margin(1e-6));
  CHECK(t[1 * 10 + 3] == Approx(d.lambda * 0.01 + (1 - d.lambda) * 0.91).margin(1e-6));
  // Samples 0 and 3 share label 1: the target is the smoothed one-hot.
  CHECK(t[0 * 10 + 1] == Approx(0.91).margin(1e-6));

  Tensor odd = Tensor::zeros(Shape{3, 1, 2, 2});
  REQUIRE_THROWS_WITH(
      mixup.apply(odd, Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, Shape{3}), 0, 0),
      Contains("even"));
}

TEST_CASE("transforms: CutMix: box area matches the corrected lambda, switch rate 0.5",
          "[cpu][data]") {
  const MixupCutmix both(MixupOptions{}, 5);
  int cutmix = 0;
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    const MixupDraw d = both.draw(32, 24, 1, s);
    if (!d.cutmix) continue;
    ++cutmix;
    const double box = double(d.box_y1 - d.box_y0) * (d.box_x1 - d.box_x0);
    REQUIRE(d.lambda == Approx(1.0 - box / (32.0 * 24.0)).margin(1e-12));
    REQUIRE(d.box_y0 >= 0);
    REQUIRE(d.box_y1 <= 32);
    REQUIRE(d.box_x1 <= 24);
  }
  CHECK(std::abs(cutmix / double(n) - 0.5) < 0.03);

  // Pasting: inside the box sample i holds its partner's value, outside its own.
  MixupOptions cut_only;
  cut_only.mixup_alpha = 0.0;
  const MixupCutmix cm(cut_only, 5);
  const int64_t batch = 2;
  for (uint64_t step = 0; step < 20; ++step) {
    std::vector<float> v(batch * 1 * 8 * 8);
    for (size_t i = 0; i < v.size(); ++i) v[i] = i < 64 ? 1.0f : 2.0f;
    Tensor x = Tensor::from_vector(v, Shape{batch, 1, 8, 8});
    MixupDraw d;
    cm.apply(x, Tensor::from_vector(std::vector<int64_t>{0, 4}, Shape{batch}), 3, step, &d);
    const auto xv = x.to_vector<float>();
    double inside = 0;
    for (int y = 0; y < 8; ++y) {
      for (int xx = 0; xx < 8; ++xx) {
        const bool in = y >= d.box_y0 && y < d.box_y1 && xx >= d.box_x0 && xx < d.box_x1;
        REQUIRE(xv[y * 8 + xx] == (in ? 2.0f : 1.0f));
        inside += in;
      }
    }
    CHECK(d.lambda == Approx(1.0 - inside / 64.0));
  }
}

TEST_CASE("transforms: RandomErasing: rate p, one rectangle of N(0, 1) noise, deterministic",
          "[cpu][data]") {
  RandomErasingOptions always;
  always.probability = 1.0;
  const RandomErasing erase(always);
  Tensor x = Tensor::zeros(Shape{64, 3, 16, 16});
  erase.apply(x, 5, 9);
  const auto v = x.to_vector<float>();
  double sum = 0, sum2 = 0;
  int64_t erased = 0;
  for (int64_t n = 0; n < 64; ++n) {
    int y0 = 16, y1 = -1, x0 = 16, x1 = -1, count = 0;
    for (int y = 0; y < 16; ++y) {
      for (int xx = 0; xx < 16; ++xx) {
        if (v[((n * 3) * 16 + y) * 16 + xx] == 0.0f) continue;
        ++count;
        y0 = std::min(y0, y);
        y1 = std::max(y1, y);
        x0 = std::min(x0, xx);
        x1 = std::max(x1, xx);
      }
    }
    // Every sample has exactly one filled rectangle (noise is never exactly 0).
    REQUIRE(count > 0);
    CHECK(count == (y1 - y0 + 1) * (x1 - x0 + 1));
    CHECK(count < 16 * 16 * 0.45);
  }
  for (float f : v) {
    if (f == 0.0f) continue;
    ++erased;
    sum += f;
    sum2 += double(f) * f;
  }
  CHECK(std::abs(sum / erased) < 0.1);
  CHECK(std::abs(sum2 / erased - 1.0) < 0.1);
  Tensor again = Tensor::zeros(Shape{64, 3, 16, 16});
  erase.apply(again, 5, 9);
  CHECK(again.to_vector<float>() == v);

  const RandomErasing quarter(RandomErasingOptions{});
  Tensor y = Tensor::zeros(Shape{2000, 1, 8, 8});
  quarter.apply(y, 1, 0);
  const auto yv = y.to_vector<float>();
  int hit = 0;
  for (int n = 0; n < 2000; ++n) {
    bool any = false;
    for (int k = 0; k < 64; ++k) any |= yv[n * 64 + k] != 0.0f;
    hit += any;
  }
  CHECK(std::abs(hit / 2000.0 - 0.25) < 0.04);
}

TEST_CASE("transforms: read_train_augment builds the CIFAR and ImageNet recipes and checks keys",
          "[cpu][data]") {
  {
    Config cfg = Config::parse(
        "data:\n  augment: {randaugment: torchvision, crop_padding: 4, hflip: 0.5}\n");
    const TrainAugment a = read_train_augment(cfg.root()["data"], 32, 3, 10, {0.49, 0.48, 0.45});
    CHECK(a.steps == std::vector<std::string>{"RandAugment", "RandomCrop", "RandomHorizontalFlip"});
    CHECK_FALSE(a.erasing);
    CHECK_FALSE(a.mixup);
    CHECK_NOTHROW(cfg.check_unused());
    Image im = make_image(32, 32, 3, 60);
    SampleRng rng(1, 1);
    a.transform->apply(im, rng);
    CHECK(im.height == 32);
  }
  {
    Config cfg = Config::parse(
        "data:\n"
        "  augment: {randaugment: rand-m9-mstd0.5-inc1, hflip: 0.5, random_resized_crop: true,\n"
        "            color_jitter: 0.4, random_erasing: 0.25}\n"
        "  mixup: {mixup_alpha: 0.8, cutmix_alpha: 1.0, label_smoothing: 0.1}\n");
    const TrainAugment a =
        read_train_augment(cfg.root()["data"], 224, 3, 1000, {0.485, 0.456, 0.406});
    // timm turns colour jitter off when RandAugment is on.
    CHECK(a.steps ==
          std::vector<std::string>{"RandomResizedCrop", "RandomHorizontalFlip", "TimmRandAugment"});
    REQUIRE(a.erasing);
    CHECK(a.erasing->options().probability == 0.25);
    REQUIRE(a.mixup);
    CHECK(a.mixup->options().label_smoothing == 0.1);
    CHECK(a.mixup->num_classes() == 1000);
    CHECK_NOTHROW(cfg.check_unused());
    Tensor x = Tensor::zeros(Shape{4, 3, 8, 8});
    const Tensor t =
        a.apply_batch(x, Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, Shape{4}), 1, 2);
    CHECK(t.shape() == Shape{4, 1000});
  }
  {
    Config cfg = Config::parse("data: {}\n");
    const TrainAugment a = read_train_augment(cfg.root()["data"], 32, 3, 10, {});
    CHECK_FALSE(a.transform);
    CHECK(a.describe() == "none");
    Tensor x = Tensor::zeros(Shape{2, 3, 4, 4});
    const Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 1}, Shape{2});
    CHECK_FALSE(a.apply_batch(x, labels, 0, 0).defined());
  }
  {
    Config cfg = Config::parse("data:\n  augment: {hflip: 1.5}\n");
    REQUIRE_THROWS_WITH(read_train_augment(cfg.root()["data"], 32, 3, 10, {}),
                        Contains("data.augment.hflip"));
  }
  {
    Config cfg = Config::parse("data:\n  augment: {randaugment: rand-q3}\n");
    REQUIRE_THROWS_WITH(read_train_augment(cfg.root()["data"], 32, 3, 10, {}),
                        Contains("data.augment.randaugment") && Contains("unknown section"));
  }
  {
    Config cfg = Config::parse("data:\n  augment: {randaugment: autoaugment}\n");
    REQUIRE_THROWS_WITH(read_train_augment(cfg.root()["data"], 32, 3, 10, {}),
                        Contains("not a valid choice"));
  }
  {
    Config cfg = Config::parse("data:\n  augment: {hflp: 0.5}\n  mixup: {label_smothing: 0.1}\n");
    read_train_augment(cfg.root()["data"], 32, 3, 10, {});
    REQUIRE_THROWS_WITH(cfg.check_unused(), Contains("hflp") && Contains("label_smothing"));
  }
}

TEST_CASE("transforms: mixup, cutmix and erasing on CUDA match the CPU", "[cuda][data]") {
  if (!test::cuda_available_or_skip()) return;
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 2}, Shape{4});
  for (double cutmix_alpha : {0.0, 1.0}) {
    MixupOptions o;
    o.mixup_alpha = cutmix_alpha > 0 ? 0.0 : 0.8;
    o.cutmix_alpha = cutmix_alpha;
    const MixupCutmix mix(o, 4);
    Tensor cpu = test::uniform(Shape{4, 3, 8, 8}, 1, -1, 1, DType::kF32);
    Tensor gpu = cpu.to(Device::cuda(0));
    const Tensor t_cpu = mix.apply(cpu, labels, 2, 3);
    const Tensor t_gpu = mix.apply(gpu, labels.to(Device::cuda(0)), 2, 3);
    test::require_close(gpu, cpu, test::tolerance_for(DType::kF32), "mixed images");
    test::require_close(t_gpu, t_cpu, test::tolerance_for(DType::kF32), "soft targets");
  }
  RandomErasingOptions always;
  always.probability = 1.0;
  Tensor cpu = Tensor::zeros(Shape{4, 3, 8, 8});
  Tensor gpu = cpu.to(Device::cuda(0));
  RandomErasing(always).apply(cpu, 4, 5);
  RandomErasing(always).apply(gpu, 4, 5);
  test::require_close(gpu, cpu, test::tolerance_for(DType::kF32), "erased images");
}
