// JPEG and PNG decoding against Pillow: files written by Pillow (scripts/make_image_fixtures.py)
// must decode to the pixels Pillow's Image.open(f).convert("RGB") gives, bit for bit; truncated
// and corrupt files are IOErrors naming the file.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "core/allocator.h"
#include "core/error.h"
#include "data/datasets/file_bytes.h"
#include "data/datasets/image_decode.h"
#include "data/datasets/image_folder.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::data;
using Catch::Matchers::Contains;

namespace {

const std::string kImages = std::string(SKA_TEST_FIXTURES) + "/images/";
constexpr int64_t kManyPixels = int64_t{1} << 26;

struct Expected {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;  // HWC RGB
};

std::map<std::string, Expected> load_expected() {
  std::ifstream in(kImages + "expected.txt");
  REQUIRE(in.good());
  std::map<std::string, Expected> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    int64_t channels = 0;
    Expected e;
    fields >> name >> e.height >> e.width >> channels;
    REQUIRE(channels == 3);
    for (int v; fields >> v;) e.pixels.push_back(static_cast<uint8_t>(v));
    REQUIRE(static_cast<int64_t>(e.pixels.size()) == e.height * e.width * 3);
    out[name] = std::move(e);
  }
  return out;
}

std::vector<uint8_t> fixture_bytes(const std::string& name) {
  return read_file_bytes(kImages + name, "test");
}

Tensor decode(const std::vector<uint8_t>& bytes, const std::string& where = "test image") {
  return starts_as_png(bytes.data(), bytes.size())
             ? decode_png_rgb(bytes.data(), bytes.size(), where, kManyPixels)
             : decode_jpeg_rgb(bytes.data(), bytes.size(), where, kManyPixels);
}

// Requires `image` (uint8 HWC) to equal `e` exactly, naming the first differing pixel.
void require_pixels(const Tensor& image, const Expected& e, const std::string& name) {
  INFO(name);
  REQUIRE(image.shape() == Shape{e.height, e.width, 3});
  const uint8_t* got = image.data<uint8_t>();
  int64_t differing = 0, first = -1;
  for (size_t i = 0; i < e.pixels.size(); ++i) {
    if (got[i] != e.pixels[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differing;
    }
  }
  if (first >= 0) {
    FAIL(differing << " values differ; the first at (" << first / 3 / e.width << ", "
                   << first / 3 % e.width << ") channel " << first % 3 << ": " << int{got[first]}
                   << ", Pillow " << int{e.pixels[first]});
  }
}

std::string scratch_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("ska_image_decode_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  test::remove_at_exit(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

// A JPEG of `h` x `w` seeded noise with the given sampling factors (h, v per component: luma,
// Cb, Cr), written by libjpeg with its default tables: layouts Pillow cannot write (4x1 luma,
// chroma sampled finer than luma, 4:4:0) for the window tests.
struct JpegMemory {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr error;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  ~JpegMemory() {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
  }
};

std::vector<uint8_t> encode_sampled(int h, int w, const std::array<int, 6>& factors,
                                    bool progressive, uint32_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
  for (size_t i = 0; i < rgb.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    rgb[i] = static_cast<uint8_t>((i % 3 == 0 ? (i / 3 % w) * 7 : (i / 3 / w) * 11) + (seed >> 27));
  }
  JpegMemory m;
  m.cinfo.err = jpeg_std_error(&m.error);  // errors exit: the arguments are known to be good
  jpeg_create_compress(&m.cinfo);
  jpeg_mem_dest(&m.cinfo, &m.buffer, &m.size);
  m.cinfo.image_width = static_cast<JDIMENSION>(w);
  m.cinfo.image_height = static_cast<JDIMENSION>(h);
  m.cinfo.input_components = 3;
  m.cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&m.cinfo);
  jpeg_set_quality(&m.cinfo, 90, TRUE);
  for (int c = 0; c < 3; ++c) {
    m.cinfo.comp_info[c].h_samp_factor = factors[2 * c];
    m.cinfo.comp_info[c].v_samp_factor = factors[2 * c + 1];
  }
  if (progressive) jpeg_simple_progression(&m.cinfo);
  jpeg_start_compress(&m.cinfo, TRUE);
  while (m.cinfo.next_scanline < m.cinfo.image_height) {
    JSAMPROW row = rgb.data() + size_t{m.cinfo.next_scanline} * w * 3;
    jpeg_write_scanlines(&m.cinfo, &row, 1);
  }
  jpeg_finish_compress(&m.cinfo);
  return std::vector<uint8_t>(m.buffer, m.buffer + m.size);
}

// decode_jpeg_rgb_window(box) against the whole decode's window.
void require_window(const std::vector<uint8_t>& bytes, const Tensor& whole, const CropBox& box) {
  INFO("window " << box.width << "x" << box.height << " at (" << box.left << ", " << box.top
                 << ")");
  const Tensor got = decode_jpeg_rgb_window(bytes.data(), bytes.size(), "w", kManyPixels,
                                            [&](int, int) { return box; });
  REQUIRE(got.to_vector<uint8_t>() == image_tensor_window(whole, box, "w").to_vector<uint8_t>());
}

}  // namespace

