// JPEG and PNG decoding, and JPEG encoding (see image_decode.h). Both libraries report errors by calling a handler
// that must not return; ours longjmp back to the function that called setjmp. Each setjmp sits in
// a small function whose frame holds nothing with a destructor (only the libraries' C frames lie
// between it and the handler), and the C++ objects (the output tensor, row buffers) live in the
// caller, which turns a failure into an IOError after the library state is released.
#include "data/datasets/image_decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>  // the message codes (JWRN_JPEG_EOF)
#include <jpeglib.h>
#include <png.h>

#include "core/error.h"

namespace ska::data {
namespace {

// --- JPEG ---

// A progressive file may hold any number of scans, each a pass over the whole image; past this
// many it is a decoding-time bomb, not a photograph (libjpeg-turbo's TurboJPEG API stops at 500).
constexpr int kMaxJpegScans = 500;

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg hands us &mgr as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
};

struct JpegState {
  jpeg_decompress_struct cinfo;
  JpegError error;
  jpeg_progress_mgr progress;
  bool created = false;
  ~JpegState() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1) other than a premature end are counted and ignored, as Pillow does; trace
// messages (level >= 0) are dropped.
void jpeg_warn(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof(e->message), "truncated: the data ends before the image does");
    std::longjmp(e->jump, 1);
  }
  ++cinfo->err->num_warnings;
}

void jpeg_count_scans(j_common_ptr common) {
  auto* cinfo = reinterpret_cast<j_decompress_ptr>(common);
  if (cinfo->is_decompressor && cinfo->progressive_mode &&
      cinfo->input_scan_number > kMaxJpegScans) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof(e->message), "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(e->jump, 1);
  }
}

// Reads the header and chooses the output colour space. False with the message set on failure.
bool jpeg_open(JpegState& s, const uint8_t* data, size_t size) {
  s.cinfo.err = jpeg_std_error(&s.error.mgr);
  s.error.mgr.error_exit = jpeg_fail;
  s.error.mgr.emit_message = jpeg_warn;
  if (setjmp(s.error.jump)) return false;
  jpeg_create_decompress(&s.cinfo);
  s.created = true;
  s.progress.progress_monitor = jpeg_count_scans;
  s.cinfo.progress = &s.progress;
  jpeg_mem_src(&s.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s.cinfo, TRUE);
  switch (s.cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
      s.cinfo.out_color_space = JCS_GRAYSCALE;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      s.cinfo.out_color_space = JCS_CMYK;
      break;
    default:
      s.cinfo.out_color_space = JCS_RGB;
      break;
  }
  return true;
}

bool jpeg_start(JpegState& s) {
  if (setjmp(s.error.jump)) return false;
  jpeg_start_decompress(&s.cinfo);
  return true;
}

// Reads the rows and columns of `box` into `image` (box.height x box.width x 3) through `row`
// (one decoded row), leaving the rest of the file undecoded. False with the message set on failure.
bool jpeg_read_window(JpegState& s, const CropBox& box, uint8_t* image, uint8_t* row) {
  if (setjmp(s.error.jump)) return false;
  j_decompress_ptr cinfo = &s.cinfo;
  // A cropped region's first and last columns are upsampled as if they were the image's edges:
  // one more column either side keeps the window's own columns away from them. And when any
  // component of the region would be under 2 samples wide, libjpeg-turbo upsamples them all by a
  // cruder method: the region spans at least two iMCUs, moved left where the image's right edge
  // caps it (libjpeg-turbo's region starts at an iMCU boundary).
  const JDIMENSION imcu = static_cast<JDIMENSION>(cinfo->max_h_samp_factor) * DCTSIZE;
  JDIMENSION start = static_cast<JDIMENSION>(box.left > 0 ? box.left - 1 : 0) / imcu * imcu;
  const JDIMENSION end = std::min<JDIMENSION>(
      cinfo->output_width,
      std::max<JDIMENSION>(static_cast<JDIMENSION>(box.left + box.width + 1), start + 2 * imcu));
  if (end - start < 2 * imcu) start = end > 2 * imcu ? (end - 2 * imcu) / imcu * imcu : 0;
  JDIMENSION x = start, width = end - start;
  jpeg_crop_scanline(cinfo, &x, &width);  // x is on an iMCU boundary already
  const auto top = static_cast<JDIMENSION>(box.top);
  if (top > 0 && jpeg_skip_scanlines(cinfo, top) != top) {
    std::snprintf(s.error.message, sizeof(s.error.message), "could not skip to row %u", top);
    return false;
  }
  const size_t skip = box.left - x;
  const size_t out_row = static_cast<size_t>(box.width) * 3;
  const bool grey = cinfo->out_color_space == JCS_GRAYSCALE;
  while (cinfo->output_scanline < top + static_cast<JDIMENSION>(box.height)) {
    uint8_t* out = image + (cinfo->output_scanline - top) * out_row;
    JSAMPROW target = row;
    jpeg_read_scanlines(cinfo, &target, 1);
    if (grey) {
      for (int i = 0; i < box.width; ++i)
        out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = row[skip + i];
    } else {
      std::memcpy(out, row + 3 * skip, out_row);
    }
  }
  jpeg_abort_decompress(cinfo);  // the rows below the window stay undecoded
  return true;
}

