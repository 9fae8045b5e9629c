// The folder datasets (see image_folder.h): directory scans with std::filesystem, class lists
// compared between splits, and decoding to RGB on access (JPEG and PNG by libjpeg and libpng,
// other formats by OpenCV).
#include "data/datasets/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#ifdef SKA_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "core/error.h"
#include "data/datasets/file_bytes.h"
#include "data/datasets/image_decode.h"

namespace ska::data {
namespace fs = std::filesystem;
namespace {

bool is_image_file(const fs::path& path) {
  static const char* const kExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".pgm",
                                            ".bmp", ".tif",  ".tiff", ".webp"};
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::any_of(std::begin(kExtensions), std::end(kExtensions),
                     [&](const char* e) { return ext == e; });
}

// Whether `b` starts as a JPEG, PNG, BMP, PNM, TIFF or WebP file does: the formats image datasets
// come in. Only those reach OpenCV, whose other decoders (DICOM through GDCM, JPEG 2000, OpenEXR,
// Radiance HDR, Sun raster, PFM) are not for training images: GDCM aborts the process on a
// malformed file (found by fuzz_image: 133 bytes with "DICM" at offset 128). Files that also carry
// DICOM's signature at offset 128 are refused whatever they start with, since OpenCV falls through
// to the DICOM decoder when the first format's own check fails.
bool is_accepted_image_format(const std::vector<uint8_t>& b) {
  const size_t n = b.size();
  auto starts = [&](const char* magic, size_t len) {
    return n >= len && std::memcmp(b.data(), magic, len) == 0;
  };
  if (n >= 132 && std::memcmp(b.data() + 128, "DICM", 4) == 0) return false;
  return starts("\xff\xd8\xff", 3) || starts("\x89PNG\r\n\x1a\n", 8) || starts("BM", 2) ||
         (n >= 3 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6' && std::isspace(b[2])) ||
         starts("II\x2a\x00", 4) || starts("MM\x00\x2a", 4) ||
         (n >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 &&
          std::memcmp(b.data() + 8, "WEBP", 4) == 0);
}

// The most pixels an image file may decode to: 64 Mpixel (e.g. 8192x8192), 192 MiB as RGB. A few
// hundred bytes of header can announce gigapixels; the header is checked before decoding.
constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

struct ImageSize {
  int64_t width = -1, height = -1;  // -1: not known
};

// The size the header of a PNG, JPEG, PNM or BMP file announces; unknown for other formats (TIFF,
// WebP: OpenCV's own limit of 2^30 pixels applies) and for headers too short to tell.
ImageSize header_size(const std::vector<uint8_t>& b) {
  const size_t n = b.size();
  auto be16 = [&](size_t i) { return int64_t{b[i]} << 8 | b[i + 1]; };
  if (n >= 24 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    return {load_be32(&b[16]), load_be32(&b[20])};  // IHDR: width, height
  }
  if (n >= 26 && b[0] == 'B' && b[1] == 'M') {  // BITMAPINFOHEADER: int32 width, height (< 0 ok)
    return {std::abs(int64_t{static_cast<int32_t>(load_le32(&b[18]))}),
            std::abs(int64_t{static_cast<int32_t>(load_le32(&b[22]))})};
  }
  if (n >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') {  // PNM: "P6 <w> <h> ...", # comments
    // Read as OpenCV's reader does: white space and comments (to the end of a line) before a
    // number, and the byte that ends a number consumed with it, whatever it is ("1094U" is 1094).
    int64_t dims[2] = {0, 0};
    size_t i = 2;
    for (int64_t& d : dims) {
      while (i < n && (std::isspace(b[i]) || b[i] == '#')) {
        if (b[i] == '#') {
          while (i < n && b[i] != '\n' && b[i] != '\r') ++i;  // a comment, to the end of its line
        }
        ++i;
      }
      if (i >= n || !std::isdigit(b[i])) return {};  // OpenCV refuses these
      for (; i < n && std::isdigit(b[i]); ++i) {
        d = std::min<int64_t>(d * 10 + (b[i] - '0'), kMaxImagePixels + 1);
      }
      ++i;  // the byte after the digits
    }
    return {dims[0], dims[1]};
  }
  if (n >= 4 && b[0] == 0xFF && b[1] == 0xD8) {  // JPEG: the frame header (SOFn) holds the size
    for (size_t i = 2; i + 9 <= n;) {
      const uint8_t m = b[i + 1];
      if (b[i] != 0xFF || m == 0xFF) {
        ++i;  // fill byte, or garbage before a marker (libjpeg skips it with a warning)
      } else if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
        i += 2;  // markers without a length
      } else if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
        return {be16(i + 7), be16(i + 5)};  // SOFn: length, precision, height, width
      } else if (m == 0xDA || m == 0xD9) {
        break;  // scan or end before any frame header
      } else {
        i += 2 + be16(i + 2);
      }
    }
  }
  return {};
}

