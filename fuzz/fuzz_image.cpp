// Fuzz target: an image file through decode_image_rgb, the image-folder datasets' decode path:
// JPEG (libjpeg) and PNG (libpng) always, BMP, PNM, TIFF and WebP with OpenCV; then through
// decode_image_rgb_window with a window drawn from the input's hash, as RandomResizedCrop's is
// (libjpeg-turbo's skip and crop paths).
#include "data/datasets/image_folder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("input.img", data, size);
  uint32_t hash = 2166136261u;  // FNV-1a
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 16777619u;
  const auto choose = [hash](int height, int width) {
    ska::data::CropBox box;
    box.height = 1 + static_cast<int>(hash % static_cast<uint32_t>(height));
    box.width = 1 + static_cast<int>((hash >> 7) % static_cast<uint32_t>(width));
    box.top = static_cast<int>((hash >> 14) % static_cast<uint32_t>(height - box.height + 1));
    box.left = static_cast<int>((hash >> 21) % static_cast<uint32_t>(width - box.width + 1));
    return box;
  };
  ska::fuzz::expect_ska_errors([&] { ska::data::decode_image_rgb(path, "fuzz"); });
  return ska::fuzz::expect_ska_errors(
      [&] { ska::data::decode_image_rgb_window(path, choose, "fuzz window"); });
}