TEST_CASE("JPEG and PNG files decode to Pillow's RGB pixels exactly", "[cpu][data][golden]") {
  const std::map<std::string, Expected> expected = load_expected();
  REQUIRE(expected.size() == 8);
  for (const auto& [name, e] : expected) {
    require_pixels(decode(fixture_bytes(name), name), e, name);
    // And through the image-folder datasets' entry point, which reads the file.
    require_pixels(decode_image_rgb(kImages + name, "fixture"), e, name);
  }
}

TEST_CASE("JPEG: trailing bytes after the image are ignored, as Pillow ignores them",
          "[cpu][data]") {
  std::vector<uint8_t> bytes = fixture_bytes("rgb420.jpg");
  const std::string junk = "trailing junk after EOI";
  bytes.insert(bytes.end(), junk.begin(), junk.end());
  require_pixels(decode(bytes), load_expected().at("rgb420.jpg"), "rgb420.jpg + junk");
}

TEST_CASE("JPEG and PNG: truncated and corrupt files are IOErrors naming the file",
          "[cpu][data][hardening]") {
  for (const std::string name :
       {"rgb420.jpg", "rgb444_progressive.jpg", "cmyk.jpg", "rgba.png", "palette.png"}) {
    INFO(name);
    const std::vector<uint8_t> whole = fixture_bytes(name);
    // Cut inside the compressed data (the headers of these small files end before 60%).
    const std::vector<uint8_t> cut(whole.begin(), whole.begin() + whole.size() * 3 / 4);
    const std::string path = scratch_file("cut_" + name, cut);
    REQUIRE_THROWS_AS(decode_image_rgb(path, "sample 7"), IOError);
    REQUIRE_THROWS_WITH(decode_image_rgb(path, "sample 7"),
                        Contains("image '" + path + "' (sample 7)") && Contains("truncated"));
  }
  // A PNG whose image data was damaged (zlib fails before the chunk's CRC is read), and one whose
  // header chunk no longer matches its CRC.
  std::vector<uint8_t> png = fixture_bytes("rgba.png");
  const std::string idat = "IDAT";
  const auto at = std::search(png.begin(), png.end(), idat.begin(), idat.end());
  REQUIRE(at != png.end());
  at[6] ^= 0x5a;
  REQUIRE_THROWS_WITH(decode(png, "damaged.png"), Contains("damaged.png: cannot decode the PNG: "));
  png = fixture_bytes("rgba.png");
  png[8 + 8 + 3] ^= 0x01;  // the signature, IHDR's length and type, then the width's low byte
  REQUIRE_THROWS_WITH(decode(png, "crc.png"),
                      Contains("crc.png: cannot decode the PNG: ") && Contains("CRC"));
  // A JPEG whose frame header announces an impossible component count.
  std::vector<uint8_t> jpeg = fixture_bytes("grey.jpg");
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 9] = 0;  // SOF0: length, precision, height, width, then the number of components
      break;
    }
  }
  REQUIRE_THROWS_WITH(decode(jpeg, "bad.jpg"), Contains("bad.jpg: cannot decode the JPEG: "));
}

TEST_CASE("JPEG and PNG: images above the pixel limit fail before their pixels are allocated",
          "[cpu][data][hardening]") {
  const std::vector<uint8_t> jpeg = fixture_bytes("rgb420.jpg");  // 13 x 9
  REQUIRE_THROWS_WITH(decode_jpeg_rgb(jpeg.data(), jpeg.size(), "big.jpg", 116),
                      Contains("big.jpg: the JPEG is 13x9 pixels; expected at most 116 pixels"));
  CHECK(decode_jpeg_rgb(jpeg.data(), jpeg.size(), "big.jpg", 117).shape() == Shape{9, 13, 3});
  const std::vector<uint8_t> png = fixture_bytes("rgba.png");  // 7 x 6
  REQUIRE_THROWS_WITH(decode_png_rgb(png.data(), png.size(), "big.png", 41),
                      Contains("big.png: the PNG is 7x6 pixels; expected at most 41 pixels"));
}