// The image files of one class folder, sorted.
std::vector<std::string> list_images(const fs::path& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && is_image_file(it->path())) files.push_back(it->path().string());
  }
  SKA_CHECK(!ec, IOError, "cannot list the class folder '", folder.string(), "': ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

// Throws when `a` (the classes of `a_dir`) and `b` differ, naming one class found in only one.
void check_same_classes(const std::vector<std::string>& a, const std::string& a_dir,
                        const std::vector<std::string>& b, const std::string& b_dir) {
  if (a == b) return;
  std::vector<std::string> only_a, only_b;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_a));
  std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_b));
  const bool in_a = !only_a.empty();
  SKA_FAIL(IOError, "imagenet: the class folders of '", a_dir, "' (", a.size(), ") and '", b_dir,
           "' (", b.size(), ") differ: '", in_a ? only_a[0] : only_b[0], "' is only in '",
           in_a ? a_dir : b_dir, "'; expected the same classes in both splits");
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(std::string name, std::vector<std::string> classes,
                                       std::vector<FolderSample> samples)
    : name_(std::move(name)), classes_(std::move(classes)), samples_(std::move(samples)) {
  for (const FolderSample& s : samples_) {
    SKA_CHECK(s.label >= 0 && s.label < num_classes(), ValueError, name_, ": label ", s.label,
              " of '", s.path, "' is outside [0, ", num_classes(), ")");
  }
}

const FolderSample& ImageFolderDataset::sample(int64_t index) const {
  SKA_CHECK(index >= 0 && index < size(), ValueError, name_, ": sample index ", index,
            " is outside [0, ", size(), ")");
  return samples_[static_cast<size_t>(index)];
}

int64_t ImageFolderDataset::label(int64_t index) const { return sample(index).label; }

std::string ImageFolderDataset::describe(int64_t index) const {
  return name_ + " sample " + std::to_string(index) + ", class '" +
         classes_[static_cast<size_t>(sample(index).label)] + "'";
}

Sample ImageFolderDataset::get(int64_t index) const {
  const FolderSample& s = sample(index);
  return Sample{decode_image_rgb(s.path, describe(index)), s.label};
}

Sample ImageFolderDataset::get_window(int64_t index, const WindowChooser& choose) const {
  const FolderSample& s = sample(index);
  return Sample{decode_image_rgb_window(s.path, choose, describe(index)), s.label};
}

