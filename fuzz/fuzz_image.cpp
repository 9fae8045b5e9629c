// Fuzz target: an image file through decode_image_rgb, the image-folder datasets' decode path:
// JPEG (libjpeg) and PNG (libpng) always, BMP, PNM, TIFF and WebP with OpenCV; then through
// decode_image_rgb_window with a window drawn from the input's hash, as RandomResizedCrop's is
// (libjpeg-turbo's skip and crop paths). Where both decode, the window's pixels must be the whole
// image's there (abort otherwise: a finding).
#include <cstdlib>
#include <cstring>

#include "data/datasets/image_folder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("input.img", data, size);
  uint32_t hash = 2166136261u;  // FNV-1a
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 16777619u;
  ska::data::CropBox box;
  const auto choose = [&](int height, int width) {
    box.height = 1 + static_cast<int>(hash % static_cast<uint32_t>(height));
    box.width = 1 + static_cast<int>((hash >> 7) % static_cast<uint32_t>(width));
    box.top = static_cast<int>((hash >> 14) % static_cast<uint32_t>(height - box.height + 1));
    box.left = static_cast<int>((hash >> 21) % static_cast<uint32_t>(width - box.width + 1));
    return box;
  };
  ska::Tensor whole, window;
  ska::fuzz::expect_ska_errors([&] { whole = ska::data::decode_image_rgb(path, "fuzz"); });
  ska::fuzz::expect_ska_errors(
      [&] { window = ska::data::decode_image_rgb_window(path, choose, "fuzz window"); });
  if (!whole.defined() || !window.defined()) return 0;
  // Row by row, without copies: a 64-Mpixel image must fit the fuzzer's memory limit twice.
  if (window.size(0) != box.height || window.size(1) != box.width) std::abort();
  const size_t row = static_cast<size_t>(box.width) * 3;
  for (int y = 0; y < box.height; ++y) {
    const uint8_t* want = whole.data<uint8_t>() + ((box.top + y) * whole.size(1) + box.left) * 3;
    if (std::memcmp(window.data<uint8_t>() + y * row, want, row) != 0) {
      std::abort();  // the window decode disagrees with the whole decode
    }
  }
  return 0;
}
