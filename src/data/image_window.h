// A window of an image, and the hook through which a reader asks for one once it knows the image's
// size: RandomResizedCrop draws its crop from the size alone, so a JPEG reader can decode just that
// window instead of the whole file (datasets/image_decode.h, pipeline/loader.cpp).
#pragma once

#include <functional>

namespace ska::data {

// Rows [top, top + height) and columns [left, left + width).
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};

// Called with the image's height and width before its pixels are decoded; returns the window to
// read, which must lie inside the image and be non-empty (checked by the readers: ValueError).
using WindowChooser = std::function<CropBox(int height, int width)>;

}  // namespace ska::data