// The file ends with the EOI marker (FF D9). Entropy-coded data stuffs a zero after every FF, so
// a file cut short ends so only by chance of a marker, and a cut file is what must not pass.
bool ends_with_eoi(const uint8_t* data, size_t size) {
  return size >= 4 && data[size - 2] == 0xFF && data[size - 1] == 0xD9;
}

// The entropy-coded data of a single-scan file, from after its scan header to the final EOI
// (`end`), holds no marker but restarts (FF D0-D7), stuffed zeros (FF 00) and fill bytes (FF FF).
// A window decode stops after the window's last row, so any other marker past it (a second SOI,
// SOF or SOS, a table), on which the whole decode fails, would go unread: false sends such a file
// to the whole decode. (A multi-scan file is read to its end when decoding starts.)
bool only_restarts_follow(const uint8_t* p, const uint8_t* end) {
  while (p < end) {
    const auto* ff =
        static_cast<const uint8_t*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p)));
    if (ff == nullptr) return true;
    const uint8_t* code = ff + 1;
    while (code < end && *code == 0xFF) ++code;
    if (code == end) return true;  // fill bytes before the EOI
    if (*code != 0x00 && (*code < 0xD0 || *code > 0xD7)) return false;
    p = code + 1;
  }
  return true;
}

void check_window(const CropBox& box, int64_t height, int64_t width, const std::string& where) {
  SKA_CHECK(box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0 &&
                box.top + box.height <= height && box.left + box.width <= width,
            ValueError, where, ": the window ", box.width, "x", box.height, " at (", box.left, ", ",
            box.top, ") does not lie inside the ", width, "x", height, " image");
}

// Pillow's CMYK -> RGB for one pixel, given its CMYK values as Pillow holds them.
inline uint8_t cmyk_channel(int value, int inverse_black) {
  const int product = value * inverse_black + 128;  // Pillow's MULDIV255
  return static_cast<uint8_t>(inverse_black - (((product >> 8) + product) >> 8));
}

