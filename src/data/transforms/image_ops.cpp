// PIL-compatible pixel operations: lookup tables, ImageEnhance blends, affine sampling (nearest,
// bilinear, bicubic with PIL's half-pixel centres and out-of-image fill), pad, crop, resize.
#include "data/transforms/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "core/simd_clones.h"

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
  if (ch == 3) {  // RGB: the three sums side by side, each in the per-channel loop's order
    double v0 = 0.0, v1 = 0.0, v2 = 0.0;
    for (int j = 0; j < taps; ++j) {
      const uint8_t* r = base + static_cast<size_t>(rows[j]) * w * 3;
      for (int i = 0; i < taps; ++i) {
        const double weight = wx[i] * wy[j];
        const uint8_t* p = r + static_cast<size_t>(cols[i]) * 3;
        v0 += weight * p[0];
        v1 += weight * p[1];
        v2 += weight * p[2];
      }
    }
    out[0] = clip8(v0);  // PIL truncates
    out[1] = clip8(v1);
    out[2] = clip8(v2);
    return true;
  }
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
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);  // rounds the fixed-point sum

// Every output reads the same number of inputs, `taps` (the widest filter of the axis): output o
// reads inputs [start[o], start[o] + taps) with weights[o * taps ...]. PIL's own window of an
// output is narrower near the edges; it is placed inside this one with zero weights around it
// (integer sums, so the zeros change nothing), and the loops below get a fixed trip count.
struct AxisCoeffs {
  int taps = 0;
  std::vector<int> start;
  std::vector<int32_t> weights;
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
  std::vector<int> lo_of(out_size), hi_of(out_size);
  int taps = 1;
  for (int o = 0; o < out_size; ++o) {
    const double centre = (o + 0.5) * scale;
    lo_of[o] = std::max(0, static_cast<int>(centre - support + 0.5));
    hi_of[o] = std::min(in_size, static_cast<int>(centre + support + 0.5));
    taps = std::max(taps, hi_of[o] - lo_of[o]);
  }
  taps = std::min(taps, in_size);
  AxisCoeffs c;
  c.taps = taps;
  c.start.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * taps, 0);
  for (int o = 0; o < out_size; ++o) {
    const double centre = (o + 0.5) * scale;
    const int lo = lo_of[o], hi = hi_of[o];
    std::vector<double> w(std::max(0, hi - lo));
    double total = 0.0;
    for (int i = lo; i < hi; ++i) total += w[i - lo] = filter((i - centre + 0.5) / filter_scale);
    const int start = std::min(lo, in_size - taps);
    c.start[o] = start;
    int32_t* q = &c.weights[static_cast<size_t>(o) * taps + (lo - start)];
    for (size_t i = 0; i < w.size(); ++i) {
      const double v = (total != 0.0 ? w[i] / total : w[i]) * (1 << kPrecisionBits);
      q[i] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
  }
  return c;
}

// A sum of 22-bit fixed-point products (kHalf included) to uint8, as PIL clips it.
inline uint8_t fixed_to_u8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The horizontal pass works on tiles of kTileLanes bytes per input column: kTileLanes / channels
// rows of one column's pixels side by side, so that every output column is a weighted sum of
// whole tile columns, one vector operation per tap for all of those rows (48 lanes: 16 RGB rows).
constexpr int kTileLanes = 48;

// out[o][i] = fixed_to_u8(kHalf + sum over k of tile[start[o] + k][i] * w[o][k]) for the
// `outputs` outputs, i < kTileLanes. Sums are int32 as in PIL (the weights of one output sum to
// 2^22, so 255 x their absolute sum stays below 2^31): exact in any order, so vector lanes give
// PIL's bits.
SKA_CPU_SIMD_CLONES
void weighted_tile_columns(const uint8_t* tile, const int* start, const int32_t* weights, int taps,
                           int outputs, uint8_t* out) {
  for (int o = 0; o < outputs; ++o) {
    int32_t acc[kTileLanes];
    for (int i = 0; i < kTileLanes; ++i) acc[i] = kHalf;
    const uint8_t* column = tile + static_cast<size_t>(start[o]) * kTileLanes;
    const int32_t* w = weights + static_cast<size_t>(o) * taps;
    for (int k = 0; k < taps; ++k, column += kTileLanes) {
      const int32_t wk = w[k];
      for (int i = 0; i < kTileLanes; ++i) acc[i] += column[i] * wk;
    }
    uint8_t* dst = out + static_cast<size_t>(o) * kTileLanes;
    for (int i = 0; i < kTileLanes; ++i) dst[i] = fixed_to_u8(acc[i]);
  }
}

