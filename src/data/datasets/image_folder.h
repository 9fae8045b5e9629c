// Class-per-folder image datasets (ImageNet's train/ and val/ after the usual val preparation):
// labels from the sorted folder names, images decoded with OpenCV when a sample is read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/datasets/dataset.h"

namespace ska::data {

struct FolderSample {
  std::string path;
  int64_t label = 0;
};

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(std::string name, std::vector<std::string> classes,
                     std::vector<FolderSample> samples);

  const std::string& name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  int64_t label(int64_t index) const override;
  // Decodes the file: RGB uint8 [H, W, 3]. IOError naming the file when it cannot be decoded.
  Sample get(int64_t index) const override;
  // JPEG files decode only the window (decode_jpeg_rgb_window); other formats whole, then cropped.
  Sample get_window(int64_t index, const WindowChooser& choose) const override;

  const std::vector<std::string>& classes() const { return classes_; }  // label -> folder name
  const std::vector<FolderSample>& samples() const { return samples_; }

 private:
  const FolderSample& sample(int64_t index) const;
  std::string describe(int64_t index) const;  // "imagenet sample 12, class 'n01440764'"

  std::string name_;
  std::vector<std::string> classes_;
  std::vector<FolderSample> samples_;
};

// The sorted names of the sub-folders of `dir` (IOError naming `dir` when it cannot be listed).
std::vector<std::string> list_class_folders(const std::string& dir);

// Every image file (by extension: jpg, jpeg, png, ppm, pgm, bmp, tif, tiff, webp; any case)
// under dir/<classes[i]>/ with label i, sorted by path within a class. IOError when a class
// folder is missing or the whole split holds no image.
ImageFolderDataset scan_image_folder(const std::string& dir, const std::string& name,
                                     const std::vector<std::string>& classes);

// root/train/<class>/*.JPEG and root/val/<class>/*.JPEG; `split` kTest reads val/. The class
// list comes from the split's folders and must equal the other split's when that exists
// (IOError naming a class found in only one of them).
ImageFolderDataset read_imagenet(const std::string& root, Split split);

// Any image file OpenCV reads, as RGB uint8 [H, W, 3] (grey files replicated). IOError naming
// the file (and `what`, e.g. "sample 12, class 'n01440764'") when it cannot be decoded.
Tensor decode_image_rgb(const std::string& path, const std::string& what = "");
// The window `choose` picks of that image (decode_jpeg_rgb_window for JPEG files).
Tensor decode_image_rgb_window(const std::string& path, const WindowChooser& choose,
                               const std::string& what = "");

}  // namespace ska::data
