// Datasets as the readers return them: labelled uint8 images, channels-last [H, W, C] as stored.
// Small datasets live in memory as two tensors; ImageNet is a folder dataset decoded per sample.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "data/image_window.h"

namespace ska::data {

enum class Split { kTrain, kTest };  // ImageNet's "val" is kTest

// "train" -> kTrain; "test" or "val" -> kTest. ValueError naming the accepted spellings otherwise.
Split parse_split(const std::string& name);
const char* split_name(Split split);  // "train" / "test"

// One labelled image: `image` is a CPU uint8 tensor [H, W, C] (RGB order when C == 3).
struct Sample {
  Tensor image;
  int64_t label = 0;
};

// The interface every dataset offers to the loader.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const std::string& name() const = 0;  // "cifar10", "imagenet", ...
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual int64_t label(int64_t index) const = 0;  // without decoding the image
  virtual Sample get(int64_t index) const = 0;     // ValueError when index is out of range
  // The window `choose` picks, given the image's height and width, of get(index)'s image:
  // [box.height, box.width, C], the same pixels. Datasets of encoded files decode only what the
  // window needs where the format allows (JPEG); the default crops get(index)'s image.
  virtual Sample get_window(int64_t index, const WindowChooser& choose) const;
};

// A whole split in memory: images uint8 [N, H, W, C], labels i64 [N] in [0, num_classes).
class InMemoryDataset : public Dataset {
 public:
  // Validates dtypes, ranks, N and the label range (ValueError naming `name`).
  InMemoryDataset(std::string name, Tensor images, Tensor labels, int64_t num_classes);

  const std::string& name() const override { return name_; }
  int64_t size() const override { return images_.size(0); }
  int64_t num_classes() const override { return num_classes_; }
  int64_t label(int64_t index) const override;
  Sample get(int64_t index) const override;  // image is a view into images()

  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }

 private:
  void check_index(int64_t index) const;

  std::string name_;
  Tensor images_;
  Tensor labels_;
  int64_t num_classes_;
};

// The paper's layout for grey datasets (Fashion-MNIST): images [N, H, W, C] zero-padded equally on
// every side to [N, size, size, channels], a single channel replicated. torchvision's Pad(2) for
// 28 -> 32. ValueError when the images are larger than `size` or the padding is not even.
Tensor pad_and_replicate(const Tensor& images, int64_t size, int64_t channels);

}  // namespace ska::data