// out row o (len bytes) = fixed_to_u8(kHalf + sum over k of row (start[o] + k) of src * w[o][k]),
// src's rows `stride` bytes apart; acc: len int32 of scratch.
SKA_CPU_SIMD_CLONES
void weighted_rows(const uint8_t* src, size_t stride, size_t len, const int* start,
                   const int32_t* weights, int taps, int outputs, uint8_t* out, int32_t* acc) {
  for (int o = 0; o < outputs; ++o) {
    for (size_t i = 0; i < len; ++i) acc[i] = kHalf;
    const int32_t* w = weights + static_cast<size_t>(o) * taps;
    for (int k = 0; k < taps; ++k) {
      const uint8_t* row = src + static_cast<size_t>(start[o] + k) * stride;
      const int32_t wk = w[k];
      for (size_t i = 0; i < len; ++i) acc[i] += row[i] * wk;
    }
    uint8_t* dst = out + static_cast<size_t>(o) * len;
    for (size_t i = 0; i < len; ++i) dst[i] = fixed_to_u8(acc[i]);
  }
}

// Rows [top, top + height) x columns [left, left + width) of an image, read in place.
struct Window {
  const uint8_t* origin;  // pixel (top, left)
  size_t stride;          // bytes between rows
  int height, width, channels;
};

Window window_of(const Image& image, int top, int left, int height, int width) {
  const size_t stride = static_cast<size_t>(image.width) * image.channels;
  return {image.pixels.data() + top * stride + static_cast<size_t>(left) * image.channels, stride,
          height, width, image.channels};
}

// Copies `count` pixels of kCh bytes: pixel x from src + x * kCh * src_step to dst + x * dst_step.
template <int kCh>
void interleave_pixels(const uint8_t* src, int src_step, uint8_t* dst, int dst_step, int count) {
  for (int x = 0; x < count; ++x, src += kCh * src_step, dst += dst_step)
    for (int c = 0; c < kCh; ++c) dst[c] = src[c];
}

// Calls f(std::integral_constant<int, ch>{}) for 1 to 4 channels (each divides kTileLanes).
template <typename F>
void with_channels(int ch, F&& f) {
  switch (ch) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      SKA_FAIL(ValueError, "resize: the tiled pass takes 1 to 4 channels, not ", ch);
  }
}