// Reads the rows from the first to the window's last in order, as the whole decode reads them,
// and keeps the columns of `box` of its rows into `image` (box.height x box.width x 3), through
// `row` (output_width x the output's components, up to 4) unless the output is RGB and the box
// spans every column. Then finishes the decompression when every row was read, else abandons the
// rows below. False with the message set on failure.
bool jpeg_read_rows(JpegState& s, const CropBox& box, uint8_t* image, uint8_t* row) {
  if (setjmp(s.error.jump)) return false;
  const bool adobe = s.cinfo.saw_Adobe_marker;
  const J_COLOR_SPACE space = s.cinfo.out_color_space;
  const bool full_rows =
      box.left == 0 && static_cast<JDIMENSION>(box.width) == s.cinfo.output_width;
  const auto top = static_cast<JDIMENSION>(box.top);
  const auto bottom = static_cast<JDIMENSION>(box.top + box.height);
  const size_t out_row = static_cast<size_t>(box.width) * 3;
  while (s.cinfo.output_scanline < bottom) {
    const JDIMENSION y = s.cinfo.output_scanline;
    uint8_t* out = y >= top ? image + size_t{y - top} * out_row : nullptr;
    const bool direct = out != nullptr && full_rows && space == JCS_RGB;
    JSAMPROW target = direct ? out : row;
    jpeg_read_scanlines(&s.cinfo, &target, 1);
    if (out == nullptr || direct) continue;
    if (space == JCS_RGB) {
      std::memcpy(out, row + 3 * size_t{static_cast<size_t>(box.left)}, out_row);
    } else if (space == JCS_GRAYSCALE) {
      const uint8_t* in = row + box.left;
      for (int x = 0; x < box.width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    } else if (space == JCS_CMYK) {
      // Adobe files (Photoshop, Pillow) store inverted CMYK; Pillow reads them as "CMYK;I".
      for (int x = 0; x < box.width; ++x) {
        const uint8_t* p = row + 4 * static_cast<size_t>(box.left + x);
        const int k = adobe ? 255 - p[3] : p[3];
        for (int c = 0; c < 3; ++c)
          out[3 * x + c] = cmyk_channel(adobe ? 255 - p[c] : p[c], 255 - k);
      }
    }
  }
  if (bottom == s.cinfo.output_height) {
    jpeg_finish_decompress(&s.cinfo);
  } else {
    jpeg_abort_decompress(&s.cinfo);  // the rows below the window stay undecoded
  }
  return true;
}

struct JpegWriter {
  jpeg_compress_struct cinfo;
  JpegError error;
  unsigned char* buffer = nullptr;  // jpeg_mem_dest's output, malloc'd by libjpeg
  unsigned long size = 0;
  bool created = false;
  ~JpegWriter() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buffer);
  }
};

bool jpeg_write(JpegWriter& w, const uint8_t* rgb, JDIMENSION height, JDIMENSION width,
                int quality) {
  w.cinfo.err = jpeg_std_error(&w.error.mgr);
  w.error.mgr.error_exit = jpeg_fail;
  if (setjmp(w.error.jump)) return false;
  jpeg_create_compress(&w.cinfo);
  w.created = true;
  jpeg_mem_dest(&w.cinfo, &w.buffer, &w.size);
  w.cinfo.image_width = width;
  w.cinfo.image_height = height;
  w.cinfo.input_components = 3;
  w.cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&w.cinfo);
  jpeg_set_quality(&w.cinfo, quality, TRUE);
  jpeg_start_compress(&w.cinfo, TRUE);
  while (w.cinfo.next_scanline < height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb + size_t{w.cinfo.next_scanline} * width * 3);
    jpeg_write_scanlines(&w.cinfo, &row, 1);
  }
  jpeg_finish_compress(&w.cinfo);
  return true;
}

// --- PNG ---

struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, offset = 0;
  char message[256] = {};
  ~PngState() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s", message);
  std::longjmp(png_jmpbuf(png), 1);
}

void png_warn(png_structp, png_const_charp) {}  // as Pillow: warnings do not fail a file

void png_read_bytes(png_structp png, png_bytep out, png_size_t length) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (length > s->size - s->offset)
    png_error(png, "truncated: the data ends before the image does");
  std::memcpy(out, s->data + s->offset, length);
  s->offset += length;
}

// Reads the header and sets the transformations to 8-bit RGB.
bool png_open(PngState& s) {
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_fail, png_warn);
  if (s.png == nullptr) {
    std::snprintf(s.message, sizeof(s.message), "libpng could not start");
    return false;
  }
  if (setjmp(png_jmpbuf(s.png))) return false;
  s.info = png_create_info_struct(s.png);
  if (s.info == nullptr) png_error(s.png, "libpng could not start");
  png_set_read_fn(s.png, &s, png_read_bytes);
  png_read_info(s.png, s.info);
  const int colour = png_get_color_type(s.png, s.info);
  const int depth = png_get_bit_depth(s.png, s.info);
  if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s.png);
  if ((colour & PNG_COLOR_MASK_COLOR) == 0 && depth < 8) png_set_expand_gray_1_2_4_to_8(s.png);
  if (depth == 16) png_set_strip_16(s.png);
  png_set_strip_alpha(s.png);
  if ((colour & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(s.png);
  png_set_interlace_handling(s.png);
  png_read_update_info(s.png, s.info);
  return true;
}

bool png_read_rows(PngState& s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_read_image(s.png, rows);
  return true;
}

}  // namespace

