// The split names, the in-memory dataset's validation and access, and the grey-to-RGB padding
// of the paper's recipe (see dataset.h).
#include "data/datasets/dataset.h"

#include <cstdint>
#include <cstring>

#include "data/datasets/image_decode.h"

namespace ska::data {

Split parse_split(const std::string& name) {
  if (name == "train") return Split::kTrain;
  if (name == "test" || name == "val") return Split::kTest;
  SKA_FAIL(ValueError, "unknown dataset split '", name, "'; expected train, test or val");
}

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

InMemoryDataset::InMemoryDataset(std::string name, Tensor images, Tensor labels,
                                 int64_t num_classes)
    : name_(std::move(name)),
      images_(std::move(images)),
      labels_(std::move(labels)),
      num_classes_(num_classes) {
  SKA_CHECK(images_.dtype() == DType::kU8 && images_.dim() == 4 && images_.device().is_cpu(),
            ValueError, name_, ": images must be a CPU u8 [N, H, W, C] tensor, got ",
            images_.str());
  SKA_CHECK(labels_.dtype() == DType::kI64 && labels_.dim() == 1 &&
                labels_.size(0) == images_.size(0) && labels_.device().is_cpu(),
            ValueError, name_, ": labels must be a CPU i64 [", images_.size(0), "] tensor, got ",
            labels_.str());
  SKA_CHECK(num_classes_ > 0, ValueError, name_, ": num_classes must be positive");
  images_ = images_.contiguous();
  labels_ = labels_.contiguous();
  const int64_t* l = labels_.data<int64_t>();
  for (int64_t i = 0; i < labels_.numel(); ++i) {
    SKA_CHECK(l[i] >= 0 && l[i] < num_classes_, ValueError, name_, ": label ", l[i], " of sample ",
              i, " is outside [0, ", num_classes_, ")");
  }
}

void InMemoryDataset::check_index(int64_t index) const {
  SKA_CHECK(index >= 0 && index < size(), ValueError, name_, ": sample index ", index,
            " is outside [0, ", size(), ")");
}

int64_t InMemoryDataset::label(int64_t index) const {
  check_index(index);
  return labels_.data<int64_t>()[index];
}

Sample Dataset::get_window(int64_t index, const WindowChooser& choose) const {
  Sample sample = get(index);
  sample.image =
      image_tensor_window(sample.image, choose, name() + " sample " + std::to_string(index));
  return sample;
}

Sample InMemoryDataset::get(int64_t index) const {
  check_index(index);
  return Sample{images_.select(0, index), labels_.data<int64_t>()[index]};
}

Tensor pad_and_replicate(const Tensor& images, int64_t size, int64_t channels) {
  SKA_CHECK(images.dtype() == DType::kU8 && images.dim() == 4, ValueError,
            "pad_and_replicate: expected u8 [N, H, W, C] images, got ", images.str());
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2), c = images.size(3);
  SKA_CHECK(h <= size && w <= size && (size - h) % 2 == 0 && (size - w) % 2 == 0, ValueError,
            "pad_and_replicate: cannot pad ", h, "x", w, " images equally to ", size, "x", size);
  SKA_CHECK(c == channels || c == 1, ValueError, "pad_and_replicate: cannot make ", channels,
            " channels from ", c);
  const Tensor src = images.contiguous();
  Tensor out = Tensor::zeros({n, size, size, channels}, DType::kU8);
  const uint8_t* s = src.data<uint8_t>();
  uint8_t* d = out.data<uint8_t>();
  const int64_t top = (size - h) / 2, left = (size - w) / 2;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const uint8_t* from = s + ((i * h + y) * w + x) * c;
        uint8_t* to = d + ((i * size + y + top) * size + x + left) * channels;
        for (int64_t k = 0; k < channels; ++k) to[k] = from[c == 1 ? 0 : k];
      }
    }
  }
  return out;
}

}  // namespace ska::data