// PIL's horizontal pass over a window to `width` columns: [window.height, width, channels].
Image resample_horizontal(const Window& in, int width, Resample resample) {
  const AxisCoeffs cx = resample_coeffs(in.width, width, resample);
  const int ch = in.channels;
  Image out;
  out.height = in.height;
  out.width = width;
  out.channels = ch;
  out.pixels.resize(static_cast<size_t>(in.height) * width * ch);
  const size_t out_row = static_cast<size_t>(width) * ch;
  if (ch > 4) {  // no image of this project: sample by sample
    for (int y = 0; y < in.height; ++y) {
      const uint8_t* src = in.origin + y * in.stride;
      for (int x = 0; x < width; ++x) {
        const int32_t* w = &cx.weights[static_cast<size_t>(x) * cx.taps];
        for (int c = 0; c < ch; ++c) {
          int32_t acc = kHalf;
          for (int k = 0; k < cx.taps; ++k) acc += src[(cx.start[x] + k) * ch + c] * w[k];
          out.pixels[y * out_row + static_cast<size_t>(x) * ch + c] = fixed_to_u8(acc);
        }
      }
    }
    return out;
  }
  const int rows_per_tile = kTileLanes / ch;
  std::vector<uint8_t> tile(static_cast<size_t>(in.width) * kTileLanes, 0);
  std::vector<uint8_t> sums(static_cast<size_t>(width) * kTileLanes);
  for (int y0 = 0; y0 < in.height; y0 += rows_per_tile) {
    const int rows = std::min(rows_per_tile, in.height - y0);
    // Tile column x: pixel x of rows y0.. side by side (past the window's last row, stale bytes
    // whose sums are never stored).
    with_channels(ch, [&](auto channels) {
      constexpr int kCh = decltype(channels)::value;
      for (int r = 0; r < rows; ++r) {
        interleave_pixels<kCh>(in.origin + (y0 + r) * in.stride, 1, tile.data() + r * kCh,
                               kTileLanes, in.width);
      }
    });
    weighted_tile_columns(tile.data(), cx.start.data(), cx.weights.data(), cx.taps, width,
                          sums.data());
    with_channels(ch, [&](auto channels) {
      constexpr int kCh = decltype(channels)::value;
      for (int r = 0; r < rows; ++r) {
        interleave_pixels<kCh>(sums.data() + r * kCh, kTileLanes / kCh,
                               &out.pixels[(y0 + r) * out_row], kCh, width);
      }
    });
  }
  return out;
}

// PIL's vertical pass over a window to `height` rows: each output row a weighted sum of whole
// input rows.
Image resample_vertical(const Window& in, int height, Resample resample) {
  const AxisCoeffs cy = resample_coeffs(in.height, height, resample);
  Image out;
  out.height = height;
  out.width = in.width;
  out.channels = in.channels;
  const size_t row = static_cast<size_t>(in.width) * in.channels;
  out.pixels.resize(height * row);
  std::vector<int32_t> acc(row);
  weighted_rows(in.origin, in.stride, row, cy.start.data(), cy.weights.data(), cy.taps, height,
                out.pixels.data(), acc.data());
  return out;
}

}  // namespace

void image_resize(Image& image, int height, int width, Resample resample) {
  image_resized_crop(image, 0, 0, image.height, image.width, height, width, resample);
}

void image_resized_crop(Image& image, int top, int left, int crop_height, int crop_width,
                        int height, int width, Resample resample) {
  SKA_CHECK(height > 0 && width > 0, ValueError, "resize: target size must be positive");
  SKA_CHECK(top >= 0 && left >= 0 && crop_height > 0 && crop_width > 0 &&
                top + crop_height <= image.height && left + crop_width <= image.width,
            ValueError, "resized crop: window (", top, ", ", left, ", ", crop_height, ", ",
            crop_width, ") outside a ", image.height, "x", image.width, " image");
  if (crop_height == image.height && crop_width == image.width && height == image.height &&
      width == image.width) {
    return;
  }
  const int ch = image.channels;
  if (resample == Resample::kNearest) {
    Image out = make_like(image, height, width);
    for (int y = 0; y < height; ++y) {
      const int sy = std::min(crop_height - 1, static_cast<int>((y + 0.5) * crop_height / height));
      for (int x = 0; x < width; ++x) {
        const int sx = std::min(crop_width - 1, static_cast<int>((x + 0.5) * crop_width / width));
        std::copy_n(&image.at(top + sy, left + sx, 0), ch, &out.at(y, x, 0));
      }
    }
    image = std::move(out);
    return;
  }
  // PIL order: the horizontal pass (rounded to uint8), then the vertical one; an axis whose size
  // does not change is only cropped, as when PIL resizes a crop.
  Window window = window_of(image, top, left, crop_height, crop_width);
  Image mid;
  if (width != crop_width) {
    mid = resample_horizontal(window, width, resample);
    window = window_of(mid, 0, 0, mid.height, mid.width);
  }
  if (height != crop_height) {
    image = resample_vertical(window, height, resample);
  } else if (width != crop_width) {
    image = std::move(mid);
  } else {
    image_crop(image, top, left, crop_height, crop_width);
  }
}

}  // namespace ska::data