bool starts_as_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

bool starts_as_png(const uint8_t* data, size_t size) {
  return size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
}

namespace {

// The header read and the image's size checked: IOError naming `where` otherwise.
std::unique_ptr<JpegState> open_jpeg(const uint8_t* data, size_t size, const std::string& where,
                                     int64_t max_pixels) {
  auto state = std::make_unique<JpegState>();
  SKA_CHECK(jpeg_open(*state, data, size), IOError, where,
            ": cannot decode the JPEG: ", state->error.message);
  const int64_t height = state->cinfo.image_height, width = state->cinfo.image_width;
  SKA_CHECK(height * width <= max_pixels, IOError, where, ": the JPEG is ", width, "x", height,
            " pixels; expected at most ", max_pixels, " pixels");
  return state;
}

void start_jpeg(JpegState& s, const std::string& where) {
  SKA_CHECK(jpeg_start(s), IOError, where, ": cannot decode the JPEG: ", s.error.message);
  SKA_CHECK(
      s.cinfo.output_height == s.cinfo.image_height && s.cinfo.output_width == s.cinfo.image_width,
      IOError, where, ": libjpeg decodes the ", s.cinfo.image_width, "x", s.cinfo.image_height,
      " JPEG at another size");
}

}  // namespace

Tensor decode_jpeg_rgb(const uint8_t* data, size_t size, const std::string& where,
                       int64_t max_pixels) {
  std::unique_ptr<JpegState> state = open_jpeg(data, size, where, max_pixels);
  JpegState& s = *state;
  const int64_t height = s.cinfo.image_height, width = s.cinfo.image_width;
  start_jpeg(s, where);
  Tensor image = Tensor::empty({height, width, 3}, DType::kU8);
  std::vector<uint8_t> row(static_cast<size_t>(width) * 4);
  const CropBox all{0, 0, static_cast<int>(height), static_cast<int>(width)};
  SKA_CHECK(jpeg_read_rows(s, all, image.data<uint8_t>(), row.data()), IOError, where,
            ": cannot decode the JPEG: ", s.error.message);
  return image;
}

Tensor image_tensor_window(const Tensor& image, const CropBox& box, const std::string& where) {
  SKA_CHECK(image.dtype() == DType::kU8 && image.dim() == 3, ValueError, where,
            ": a window of a uint8 [H, W, C] image was asked of a ", shape_str(image.shape()),
            " tensor");
  const int64_t height = image.size(0), width = image.size(1), channels = image.size(2);
  check_window(box, height, width, where);
  if (box.height == height && box.width == width) return image;
  const Tensor source = image.contiguous();
  Tensor out = Tensor::empty({box.height, box.width, channels}, DType::kU8);
  const size_t row = static_cast<size_t>(box.width * channels);
  for (int y = 0; y < box.height; ++y) {
    std::memcpy(out.data<uint8_t>() + y * row,
                source.data<uint8_t>() + ((box.top + y) * width + box.left) * channels, row);
  }
  return out;
}

Tensor image_tensor_window(const Tensor& image, const WindowChooser& choose,
                           const std::string& where) {
  SKA_CHECK(image.dim() == 3, ValueError, where,
            ": a window of a uint8 [H, W, C] image was asked of a ", shape_str(image.shape()),
            " tensor");
  return image_tensor_window(
      image, choose(static_cast<int>(image.size(0)), static_cast<int>(image.size(1))), where);
}

