// PIL-compatible pixel operations: lookup tables, ImageEnhance blends, affine sampling (nearest,
// bilinear, bicubic with PIL's half-pixel centres and out-of-image fill), pad, crop, resize.
#include "data/transforms/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace ska::data {
namespace {

using Lut = std::array<uint8_t, 256>;

uint8_t clip8(double v) { return static_cast<uint8_t>(std::clamp(v, 0.0, 255.0)); }

Image make_like(const Image& image, int height, int width) {
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.assign(static_cast<size_t>(height) * width * image.channels, 0);
  return out;
}

void apply_lut(Image& image, const Lut& lut) {
  for (auto& p : image.pixels) p = lut[p];
}

// One table per channel.
void apply_luts(Image& image, const std::vector<Lut>& luts) {
  const size_t c = static_cast<size_t>(image.channels);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = luts[i % c][image.pixels[i]];
}

std::vector<std::array<int64_t, 256>> histograms(const Image& image) {
  std::vector<std::array<int64_t, 256>> h(image.channels);
  for (auto& a : h) a.fill(0);
  const size_t c = static_cast<size_t>(image.channels);
  for (size_t i = 0; i < image.pixels.size(); ++i) ++h[i % c][image.pixels[i]];
  return h;
}

Lut identity_lut() {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i);
  return lut;
}

// PIL's Image.blend(degenerate, image, factor): float32 arithmetic, truncated, clipped.
void blend_with(Image& image, const std::vector<uint8_t>& degenerate, double factor) {
  const float alpha = static_cast<float>(factor);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const float a = degenerate[i], b = image.pixels[i];
    const float v = a + alpha * (b - a);
    image.pixels[i] = v <= 0.0f ? 0 : v >= 255.0f ? 255 : static_cast<uint8_t>(v);
  }
}

std::vector<uint8_t> fill_per_channel(const std::vector<uint8_t>& fill, int channels) {
  std::vector<uint8_t> out(channels, 0);
  for (int c = 0; c < channels; ++c) {
    if (!fill.empty())
      out[c] = fill.size() == 1 ? fill[0] : fill[std::min<size_t>(c, fill.size() - 1)];
  }
  return out;
}

// Cubic convolution weight. PIL's affine transform uses a = -1 (its resize uses -0.5); checked
// against Pillow 9.4 by tests/fixtures/augment.
double cubic_weight(double t) {
  constexpr double a = -1.0;
  t = std::abs(t);
  if (t < 1.0) return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
  if (t < 2.0) return (((t - 5.0) * t + 8.0) * t - 4.0) * a;
  return 0.0;
}

// Samples `in` at continuous (xin, yin) (pixel centres at +0.5). False: outside, use the fill.
bool sample(const Image& in, double xin, double yin, Resample resample, uint8_t* out) {
  const int w = in.width, h = in.height, ch = in.channels;
  if (resample == Resample::kNearest) {
    const int x = xin < 0.0 ? -1 : static_cast<int>(xin);
    const int y = yin < 0.0 ? -1 : static_cast<int>(yin);
    if (x < 0 || x >= w || y < 0 || y >= h) return false;
    for (int c = 0; c < ch; ++c) out[c] = in.at(y, x, c);
    return true;
  }
  if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) return false;
  xin -= 0.5;
  yin -= 0.5;
  const int x0 = static_cast<int>(std::floor(xin)), y0 = static_cast<int>(std::floor(yin));
  const double dx = xin - x0, dy = yin - y0;
  auto xc = [w](int x) { return std::clamp(x, 0, w - 1); };
  auto yc = [h](int y) { return std::clamp(y, 0, h - 1); };
  // The taps' rows and columns (clamped at the border) and weights, once per output pixel; the
  // sums below keep the order (and so the rounding) of a per-channel double loop.
  const int taps = resample == Resample::kBilinear ? 2 : 4,
            first = resample == Resample::kBilinear ? 0 : -1;
  int cols[4], rows[4];
  double wx[4], wy[4];
  for (int i = 0; i < taps; ++i) {
    cols[i] = xc(x0 + first + i);
    rows[i] = yc(y0 + first + i);
    if (resample == Resample::kBilinear) {
      wx[i] = i == 0 ? 1.0 - dx : dx;
      wy[i] = i == 0 ? 1.0 - dy : dy;
    } else {
      wx[i] = cubic_weight(first + i - dx);
      wy[i] = cubic_weight(first + i - dy);
    }
  }
  const uint8_t* base = in.pixels.data();
  for (int c = 0; c < ch; ++c) {
    double v = 0.0;
    for (int j = 0; j < taps; ++j) {
      const uint8_t* r = base + static_cast<size_t>(rows[j]) * w * ch + c;
      for (int i = 0; i < taps; ++i) v += wx[i] * wy[j] * r[static_cast<size_t>(cols[i]) * ch];
    }
    out[c] = clip8(v);  // PIL truncates
  }
  return true;
}

}  // namespace

