// PNG writing (see png.h): chunks with zlib's CRC-32, scanlines with filter type 0 deflated by
// zlib in one IDAT.
#include "io/png.h"

#include <zlib.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace ska::io {

namespace {

void put_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  put_be32(out, static_cast<uint32_t>(
                    crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

std::string deflate_rows(const RgbImage& image) {
  const size_t row = static_cast<size_t>(image.width()) * 3;
  std::string raw;
  raw.reserve((row + 1) * image.height());
  for (int y = 0; y < image.height(); ++y) {
    raw.push_back('\0');  // filter type 0: the row as it is
    raw.append(reinterpret_cast<const char*>(image.pixels().data() + y * row), row);
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(size, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(&packed[0]), &size,
                           reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                           Z_BEST_COMPRESSION);
  SKA_CHECK(rc == Z_OK, IOError, "PNG: zlib compress2 failed with code ", rc);
  packed.resize(size);
  return packed;
}

}  // namespace

RgbImage::RgbImage(int width, int height, Rgb background) : width_(width), height_(height) {
  SKA_CHECK(width > 0 && height > 0 && width <= 16384 && height <= 16384, ValueError,
            "RgbImage: size ", width, "x", height, " is outside [1, 16384]");
  pixels_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < pixels_.size(); i += 3) {
    pixels_[i] = background.r;
    pixels_[i + 1] = background.g;
    pixels_[i + 2] = background.b;
  }
}

Rgb RgbImage::at(int x, int y) const {
  SKA_CHECK(x >= 0 && y >= 0 && x < width_ && y < height_, ValueError, "RgbImage::at(", x, ", ",
            y, ") is outside ", width_, "x", height_);
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {pixels_[i], pixels_[i + 1], pixels_[i + 2]};
}

void RgbImage::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  pixels_[i] = c.r;
  pixels_[i + 1] = c.g;
  pixels_[i + 2] = c.b;
}

std::string encode_png(const RgbImage& image) {
  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(image.width()));
  put_be32(ihdr, static_cast<uint32_t>(image.height()));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, filter 0, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", deflate_rows(image));
  put_chunk(png, "IEND", "");
  return png;
}

void write_png(const std::string& path, const RgbImage& image) {
  write_file_atomic(path, encode_png(image));
}

}  // namespace ska::io