std::vector<std::string> list_class_folders(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) names.push_back(it->path().filename().string());
  }
  SKA_CHECK(!ec, IOError, "cannot list the class folders of '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

ImageFolderDataset scan_image_folder(const std::string& dir, const std::string& name,
                                     const std::vector<std::string>& classes) {
  std::vector<FolderSample> samples;
  std::vector<std::string> empty;  // class folders without an image (torchvision refuses them)
  for (size_t label = 0; label < classes.size(); ++label) {
    const fs::path folder = fs::path(dir) / classes[label];
    SKA_CHECK(fs::is_directory(folder), IOError, name, ": missing the class folder '",
              folder.string(), "'");
    const size_t before = samples.size();
    for (std::string& path : list_images(folder)) {
      samples.push_back(FolderSample{std::move(path), static_cast<int64_t>(label)});
    }
    if (samples.size() == before) empty.push_back(classes[label]);
  }
  SKA_CHECK(!samples.empty(), IOError, name, ": no image files under '", dir,
            "'; expected <class>/<image>.JPEG (or .jpg, .png, ...)");
  if (!empty.empty()) {
    std::string listed;
    for (size_t i = 0; i < empty.size() && i < 5; ++i) listed += (i ? ", '" : "'") + empty[i] + "'";
    if (empty.size() > 5) listed += " and " + std::to_string(empty.size() - 5) + " more";
    SKA_FAIL(IOError, name, ": ", empty.size(), " of the ", classes.size(),
             " class folders under '", dir, "' hold no image files: ", listed,
             "; a class without images cannot be learnt (remove the folder or add its images)");
  }
  return ImageFolderDataset(name, classes, std::move(samples));
}

ImageFolderDataset read_imagenet(const std::string& root, Split split) {
  const std::string train_dir = root + "/train", val_dir = root + "/val";
  const std::string& dir = split == Split::kTrain ? train_dir : val_dir;
  const std::string& other = split == Split::kTrain ? val_dir : train_dir;
  SKA_CHECK(fs::is_directory(dir), IOError, "imagenet: missing '", dir, "'; expected ", root,
            "/train/<class>/*.JPEG and ", root, "/val/<class>/*.JPEG (class-per-folder; a ",
            "manual download, see scripts/download_data.sh imagenet)");
  const std::vector<std::string> classes = list_class_folders(dir);
  SKA_CHECK(!classes.empty(), IOError, "imagenet: '", dir, "' has no class folders; expected ", dir,
            "/<class>/*.JPEG");
  if (fs::is_directory(other)) check_same_classes(classes, dir, list_class_folders(other), other);
  return scan_image_folder(dir, "imagenet", classes);
}

namespace {

// The whole image, or the window `choose` picks when it is not null.
Tensor decode_image(const std::string& path, const WindowChooser* choose, const std::string& what) {
  const std::string where = what.empty() ? "" : " (" + what + ")";
  const std::vector<uint8_t> bytes = read_file_bytes(path, "image");
  SKA_CHECK(!bytes.empty(), IOError, "cannot decode the image '", path, "'", where,
            ": the file is empty");
  SKA_CHECK(is_accepted_image_format(bytes), IOError, "image '", path, "'", where,
            ": not a JPEG, PNG, BMP, PNM, TIFF or WebP file (by its first bytes)");
  const ImageSize size = header_size(bytes);  // sides checked first: their product cannot overflow
  SKA_CHECK(size.width <= kMaxImagePixels && size.height <= kMaxImagePixels &&
                size.width * size.height <= kMaxImagePixels,
            IOError, "image '", path, "'", where, ": its header announces ", size.width, "x",
            size.height, " pixels; expected at most ", kMaxImagePixels, " pixels");
  const std::string named = "image '" + path + "'" + where;
  if (starts_as_jpeg(bytes.data(), bytes.size())) {
    return choose != nullptr
               ? decode_jpeg_rgb_window(bytes.data(), bytes.size(), named, kMaxImagePixels, *choose)
               : decode_jpeg_rgb(bytes.data(), bytes.size(), named, kMaxImagePixels);
  }
  const auto windowed = [&](const Tensor& image) {
    return choose == nullptr ? image : image_tensor_window(image, *choose, named);
  };
  if (starts_as_png(bytes.data(), bytes.size())) {
    return windowed(decode_png_rgb(bytes.data(), bytes.size(), named, kMaxImagePixels));
  }
#ifndef SKA_WITH_OPENCV
  SKA_FAIL(IOError, "cannot decode the image '", path, "'", where,
           ": this build decodes JPEG and PNG files only; reconfigure with -DSKA_OPENCV=ON for ",
           "BMP, PNM, TIFF and WebP (Debian/Ubuntu: apt-get install libopencv-dev)");
#else
  cv::Mat bgr;
  try {
    bgr = cv::imdecode(bytes, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    SKA_FAIL(IOError, "cannot decode the image '", path, "'", where, ": ", e.what());
  }
  SKA_CHECK(!bgr.empty() && bgr.depth() == CV_8U && bgr.total() <= uint64_t{kMaxImagePixels},
            IOError, "cannot decode the image '", path, "'", where,
            "; expected an 8-bit image file OpenCV reads (BMP, PNM, TIFF, WebP) of at most ",
            kMaxImagePixels, " pixels");
  Tensor out = Tensor::empty({bgr.rows, bgr.cols, 3}, DType::kU8);
  cv::Mat rgb(bgr.rows, bgr.cols, CV_8UC3, out.data<uint8_t>());  // converts into `out`
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return windowed(out);
#endif
}

}  // namespace

Tensor decode_image_rgb(const std::string& path, const std::string& what) {
  return decode_image(path, nullptr, what);
}

Tensor decode_image_rgb_window(const std::string& path, const WindowChooser& choose,
                               const std::string& what) {
  return decode_image(path, &choose, what);
}

}  // namespace ska::data
