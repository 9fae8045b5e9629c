// JPEG (libjpeg) and PNG (libpng) decoding to 8-bit RGB, and JPEG encoding: the formats image datasets come in,
// decoded the way Pillow does, so that the pixels equal what torchvision's and timm's loaders see
// (Image.open(f).convert("RGB")), and without OpenCV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/image_window.h"

namespace ska::data {

// A JPEG file as RGB uint8 [H, W, 3]: libjpeg's default accurate integer IDCT and smooth chroma
// upsampling (what Pillow uses), greyscale replicated, CMYK/YCCK converted as Pillow converts
// CMYK to RGB (Adobe files store inverted values). A file that ends before its image does is an
// error ("truncated"); libjpeg's other warnings (extraneous bytes, say) are not, as in Pillow.
// IOError "<where>: ..." with libjpeg's message, or when the image has more than `max_pixels`.
Tensor decode_jpeg_rgb(const uint8_t* data, size_t size, const std::string& where,
                       int64_t max_pixels);

// The window of a JPEG file's image that `choose(height, width)` picks once the header is read:
// RGB uint8 [box.height, box.width, 3], the same pixels as decode_jpeg_rgb's image there (tested
// bit for bit on every window of small images in each chroma layout, right-edge iMCUs of 1 to 4
// columns included). In a single-scan (baseline) file the rows below the window are not decoded
// and the rows above it only entropy-decoded (libjpeg-turbo's jpeg_skip_scanlines), and only the
// window's columns, widened by one column either side (the smooth chroma upsampling reads its
// neighbours) and to at least two iMCUs, are inverse-transformed, upsampled and converted. A
// multi-scan (progressive) file, entropy-decoded whole when decoding starts, and a CMYK file give
// their rows from the first to the window's last uncropped, as the whole decode does (block
// smoothing of a damaged progressive file reads neighbouring blocks), and nothing below; only the
// window is kept. Decoded whole and then cropped, so that they fail or succeed exactly as
// decode_jpeg_rgb does: windows covering the whole image, files that do not end with the EOI
// marker (a file cut short) and single-scan files with a marker other than a restart in their
// entropy-coded data (a corrupt file, whose error a decode stopping after the window would not
// reach). ValueError when the window does not lie inside the image; IOError as decode_jpeg_rgb.
Tensor decode_jpeg_rgb_window(const uint8_t* data, size_t size, const std::string& where,
                              int64_t max_pixels, const WindowChooser& choose);

// The window `box` of `image` (uint8 [H, W, C]) as a tensor of its own. ValueError naming `where`
// when the box does not lie inside the image or is empty.
Tensor image_tensor_window(const Tensor& image, const CropBox& box, const std::string& where);
// The window `choose` picks, given `image`'s height and width, as above.
Tensor image_tensor_window(const Tensor& image, const WindowChooser& choose,
                           const std::string& where);

// A PNG file as RGB uint8 [H, W, 3]: palettes expanded, 16-bit samples to their high byte, grey
// replicated and alpha (or a tRNS colour) dropped, as Pillow's convert("RGB") does; interlaced
// files included. (One exception: Pillow clips 16-bit greyscale to 255 rather than keeping the
// high byte.) Truncated or corrupt files (a bad CRC in a critical chunk) are IOErrors.
Tensor decode_png_rgb(const uint8_t* data, size_t size, const std::string& where,
                      int64_t max_pixels);

// `rgb` (uint8 [height, width, 3], row-major) as a baseline JPEG file of `quality` (1..100) with
// 4:2:0 chroma subsampling, libjpeg's defaults: what most photographs are. For synthetic datasets
// (benchmark_loader) and tests.
std::vector<uint8_t> encode_jpeg_rgb(const uint8_t* rgb, int64_t height, int64_t width,
                                     int quality);

bool starts_as_jpeg(const uint8_t* data, size_t size);  // FF D8 FF
bool starts_as_png(const uint8_t* data, size_t size);   // the 8-byte PNG signature

}  // namespace ska::data