TEST_CASE("JPEG: a progressive file with hundreds of scans is refused", "[cpu][data][hardening]") {
  // The progressive fixture with its last scan repeated 600 times: each repeat is another pass
  // over the whole image (libjpeg only warns about the bogus progression).
  const std::vector<uint8_t> whole = fixture_bytes("rgb444_progressive.jpg");
  size_t last_sos = 0;
  for (size_t i = 2; i + 1 < whole.size(); ++i) {
    if (whole[i] == 0xFF && whole[i + 1] == 0xDA) last_sos = i;
  }
  REQUIRE(last_sos > 0);
  REQUIRE(whole[whole.size() - 2] == 0xFF);
  REQUIRE(whole[whole.size() - 1] == 0xD9);
  const std::vector<uint8_t> scan(whole.begin() + last_sos, whole.end() - 2);
  std::vector<uint8_t> bomb(whole.begin(), whole.end() - 2);
  for (int i = 0; i < 600; ++i) bomb.insert(bomb.end(), scan.begin(), scan.end());
  bomb.push_back(0xFF);
  bomb.push_back(0xD9);
  REQUIRE_THROWS_WITH(decode(bomb, "scans.jpg"), Contains("more than 500 progressive scans"));
}

// Window decoding must give the whole decode's pixels in every chroma layout (4:2:0, 4:2:2
// progressive, 4:4:4, grey, CMYK), for windows touching each edge, one pixel wide or tall, and the
// whole image; a file cut short still fails.
TEST_CASE("JPEG: a window decodes to the whole image's pixels there", "[cpu][data]") {
  const std::vector<std::string> files = {
      "window_420.jpg", "window_422_progressive.jpg", "window_444.jpg", "window_grey.jpg",
      "rgb420.jpg",     "rgb444_progressive.jpg",     "grey.jpg",       "cmyk.jpg"};
  uint32_t state = 12345;
  const auto draw = [&](int n) {  // [0, n)
    state = state * 1664525u + 1013904223u;
    return static_cast<int>((state >> 8) % static_cast<uint32_t>(n));
  };
  int64_t windows = 0;
  for (const std::string& name : files) {
    INFO(name);
    const std::vector<uint8_t> bytes = fixture_bytes(name);
    const Tensor whole = decode(bytes, name);
    const int h = static_cast<int>(whole.size(0)), w = static_cast<int>(whole.size(1));
    std::vector<CropBox> boxes = {
        {0, 0, h, w},         {0, 0, 1, 1},         {h - 1, w - 1, 1, 1},
        {0, 0, h, 1},         {0, w - 1, h, 1},     {h / 2, 0, 1, w},
        {1, 1, h - 2, w - 2}, {0, 1, h - 1, w - 1}, {h / 3, w / 3, h / 3, w / 3}};
    for (int i = 0; i < 150; ++i) {
      CropBox b;
      b.height = 1 + draw(h);
      b.width = 1 + draw(w);
      b.top = draw(h - b.height + 1);
      b.left = draw(w - b.width + 1);
      boxes.push_back(b);
    }
    for (const CropBox& box : boxes) {
      INFO("window " << box.width << "x" << box.height << " at (" << box.left << ", " << box.top
                     << ")");
      int seen_h = 0, seen_w = 0;
      const Tensor got = decode_jpeg_rgb_window(bytes.data(), bytes.size(), name, kManyPixels,
                                                [&](int height, int width) {
                                                  seen_h = height;
                                                  seen_w = width;
                                                  return box;
                                                });
      REQUIRE(seen_h == h);
      REQUIRE(seen_w == w);
      const Tensor want = image_tensor_window(whole, box, name);
      REQUIRE(got.shape() == Shape{box.height, box.width, 3});
      REQUIRE(got.to_vector<uint8_t>() == want.to_vector<uint8_t>());
      ++windows;
    }
  }
  CHECK(windows == 8 * 159);
  // A damaged progressive file (the image fuzzer's finding): its blocks without AC coefficients
  // are smoothed from their neighbours, which a cropped region's edges would change; the window
  // must still be the whole decode's pixels there.
  {
    const std::vector<uint8_t> bytes = fixture_bytes("damaged_progressive.jpg");
    const Tensor whole = decode(bytes, "damaged_progressive.jpg");
    REQUIRE(whole.shape() == Shape{11, 144, 3});
    for (const CropBox& box : {CropBox{3, 44, 6, 94}, CropBox{0, 9, 11, 40}, CropBox{5, 60, 1, 1}}) {
      INFO("window " << box.width << "x" << box.height << " at (" << box.left << ", " << box.top
                     << ")");
      const Tensor got = decode_jpeg_rgb_window(bytes.data(), bytes.size(), "damaged", kManyPixels,
                                                [&](int, int) { return box; });
      REQUIRE(got.to_vector<uint8_t>() ==
              image_tensor_window(whole, box, "damaged").to_vector<uint8_t>());
    }
  }
  // Progressive and CMYK files keep the window alone (the rows from the top are read through a
  // row buffer): the tensors allocated while decoding a 5x4 window are its 60 bytes, not the
  // whole image as well.
  for (const std::string name :
       {"window_422_progressive.jpg", "rgb444_progressive.jpg", "cmyk.jpg"}) {
    INFO(name);
    const std::vector<uint8_t> bytes = fixture_bytes(name);
    Allocator& host = allocator_for(Device::cpu());
    const int64_t before = host.stats().requested;
    host.reset_peak();
    const Tensor got =
        decode_jpeg_rgb_window(bytes.data(), bytes.size(), name, kManyPixels, [](int, int) {
          return CropBox{2, 3, 4, 5};
        });
    CHECK(host.stats().peak_requested - before == 4 * 5 * 3);
    REQUIRE(
        got.to_vector<uint8_t>() ==
        image_tensor_window(decode(bytes, name), CropBox{2, 3, 4, 5}, name).to_vector<uint8_t>());
  }
  // The same through the image-folder entry point (it reads the file).
  const CropBox box{3, 5, 20, 30};
  const auto choose = [&](int, int) { return box; };
  REQUIRE(decode_image_rgb_window(kImages + "window_420.jpg", choose).to_vector<uint8_t>() ==
          image_tensor_window(decode_image_rgb(kImages + "window_420.jpg"), box, "")
              .to_vector<uint8_t>());
  // PNG files decode whole, then the window is cut.
  REQUIRE(decode_image_rgb_window(kImages + "rgba.png",
                                  [](int, int) {
                                    return CropBox{1, 2, 3, 4};
                                  })
              .to_vector<uint8_t>() ==
          image_tensor_window(decode_image_rgb(kImages + "rgba.png"), CropBox{1, 2, 3, 4}, "")
              .to_vector<uint8_t>());

  // A window outside the image names the file; a file cut short fails even when the window lies
  // in the part that is there.
  const std::vector<uint8_t> bytes = fixture_bytes("window_420.jpg");
  REQUIRE_THROWS_WITH(
      decode_jpeg_rgb_window(bytes.data(), bytes.size(), "w.jpg", kManyPixels,
                             [](int h, int w) {
                               return CropBox{h - 4, 0, 5, w};
                             }),
      Contains("w.jpg: the window 70x5 at (0, 46) does not lie inside the 70x50 image"));
  REQUIRE_THROWS_AS(decode_jpeg_rgb_window(bytes.data(), bytes.size(), "w.jpg", kManyPixels,
                                           [](int, int) {
                                             return CropBox{0, 0, 0, 3};
                                           }),
                    ValueError);
  const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() * 3 / 4);
  REQUIRE_THROWS_WITH(decode_jpeg_rgb_window(cut.data(), cut.size(), "cut.jpg", kManyPixels,
                                             [](int, int) {
                                               return CropBox{0, 0, 2, 2};
                                             }),
                      Contains("cut.jpg: cannot decode the JPEG: truncated"));
}

