// Heat maps over images, for pictures of attention: an image tensor as pixels, a colour scale,
// a small grid of weights upsampled and blended over an image, markers and pasting into a canvas.
#pragma once

#include "core/tensor.h"
#include "io/png.h"

namespace ska::io {

// v in [0, 1] (clamped) -> a jet-like colour: dark blue, blue, cyan, yellow, red, dark red.
Rgb heat_color(double v);

// An image [C, H, W] (C 1 or 3, any range: min-max scaled to 0..255 over all channels) resized to
// width x height pixels (nearest).
RgbImage tensor_image(const Tensor& chw, int width, int height);

// `grid` [h, w] (non-negative weights) bilinearly upsampled to the size of `base`, divided by its
// maximum, coloured by heat_color and blended over a grey copy of `base` (alpha: the heat map's
// share).
RgbImage overlay_heat(const RgbImage& base, const Tensor& grid, double alpha = 0.6);

// A square outline of half-size `radius` at (x, y), white inside a black edge.
void draw_marker(RgbImage& image, int x, int y, int radius);

// Copies `cell` into `canvas` with its top-left corner at (x, y) (clipped).
void paste(RgbImage& canvas, const RgbImage& cell, int x, int y);

}  // namespace ska::io