void image_posterize(Image& image, int bits) {
  SKA_CHECK(bits >= 0 && bits <= 8, ValueError, "posterize: bits must be in [0, 8], got ", bits);
  const int mask = ~((1 << (8 - bits)) - 1) & 0xFF;
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i & mask);
  apply_lut(image, lut);
}

void image_solarize(Image& image, double threshold) {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i < threshold ? i : 255 - i);
  apply_lut(image, lut);
}

void image_solarize_add(Image& image, int add, int threshold) {
  Lut lut;
  for (int i = 0; i < 256; ++i)
    lut[i] = static_cast<uint8_t>(i < threshold ? std::min(255, i + add) : i);
  apply_lut(image, lut);
}

void image_invert(Image& image) {
  for (auto& p : image.pixels) p = static_cast<uint8_t>(255 - p);
}

void image_autocontrast(Image& image) {
  std::vector<Lut> luts;
  for (const auto& h : histograms(image)) {
    int lo = 0, hi = 255;
    while (lo < 256 && h[lo] == 0) ++lo;
    while (hi >= 0 && h[hi] == 0) --hi;
    if (hi <= lo) {
      luts.push_back(identity_lut());
      continue;
    }
    const double scale = 255.0 / (hi - lo), offset = -lo * scale;
    Lut lut;
    for (int i = 0; i < 256; ++i) {
      lut[i] = static_cast<uint8_t>(std::clamp(static_cast<int>(i * scale + offset), 0, 255));
    }
    luts.push_back(lut);
  }
  apply_luts(image, luts);
}

void image_equalize(Image& image) {
  std::vector<Lut> luts;
  for (const auto& h : histograms(image)) {
    int64_t total = 0, last = 0, nonzero = 0;
    for (int i = 0; i < 256; ++i) {
      if (h[i] == 0) continue;
      total += h[i];
      last = h[i];
      ++nonzero;
    }
    const int64_t step = (total - last) / 255;
    if (nonzero <= 1 || step == 0) {
      luts.push_back(identity_lut());
      continue;
    }
    Lut lut;
    int64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      lut[i] = static_cast<uint8_t>(std::min<int64_t>(255, n / step));
      n += h[i];
    }
    luts.push_back(lut);
  }
  apply_luts(image, luts);
}

uint8_t grey_level(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

namespace {
std::vector<uint8_t> grey_of(const Image& image) {
  const size_t n = static_cast<size_t>(image.height) * image.width;
  std::vector<uint8_t> g(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &image.pixels[i * image.channels];
    g[i] = image.channels == 3 ? grey_level(p[0], p[1], p[2]) : p[0];
  }
  return g;
}
}  // namespace

void image_brightness(Image& image, double factor) {
  blend_with(image, std::vector<uint8_t>(image.pixels.size(), 0), factor);
}

void image_color(Image& image, double factor) {
  const std::vector<uint8_t> grey = grey_of(image);
  std::vector<uint8_t> degenerate(image.pixels.size());
  for (size_t i = 0; i < degenerate.size(); ++i) degenerate[i] = grey[i / image.channels];
  blend_with(image, degenerate, factor);
}

void image_contrast(Image& image, double factor) {
  const std::vector<uint8_t> grey = grey_of(image);
  double sum = 0.0;
  for (uint8_t g : grey) sum += g;
  const int mean = grey.empty() ? 0 : static_cast<int>(sum / grey.size() + 0.5);
  blend_with(image, std::vector<uint8_t>(image.pixels.size(), static_cast<uint8_t>(mean)), factor);
}

void image_sharpness(Image& image, double factor) {
  // PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 on the interior; the border is copied.
  std::vector<uint8_t> degenerate = image.pixels;
  const int h = image.height, w = image.width, ch = image.channels;
  const float k_side = 1.0f / 13.0f, k_centre = 5.0f / 13.0f;
  for (int y = 1; y < h - 1; ++y) {
    for (int x = 1; x < w - 1; ++x) {
      for (int c = 0; c < ch; ++c) {
        float s = 0.0f;
        for (int dy = -1; dy <= 1; ++dy) {
          for (int dx = -1; dx <= 1; ++dx) {
            s += static_cast<float>(image.at(y + dy, x + dx, c)) *
                 (dx == 0 && dy == 0 ? k_centre : k_side);
          }
        }
        degenerate[(static_cast<size_t>(y) * w + x) * ch + c] =
            s <= 0.0f     ? 0
            : s >= 255.0f ? 255
                          : static_cast<uint8_t>(s + 0.5f);
      }
    }
  }
  blend_with(image, degenerate, factor);
}

void image_affine(Image& image, const std::array<double, 6>& m, Resample resample,
                  const std::vector<uint8_t>& fill) {
  const std::vector<uint8_t> f = fill_per_channel(fill, image.channels);
  Image out = image;
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      const double xs = x + 0.5, ys = y + 0.5;
      const double xin = m[0] * xs + m[1] * ys + m[2], yin = m[3] * xs + m[4] * ys + m[5];
      uint8_t* dst = &out.at(y, x, 0);
      if (!sample(image, xin, yin, resample, dst)) std::copy(f.begin(), f.end(), dst);
    }
  }
  image.pixels.swap(out.pixels);
}

