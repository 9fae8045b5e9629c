// Where the trainer's training batches come from, chosen once per run: the host DataLoader as is
// (CPU), the host loader with pinned, asynchronous uploads one batch ahead (CUDA), or the
// device-resident dataset augmented by a kernel (CUDA, data.device_resident).
#pragma once

#include <cstdint>
#include <memory>

#include "config/config.h"
#include "core/device.h"
#include "data/datasets/dataset.h"
#include "data/transforms/augment_factory.h"
#include "data/pipeline/loader.h"

namespace ska::data {

// The training batches of one epoch after another, on the training device. A source repeats the
// host loader's batches exactly: same samples in the same order, same augmentation.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Starts epoch `epoch` at batch `start_batch` (resume), as DataLoader::start_epoch.
  virtual void start_epoch(int64_t epoch, int64_t start_batch) = 0;
  // The next batch (images and labels on the device); false at the end of the epoch.
  virtual bool next(Batch& out) = 0;
};

// The host loader's batches unchanged (the CPU device).
class LoaderBatches : public BatchSource {
 public:
  explicit LoaderBatches(DataLoader& loader) : loader_(loader) {}
  void start_epoch(int64_t epoch, int64_t start_batch) override {
    loader_.start_epoch(epoch, start_batch);
  }
  bool next(Batch& out) override { return loader_.next(out); }

 private:
  DataLoader& loader_;
};

// `data.device_resident`: keep the whole uint8 training set on the GPU and augment there.
struct DeviceResidentOptions {
  bool enabled = false;
  int64_t crop_padding = 0;  // data.augment.crop_padding (RandomCrop to the image size)
  double hflip = 0.0;        // data.augment.hflip
  // Reads data.device_resident (default false). When true, data.augment may only ask for what the
  // kernel does (crop with padding, flip; random erasing and mixup run on the batch afterwards, on
  // the device): ConfigError naming data.device_resident and the offending key otherwise.
  static DeviceResidentOptions from_config(const ConfigNode& data,
                                           const TrainAugment& augment, int64_t image_size);
};

// The batch source for training on `device`. `loader` (which reads `dataset`) and `dataset` must
// outlive it. ConfigError when data.device_resident is set but the device is not CUDA or the
// dataset is not in memory.
std::unique_ptr<BatchSource> make_batch_source(DataLoader& loader, const Dataset& dataset,
                                               const DeviceResidentOptions& resident,
                                               Device device);

}  // namespace ska::data
