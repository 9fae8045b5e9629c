// The folder datasets (see image_folder.h): directory scans with std::filesystem, class lists
// compared between splits, and OpenCV decoding to RGB on access.
#include "data/datasets/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#ifdef SKA_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "core/error.h"

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

Sample ImageFolderDataset::get(int64_t index) const {
  const FolderSample& s = sample(index);
  const std::string what = name_ + " sample " + std::to_string(index) + ", class '" +
                           classes_[static_cast<size_t>(s.label)] + "'";
  return Sample{decode_image_rgb(s.path, what), s.label};
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
  for (size_t label = 0; label < classes.size(); ++label) {
    const fs::path folder = fs::path(dir) / classes[label];
    SKA_CHECK(fs::is_directory(folder), IOError, name, ": missing the class folder '",
              folder.string(), "'");
    for (std::string& path : list_images(folder)) {
      samples.push_back(FolderSample{std::move(path), static_cast<int64_t>(label)});
    }
  }
  SKA_CHECK(!samples.empty(), IOError, name, ": no image files under '", dir,
            "'; expected <class>/<image>.JPEG (or .jpg, .png, ...)");
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

Tensor decode_image_rgb(const std::string& path, const std::string& what) {
#ifndef SKA_WITH_OPENCV
  SKA_FAIL(IOError, "cannot decode the image '", path, "'", what.empty() ? "" : " (" + what + ")",
           ": this build has no image decoding; reconfigure with -DSKA_OPENCV=ON (Debian/Ubuntu: ",
           "apt-get install libopencv-dev)");
#else
  const cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR);
  SKA_CHECK(!bgr.empty() && bgr.depth() == CV_8U, IOError, "cannot decode the image '", path, "'",
            what.empty() ? "" : " (" + what + ")",
            "; expected an 8-bit image file OpenCV reads (JPEG, PNG, ...)");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  Tensor out = Tensor::empty({rgb.rows, rgb.cols, 3}, DType::kU8);
  uint8_t* dst = out.data<uint8_t>();
  const size_t row_bytes = static_cast<size_t>(rgb.cols) * 3;
  for (int r = 0; r < rgb.rows; ++r)
    std::memcpy(dst + r * row_bytes, rgb.ptr<uint8_t>(r), row_bytes);
  return out;
#endif
}

}  // namespace ska::data