void image_rotate(Image& image, double degrees, Resample resample,
                  const std::vector<uint8_t>& fill) {
  // PIL: the inverse map about the centre, coefficients rounded to 15 decimals.
  const double a = -degrees * M_PI / 180.0;
  auto r15 = [](double v) { return std::round(v * 1e15) / 1e15; };
  const double c = r15(std::cos(a)), s = r15(std::sin(a));
  const double cx = image.width / 2.0, cy = image.height / 2.0;
  std::array<double, 6> m{c, s, 0.0, -s, c, 0.0};
  m[2] = c * -cx + s * -cy + cx;
  m[5] = -s * -cx + c * -cy + cy;
  image_affine(image, m, resample, fill);
}

void image_hflip(Image& image) {
  const int c = image.channels;
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width / 2; ++x) {
      const int mirror = image.width - 1 - x;
      for (int k = 0; k < c; ++k) std::swap(image.at(y, x, k), image.at(y, mirror, k));
    }
  }
}

void image_pad(Image& image, int top, int bottom, int left, int right, uint8_t fill) {
  SKA_CHECK(top >= 0 && bottom >= 0 && left >= 0 && right >= 0, ValueError,
            "pad: negative padding");
  Image out;
  out.height = image.height + top + bottom;
  out.width = image.width + left + right;
  out.channels = image.channels;
  out.pixels.assign(static_cast<size_t>(out.height) * out.width * out.channels, fill);
  const size_t row = static_cast<size_t>(image.width) * image.channels;
  for (int y = 0; y < image.height; ++y) {
    std::copy_n(&image.pixels[y * row], row, &out.at(y + top, left, 0));
  }
  image = std::move(out);
}

void image_crop(Image& image, int top, int left, int height, int width) {
  SKA_CHECK(top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= image.height &&
                left + width <= image.width,
            ValueError, "crop: window (", top, ", ", left, ", ", height, ", ", width,
            ") outside a ", image.height, "x", image.width, " image");
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(height) * width * image.channels);
  const size_t row = static_cast<size_t>(width) * image.channels;
  for (int y = 0; y < height; ++y)
    std::copy_n(&image.at(top + y, left, 0), row, &out.pixels[y * row]);
  image = std::move(out);
}

namespace {

// PIL's separable resampling coefficients for one axis (Resample.c): the filter is stretched by
// the downscale factor (antialiasing), normalised, then quantised to 22-bit fixed point.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct AxisCoeffs {
  std::vector<int> start, count;
  std::vector<std::vector<int32_t>> weights;
};

