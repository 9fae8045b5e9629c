// Deterministic pixel operations on uint8 HWC images with PIL's semantics (the reference that
// torchvision's and timm's augmentations call): lookup-table ops, enhance blends, affine warps.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "data/transforms/transform.h"

namespace ska::data {

enum class Resample { kNearest, kBilinear, kBicubic };

// --- Lookup-table ops (every channel independently) ---
void image_posterize(Image& image, int bits);         // keeps the `bits` high bits (0..8)
void image_solarize(Image& image, double threshold);  // v >= threshold -> 255 - v
void image_solarize_add(Image& image, int add, int threshold = 128);  // v < threshold -> v + add
void image_invert(Image& image);
void image_autocontrast(Image& image);  // per channel min..max stretched to 0..255 (PIL cutoff 0)
void image_equalize(Image& image);      // per channel histogram equalisation (PIL's ImageOps)

// --- PIL ImageEnhance: blend(degenerate, image, factor), truncated and clipped to 0..255 ---
void image_brightness(Image& image, double factor);  // degenerate: black
void image_color(Image& image, double factor);       // degenerate: the grey (L) image
void image_contrast(Image& image, double factor);    // degenerate: the rounded mean grey level
void image_sharpness(Image& image, double factor);   // degenerate: PIL's SMOOTH 3x3 filter

// PIL's "L" conversion of an RGB pixel: (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
uint8_t grey_level(uint8_t r, uint8_t g, uint8_t b);

// --- Geometry ---
// PIL's Image.transform(AFFINE, m): output pixel centre (x + 0.5, y + 0.5) samples the input at
// (m0 x' + m1 y' + m2, m3 x' + m4 y' + m5) in continuous coordinates; samples outside get `fill`
// (one value per channel, or one for all).
void image_affine(Image& image, const std::array<double, 6>& m, Resample resample,
                  const std::vector<uint8_t>& fill);
// PIL's Image.rotate(degrees) about the centre, counter-clockwise, same size.
void image_rotate(Image& image, double degrees, Resample resample,
                  const std::vector<uint8_t>& fill);
void image_hflip(Image& image);
// Zero-or-`fill` padding on every side.
void image_pad(Image& image, int top, int bottom, int left, int right, uint8_t fill = 0);
// The [top, top + height) x [left, left + width) window; must lie inside the image.
void image_crop(Image& image, int top, int left, int height, int width);
// PIL's Image.resize: separable bilinear/bicubic (a = -0.5) with the kernel widened by the
// downscale factor (antialiasing), 22-bit fixed point, horizontal pass first; nearest samples
// floor((x + 0.5) * in / out).
void image_resize(Image& image, int height, int width, Resample resample);
// image_crop to the window [top, top + crop_height) x [left, left + crop_width), then
// image_resize to height x width (torchvision's resized_crop; the filters see only the window),
// reading the window in place rather than copying it first. The same pixels.
void image_resized_crop(Image& image, int top, int left, int crop_height, int crop_width,
                        int height, int width, Resample resample);

}  // namespace ska::data
