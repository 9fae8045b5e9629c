// Fuzz target: an image file through decode_image_rgb, the image-folder datasets' decode path:
// JPEG (libjpeg) and PNG (libpng) always, BMP, PNM, TIFF and WebP with OpenCV.
#include "data/datasets/image_folder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("input.img", data, size);
  return ska::fuzz::expect_ska_errors([&] { ska::data::decode_image_rgb(path, "fuzz"); });
}