// Every column range (and the first, last, middle and all rows) of images whose last iMCU column
// is 1 to 4 pixels wide, in layouts with 16- and 32-pixel iMCUs and chroma finer than luma: where
// the region near the right edge is narrow, libjpeg-turbo changes the upsampling method.
TEST_CASE("JPEG: window decoding at the right edge, in unusual chroma layouts", "[cpu][data]") {
  struct Layout {
    std::array<int, 6> factors;
    std::vector<int> widths;
  };
  const std::vector<Layout> layouts = {
      {{2, 2, 1, 1, 1, 1}, {18, 34}},  // 4:2:0
      {{2, 1, 1, 1, 1, 1}, {17, 19}},  // 4:2:2
      {{1, 2, 1, 1, 1, 1}, {9, 10}},   // 4:4:0
      {{4, 1, 2, 1, 1, 1}, {35, 36}},  // 32-pixel iMCUs, Cb finer than Cr
      {{1, 1, 2, 2, 1, 1}, {18, 9}},   // Cb sampled finer than luma
      {{2, 2, 1, 1, 2, 1}, {18}}};
  int64_t windows = 0;
  for (const Layout& layout : layouts) {
    for (int w : layout.widths) {
      for (bool progressive : {false, true}) {
        const int h = 13;
        INFO("factors " << layout.factors[0] << "x" << layout.factors[1] << " " << layout.factors[2]
                        << "x" << layout.factors[3] << " " << layout.factors[4] << "x"
                        << layout.factors[5] << ", " << w << "x" << h
                        << (progressive ? " progressive" : ""));
        const std::vector<uint8_t> bytes =
            encode_sampled(h, w, layout.factors, progressive, static_cast<uint32_t>(w));
        const Tensor whole = decode(bytes);
        REQUIRE(whole.shape() == Shape{h, w, 3});
        for (int left = 0; left < w; ++left) {
          for (int width = 1; left + width <= w; ++width) {
            for (const auto& [top, height] : {std::pair{0, h}, {0, 1}, {h - 1, 1}, {5, 4}}) {
              require_window(bytes, whole, CropBox{top, left, height, width});
              ++windows;
            }
          }
        }
      }
    }
  }
  CHECK(windows > 10000);
}

