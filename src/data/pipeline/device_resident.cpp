// DeviceResidentLoader: the dataset uploaded once, batches made by the augment_crop_flip kernel.
#include "data/pipeline/device_resident.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/backend.h"
#include "core/error.h"

namespace ska::data {

DeviceResidentLoader::DeviceResidentLoader(const InMemoryDataset& dataset,
                                           DeviceResidentLoaderOptions options, Device device)
    : options_(std::move(options)), device_(device) {
  const Tensor& images = dataset.images();
  const int64_t channels = images.size(3);
  SKA_CHECK(options_.batch_size > 0, ValueError,
            "DeviceResidentLoader: batch_size must be positive, got ", options_.batch_size);
  SKA_CHECK(channels <= CropFlipParams::kMaxChannels, ValueError,
            "DeviceResidentLoader: ", dataset.name(), " has ", channels,
            " channels; the device kernel takes at most ", CropFlipParams::kMaxChannels);
  SKA_CHECK(static_cast<int64_t>(options_.mean.size()) == channels &&
                static_cast<int64_t>(options_.std.size()) == channels,
            ValueError, "DeviceResidentLoader: mean/std need ", channels,
            " values (the dataset's channels)");
  SKA_CHECK(options_.dtype == DType::kF32 || options_.dtype == DType::kBF16, DTypeError,
            "DeviceResidentLoader: batches are f32 or bf16, got ", dtype_name(options_.dtype));
  params_.padding = options_.crop_padding;
  params_.flip_p = options_.hflip;
  params_.seed = options_.seed;
  for (int64_t k = 0; k < channels; ++k) {
    SKA_CHECK(options_.std[k] > 0, ValueError, "DeviceResidentLoader: std must be > 0");
    // The host loader's normalisation constants (to_normalized_batch).
    params_.scale[k] = static_cast<float>(1.0 / (255.0 * options_.std[k]));
    params_.shift[k] = static_cast<float>(-options_.mean[k] / options_.std[k]);
  }
  images_ = images.contiguous().to(device_);
  labels_ = dataset.labels().contiguous().to(device_);
  size_ = images.size(0);
  const std::vector<int64_t> dummy(static_cast<size_t>(size_));
  shard_size_ = static_cast<int64_t>(
      shard_indices(dummy, options_.rank, options_.world_size, options_.drop_last).size());
}

int64_t DeviceResidentLoader::batches_per_epoch() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? shard_size_ / b : (shard_size_ + b - 1) / b;
}

void DeviceResidentLoader::start_epoch(int64_t epoch, int64_t start_batch) {
  SKA_CHECK(start_batch >= 0 && start_batch <= batches_per_epoch(), ValueError,
            "DeviceResidentLoader: start batch ", start_batch, " is outside [0, ",
            batches_per_epoch(), "]");
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = epoch_permutation(size_, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(size_));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  const std::vector<int64_t> shard =
      shard_indices(order, options_.rank, options_.world_size, options_.drop_last);
  // A fresh pinned buffer each epoch: the previous one may still be read by its upload.
  indices_host_ = Tensor::empty_pinned({static_cast<int64_t>(shard.size())}, DType::kI64);
  std::memcpy(indices_host_.data_ptr(), shard.data(), shard.size() * sizeof(int64_t));
  indices_ = indices_host_.to(device_);
  params_.epoch = static_cast<uint64_t>(epoch);
  next_batch_ = start_batch;
  end_batch_ = batches_per_epoch();
}

bool DeviceResidentLoader::next(Batch& out) {
  if (next_batch_ >= end_batch_) return false;
  const int64_t b = next_batch_++;
  const int64_t first = b * options_.batch_size;
  const int64_t count = std::min(options_.batch_size, shard_size_ - first);
  const Tensor index = indices_.narrow(0, first, count);
  out.index = b;
  out.images = Tensor::empty({count, images_.size(3), images_.size(1), images_.size(2)},
                             options_.dtype, device_);
  SKA_KERNEL(device_, augment_crop_flip)(images_, index, params_, out.images);
  out.labels = Tensor::empty({count}, DType::kI64, device_);
  SKA_KERNEL(device_, index_select)(labels_, 0, index, out.labels);
  return true;
}

}  // namespace ska::data
