// Heat maps over images: colour scale, image tensors as pixels, bilinear upsampling and blending.
#include "io/heatmap.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ska::io {
namespace {

uint8_t to_byte(double v) {
  return static_cast<uint8_t>(std::lround(std::min(255.0, std::max(0.0, v))));
}

// Bilinear sample of a row-major h x w grid at continuous (y, x), pixel centres at +0.5.
double sample(const std::vector<float>& g, int64_t h, int64_t w, double y, double x) {
  y = std::min(std::max(y - 0.5, 0.0), static_cast<double>(h - 1));
  x = std::min(std::max(x - 0.5, 0.0), static_cast<double>(w - 1));
  const auto y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x);
  const int64_t y1 = std::min(y0 + 1, h - 1), x1 = std::min(x0 + 1, w - 1);
  const double fy = y - static_cast<double>(y0), fx = x - static_cast<double>(x0);
  auto at = [&](int64_t r, int64_t c) { return static_cast<double>(g[r * w + c]); };
  return (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) +
         fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1));
}

}  // namespace

Rgb heat_color(double v) {
  v = std::min(1.0, std::max(0.0, v));
  // Piecewise-linear jet: the three channels rise and fall over quarters of the range.
  auto ramp = [](double t) { return std::min(1.0, std::max(0.0, t)); };
  const double r = ramp(std::min(4 * v - 1.5, -4 * v + 4.5));
  const double g = ramp(std::min(4 * v - 0.5, -4 * v + 3.5));
  const double b = ramp(std::min(4 * v + 0.5, -4 * v + 2.5));
  return {to_byte(255 * r), to_byte(255 * g), to_byte(255 * b)};
}

RgbImage tensor_image(const Tensor& chw, int width, int height) {
  SKA_CHECK(chw.dim() == 3 && (chw.size(0) == 1 || chw.size(0) == 3), ShapeError,
            "tensor_image: expected [1 or 3, H, W], got ", chw.str());
  const int64_t c = chw.size(0), h = chw.size(1), w = chw.size(2);
  const std::vector<float> v =
      chw.to(Device::cpu()).to(DType::kF32).contiguous().to_vector<float>();
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double span = *hi > *lo ? *hi - *lo : 1.0;
  RgbImage image(width, height, Rgb{});
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const int64_t sy = y * h / height, sx = x * w / width;
      uint8_t px[3];
      for (int64_t k = 0; k < 3; ++k) {
        const float value = v[static_cast<size_t>(((c == 1 ? 0 : k) * h + sy) * w + sx)];
        px[k] = to_byte(255.0 * (value - *lo) / span);
      }
      image.set(x, y, Rgb{px[0], px[1], px[2]});
    }
  }
  return image;
}

RgbImage overlay_heat(const RgbImage& base, const Tensor& grid, double alpha) {
  SKA_CHECK(grid.dim() == 2, ShapeError, "overlay_heat: expected a grid [h, w], got ", grid.str());
  const int64_t h = grid.size(0), w = grid.size(1);
  const std::vector<float> g =
      grid.to(Device::cpu()).to(DType::kF32).contiguous().to_vector<float>();
  const float peak = std::max(*std::max_element(g.begin(), g.end()), 1e-12f);
  RgbImage out(base.width(), base.height(), Rgb{});
  for (int y = 0; y < base.height(); ++y) {
    for (int x = 0; x < base.width(); ++x) {
      const double v = sample(g, h, w, (y + 0.5) * h / base.height(), (x + 0.5) * w / base.width());
      const Rgb heat = heat_color(v / peak), b = base.at(x, y);
      const double grey = 0.299 * b.r + 0.587 * b.g + 0.114 * b.b;
      out.set(x, y,
              Rgb{to_byte(alpha * heat.r + (1 - alpha) * grey),
                  to_byte(alpha * heat.g + (1 - alpha) * grey),
                  to_byte(alpha * heat.b + (1 - alpha) * grey)});
    }
  }
  return out;
}

void draw_marker(RgbImage& image, int x, int y, int radius) {
  for (int d = -radius - 1; d <= radius + 1; ++d) {
    for (int edge : {-radius - 1, radius + 1}) {  // black frame
      image.set(x + d, y + edge, Rgb{0, 0, 0});
      image.set(x + edge, y + d, Rgb{0, 0, 0});
    }
    if (d < -radius || d > radius) continue;
    for (int edge : {-radius, radius}) {  // white square
      image.set(x + d, y + edge, Rgb{255, 255, 255});
      image.set(x + edge, y + d, Rgb{255, 255, 255});
    }
  }
}

void paste(RgbImage& canvas, const RgbImage& cell, int x, int y) {
  for (int r = 0; r < cell.height(); ++r) {
    for (int c = 0; c < cell.width(); ++c) canvas.set(x + c, y + r, cell.at(c, r));
  }
}

}  // namespace ska::io