// A corrupt file fails the window decode as it fails the whole decode, even where the damage lies
// below the window: a marker other than a restart in the entropy-coded data sends it whole.
TEST_CASE("JPEG: a corrupt file past the window fails the window decode too",
          "[cpu][data][hardening]") {
  const std::vector<uint8_t> good = fixture_bytes("window_420.jpg");
  const auto segment = [&](uint8_t marker) {  // the marker segment (FF marker length...) of `good`
    for (size_t i = 2; i + 3 < good.size(); ++i) {
      if (good[i] == 0xFF && good[i + 1] == marker) {
        const size_t length = size_t{good[i + 2]} << 8 | good[i + 3];
        return std::vector<uint8_t>(good.begin() + static_cast<std::ptrdiff_t>(i),
                                    good.begin() + static_cast<std::ptrdiff_t>(i + 2 + length));
      }
    }
    FAIL("no marker " << int{marker});
    return std::vector<uint8_t>();
  };
  const auto before_eoi = [&](const std::vector<uint8_t>& extra) {
    std::vector<uint8_t> bad = good;
    bad.insert(bad.end() - 2, extra.begin(), extra.end());
    return bad;
  };
  std::vector<uint8_t> stray_soi = good;
  stray_soi[good.size() * 7 / 10] = 0xFF;
  stray_soi[good.size() * 7 / 10 + 1] = 0xD8;
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"a second SOF", before_eoi(segment(0xC0))},
      {"a second SOS", before_eoi(segment(0xDA))},
      {"a bad table", before_eoi({0xFF, 0xC4, 0x00, 0x01})},
      {"a stray SOI", stray_soi}};
  for (const auto& [what, bytes] : files) {
    INFO(what);
    REQUIRE_THROWS_AS(decode(bytes), IOError);
    REQUIRE_THROWS_WITH(decode_jpeg_rgb_window(bytes.data(), bytes.size(), "bad.jpg", kManyPixels,
                                               [](int, int) {
                                                 return CropBox{0, 0, 8, 16};
                                               }),
                        Contains("bad.jpg: cannot decode the JPEG"));
  }
  // Restart markers and fill bytes are not damage: the window path reads such a file.
  std::vector<uint8_t> filled = good;
  filled.insert(filled.end() - 2, {0xFF, 0xFF});
  require_window(filled, decode(filled), CropBox{2, 3, 10, 20});
}

TEST_CASE("JPEG: encode_jpeg_rgb writes a 4:2:0 file that decodes close to its input",
          "[cpu][data]") {
  const int64_t h = 37, w = 50;
  std::vector<uint8_t> rgb(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      uint8_t* p = &rgb[static_cast<size_t>((y * w + x) * 3)];
      p[0] = static_cast<uint8_t>(x * 5);
      p[1] = static_cast<uint8_t>(y * 6);
      p[2] = static_cast<uint8_t>(128 + (x - y));
    }
  }
  const std::vector<uint8_t> file = encode_jpeg_rgb(rgb.data(), h, w, 95);
  REQUIRE(starts_as_jpeg(file.data(), file.size()));
  const Tensor back = decode(file);
  REQUIRE(back.shape() == Shape{h, w, 3});
  double error = 0;
  for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(back.data<uint8_t>()[i] - rgb[i]);
  CHECK(error / static_cast<double>(rgb.size()) < 2.0);  // smooth ramps survive quality 95
  // Lower quality, smaller file; a bad quality or size is a ValueError.
  CHECK(encode_jpeg_rgb(rgb.data(), h, w, 30).size() < file.size());
  REQUIRE_THROWS_AS(encode_jpeg_rgb(rgb.data(), h, w, 0), ValueError);
  REQUIRE_THROWS_AS(encode_jpeg_rgb(rgb.data(), 0, w, 90), ValueError);
}