Tensor decode_jpeg_rgb_window(const uint8_t* data, size_t size, const std::string& where,
                              int64_t max_pixels, const WindowChooser& choose) {
  std::unique_ptr<JpegState> state = open_jpeg(data, size, where, max_pixels);
  JpegState& s = *state;
  const int64_t height = s.cinfo.image_height, width = s.cinfo.image_width;
  const CropBox box = choose(static_cast<int>(height), static_cast<int>(width));
  const bool whole = box.top == 0 && box.left == 0 && box.height == height && box.width == width;
  // A multi-scan (progressive) file is entropy-decoded whole when decoding starts, so its errors
  // show there; a single-scan file's past the window only in its bytes (only_restarts_follow).
  const bool multi_scan = jpeg_has_multiple_scans(&s.cinfo);
  const bool rest_checked =
      ends_with_eoi(data, size) &&
      (multi_scan || only_restarts_follow(s.cinfo.src->next_input_byte, data + size - 2));
  if (whole || !rest_checked) {
    state.reset();
    return image_tensor_window(decode_jpeg_rgb(data, size, where, max_pixels), box, where);
  }
  check_window(box, height, width, where);
  start_jpeg(s, where);
  Tensor image = Tensor::empty({box.height, box.width, 3}, DType::kU8);
  std::vector<uint8_t> row(static_cast<size_t>(width) * 4);
  // Multi-scan files and CMYK files read their rows from the top, uncropped, as the whole decode
  // does, to the window's last: where a file leaves a block's AC coefficients unknown (damaged,
  // or scans missing), libjpeg-turbo smooths the block from its neighbours', and a cropped
  // region's edge blocks see other neighbours than the whole image's (the image fuzzer's finding:
  // a damaged 144x11 progressive file, 34 values off by 1 or 2 near a window's left edge;
  // tests/fixtures/images/damaged_progressive.jpg); CMYK's conversion is jpeg_read_rows'. Few
  // photographs are either.
  const bool from_top = multi_scan || s.cinfo.out_color_space == JCS_CMYK;
  SKA_CHECK(from_top ? jpeg_read_rows(s, box, image.data<uint8_t>(), row.data())
                     : jpeg_read_window(s, box, image.data<uint8_t>(), row.data()),
            IOError, where, ": cannot decode the JPEG: ", s.error.message);
  return image;
}

std::vector<uint8_t> encode_jpeg_rgb(const uint8_t* rgb, int64_t height, int64_t width,
                                     int quality) {
  SKA_CHECK(height > 0 && width > 0 && height <= 65500 && width <= 65500, ValueError,
            "encode_jpeg_rgb: a ", width, "x", height, " image; JPEG sides are 1..65500");
  SKA_CHECK(quality >= 1 && quality <= 100, ValueError, "encode_jpeg_rgb: quality ", quality,
            "; expected 1..100");
  auto writer = std::make_unique<JpegWriter>();
  SKA_CHECK(jpeg_write(*writer, rgb, static_cast<JDIMENSION>(height),
                       static_cast<JDIMENSION>(width), quality),
            IOError, "encode_jpeg_rgb: ", writer->error.message);
  return std::vector<uint8_t>(writer->buffer, writer->buffer + writer->size);
}

Tensor decode_png_rgb(const uint8_t* data, size_t size, const std::string& where,
                      int64_t max_pixels) {
  PngState s;
  s.data = data;
  s.size = size;
  SKA_CHECK(png_open(s), IOError, where, ": cannot decode the PNG: ", s.message);
  const int64_t height = png_get_image_height(s.png, s.info);
  const int64_t width = png_get_image_width(s.png, s.info);
  SKA_CHECK(height * width <= max_pixels, IOError, where, ": the PNG is ", width, "x", height,
            " pixels; expected at most ", max_pixels, " pixels");
  SKA_CHECK(png_get_rowbytes(s.png, s.info) == static_cast<size_t>(width) * 3, IOError, where,
            ": cannot decode the PNG: its rows do not convert to 8-bit RGB");
  Tensor image = Tensor::empty({height, width, 3}, DType::kU8);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) rows[y] = image.data<uint8_t>() + y * width * 3;
  SKA_CHECK(png_read_rows(s, rows.data()), IOError, where, ": cannot decode the PNG: ", s.message);
  return image;
}

}  // namespace ska::data