AxisCoeffs resample_coeffs(int in_size, int out_size, Resample resample) {
  const double support_base = resample == Resample::kBicubic ? 2.0 : 1.0;
  auto filter = [resample](double x) {
    x = std::abs(x);
    if (resample == Resample::kBilinear) return x < 1.0 ? 1.0 - x : 0.0;
    constexpr double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
  };
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = support_base * filter_scale;
  AxisCoeffs c;
  for (int o = 0; o < out_size; ++o) {
    const double centre = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(centre - support + 0.5));
    const int hi = std::min(in_size, static_cast<int>(centre + support + 0.5));
    std::vector<double> w(std::max(0, hi - lo));
    double total = 0.0;
    for (int i = lo; i < hi; ++i) total += w[i - lo] = filter((i - centre + 0.5) / filter_scale);
    std::vector<int32_t> q(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      const double v = (total != 0.0 ? w[i] / total : w[i]) * (1 << kPrecisionBits);
      q[i] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    c.start.push_back(lo);
    c.count.push_back(hi - lo);
    c.weights.push_back(std::move(q));
  }
  return c;
}

constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);  // rounds the fixed-point sum

uint8_t fixed_to_u8(int32_t acc) {
  return static_cast<uint8_t>(std::clamp<int32_t>(acc >> kPrecisionBits, 0, 255));
}

}  // namespace

void image_resize(Image& image, int height, int width, Resample resample) {
  SKA_CHECK(height > 0 && width > 0, ValueError, "resize: target size must be positive");
  if (height == image.height && width == image.width) return;
  const int ch = image.channels;
  if (resample == Resample::kNearest) {
    Image out = make_like(image, height, width);
    for (int y = 0; y < height; ++y) {
      const int sy =
          std::min(image.height - 1, static_cast<int>((y + 0.5) * image.height / height));
      for (int x = 0; x < width; ++x) {
        const int sx = std::min(image.width - 1, static_cast<int>((x + 0.5) * image.width / width));
        std::copy_n(&image.at(sy, sx, 0), ch, &out.at(y, x, 0));
      }
    }
    image = std::move(out);
    return;
  }
  // PIL order: the horizontal pass (rounded to uint8), then the vertical one. Sums are int32 as
  // in PIL: the weights of one output sum to 2^22, so 255 x their absolute sum stays below 2^31.
  if (width != image.width) {
    const AxisCoeffs cx = resample_coeffs(image.width, width, resample);
    Image out = make_like(image, image.height, width);
    const size_t in_row = static_cast<size_t>(image.width) * ch,
                 out_row = static_cast<size_t>(width) * ch;
    for (int y = 0; y < image.height; ++y) {
      const uint8_t* src = &image.pixels[y * in_row];
      uint8_t* dst = &out.pixels[y * out_row];
      for (int x = 0; x < width; ++x) {
        const int32_t* w = cx.weights[x].data();
        const uint8_t* p = src + static_cast<size_t>(cx.start[x]) * ch;
        const int n = cx.count[x];
        if (ch == 3) {
          int32_t a0 = kHalf, a1 = kHalf, a2 = kHalf;
          for (int k = 0; k < n; ++k, p += 3) {
            a0 += p[0] * w[k];
            a1 += p[1] * w[k];
            a2 += p[2] * w[k];
          }
          dst[3 * x] = fixed_to_u8(a0);
          dst[3 * x + 1] = fixed_to_u8(a1);
          dst[3 * x + 2] = fixed_to_u8(a2);
        } else {
          for (int c = 0; c < ch; ++c) {
            int32_t acc = kHalf;
            for (int k = 0; k < n; ++k) acc += p[k * ch + c] * w[k];
            dst[x * ch + c] = fixed_to_u8(acc);
          }
        }
      }
    }
    image = std::move(out);
  }
  if (height != image.height) {
    // Row by row: each output row is a weighted sum of whole input rows (contiguous, vectorised).
    const AxisCoeffs cy = resample_coeffs(image.height, height, resample);
    Image out = make_like(image, height, image.width);
    const size_t row = static_cast<size_t>(image.width) * ch;
    std::vector<int32_t> acc(row);
    for (int y = 0; y < height; ++y) {
      std::fill(acc.begin(), acc.end(), kHalf);
      for (int k = 0; k < cy.count[y]; ++k) {
        const uint8_t* src = &image.pixels[(cy.start[y] + k) * row];
        const int32_t w = cy.weights[y][k];
        for (size_t i = 0; i < row; ++i) acc[i] += src[i] * w;
      }
      uint8_t* dst = &out.pixels[y * row];
      for (size_t i = 0; i < row; ++i) dst[i] = fixed_to_u8(acc[i]);
    }
    image = std::move(out);
  }
}

}  // namespace ska::data
