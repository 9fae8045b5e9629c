// A small RGB8 image and a PNG writer on zlib (one IDAT chunk, no filtering): enough for the
// run folder's curves.png without OpenCV.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ska::io {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};

// Row-major RGB pixels; set() ignores points outside the image, so drawing code may overshoot.
class RgbImage {
 public:
  RgbImage(int width, int height, Rgb background);
  int width() const { return width_; }
  int height() const { return height_; }
  Rgb at(int x, int y) const;
  void set(int x, int y, Rgb c);
  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

// The PNG file's bytes: signature, IHDR (8-bit RGB), one zlib-compressed IDAT, IEND.
std::string encode_png(const RgbImage& image);
// encode_png written atomically to `path` (IOError naming it on failure).
void write_png(const std::string& path, const RgbImage& image);

}  // namespace ska::io
