// Tests of the PNG writer and the line charts: files decoded by libpng (an independent decoder)
// have the size, pixels and curves we drew.
#include <catch2/catch.hpp>
#include <filesystem>

#include "data/datasets/image_folder.h"
#include "io/plot.h"
#include "io/png.h"
#include "train/train_test_util.h"

namespace {

using namespace ska;

// Pixel (x, y) of an RGB uint8 [H, W, 3] image.
io::Rgb pixel(const Tensor& rgb, int x, int y) {
  const uint8_t* v = rgb.data<uint8_t>() + (static_cast<int64_t>(y) * rgb.size(1) + x) * 3;
  return {v[0], v[1], v[2]};
}

// True when some pixel within `radius` of (x, y) has colour c.
bool near(const Tensor& rgb, int x, int y, io::Rgb c, int radius = 1) {
  for (int dy = -radius; dy <= radius; ++dy) {
    for (int dx = -radius; dx <= radius; ++dx) {
      if (pixel(rgb, x + dx, y + dy) == c) return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("write_png writes an RGB image libpng decodes exactly", "[cpu][io][png]") {
  const std::string dir = test::train_scratch_dir("png");
  io::RgbImage img(7, 5, {10, 20, 30});
  img.set(0, 0, {255, 0, 0});
  img.set(6, 4, {0, 255, 1});
  img.set(3, 2, {1, 2, 3});
  img.set(-1, 9, {9, 9, 9});  // outside: ignored
  io::write_png(dir + "/a.png", img);
  const Tensor m = data::decode_image_rgb(dir + "/a.png");
  REQUIRE(m.shape() == Shape{5, 7, 3});
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) CHECK(pixel(m, x, y) == img.at(x, y));
  }
  CHECK(pixel(m, 0, 0) == io::Rgb{255, 0, 0});
  CHECK(pixel(m, 6, 4) == io::Rgb{0, 255, 1});
  REQUIRE_THROWS_AS(io::RgbImage(0, 3, {}), ValueError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("plot_panels draws each series where its data lies", "[cpu][io][png]") {
  const std::string dir = test::train_scratch_dir("plot");
  io::PlotPanel loss{
      "train loss", "epoch", {{"train", {0, 1, 2, 3}, {2.3, 1.1, 0.7, 0.6}, io::kPlotBlue}}};
  io::PlotPanel top1{"eval top-1 (%)",
                     "epoch",
                     {{"model", {0, 1, 2, 3}, {60, 75, NAN, 82.5}, io::kPlotBlue},
                      {"EMA", {0, 1, 2, 3}, {50, 70, 78, 80}, io::kPlotOrange}}};
  std::vector<io::PlotFrame> frames;
  io::write_png(dir + "/c.png", io::plot_panels({loss, top1}, 400, 300, &frames));
  const Tensor m = data::decode_image_rgb(dir + "/c.png");
  REQUIRE(m.shape() == Shape{300, 800, 3});
  REQUIRE(frames.size() == 2);
  CHECK(frames[1].left > 400);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(near(m, frames[0].px(loss.series[0].x[i]), frames[0].py(loss.series[0].y[i]),
               io::kPlotBlue));
    CHECK(near(m, frames[1].px(top1.series[1].x[i]), frames[1].py(top1.series[1].y[i]),
               io::kPlotOrange));
  }
  // Half-way along a segment of the loss curve lies the line, not background.
  const int xm = (frames[0].px(0) + frames[0].px(1)) / 2,
            ym = (frames[0].py(2.3) + frames[0].py(1.1)) / 2;
  CHECK(near(m, xm, ym, io::kPlotBlue, 2));
  // The axis ranges hold the data; tick labels and titles left dark pixels beside the plot area.
  CHECK(frames[0].y_min <= 0.6);
  CHECK(frames[0].y_max >= 2.3);
  int dark = 0;
  for (int y = 0; y < 300; ++y) {
    for (int x = 0; x < frames[0].left - 2; ++x) dark += pixel(m, x, y).r < 100;
  }
  CHECK(dark > 50);
  CHECK(pixel(m, 2, 2) == io::kPlotBackground);
  std::filesystem::remove_all(dir);
}
