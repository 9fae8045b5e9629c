// The device-resident training set (data.device_resident): the whole uint8 NHWC dataset and its
// labels are uploaded once; each batch is one augment_crop_flip kernel (gather, RandomCrop with
// zero padding, flip, normalisation) and one index_select for the labels, with no host work or
// transfer in the step. Order, sharding and draws are the host DataLoader's, so its batches equal
// the loader's bit for bit, and a resumed epoch continues exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kernel_types.h"
#include "core/tensor.h"
#include "data/datasets/dataset.h"
#include "data/pipeline/batch_source.h"

namespace ska::data {

struct DeviceResidentLoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;  // false: dataset order
  bool drop_last = true;
  uint64_t seed = 0;  // the loader's seed: shuffle and augmentation
  int rank = 0, world_size = 1;
  std::vector<double> mean, std;  // per channel (0..1 scale), as LoaderOptions
  int64_t crop_padding = 0;       // RandomCrop(image size, padding); 0: no crop
  double hflip = 0.0;             // flip probability; 0: no flip
  DType dtype = DType::kF32;      // batch images: f32 or bf16
};

class DeviceResidentLoader : public BatchSource {
 public:
  // Uploads `dataset` to `device` (any device; the CPU runs the kernels' CPU twins, which is how
  // CI tests it). ValueError for bad options (mean/std size, channels above the kernel's limit).
  DeviceResidentLoader(const InMemoryDataset& dataset, DeviceResidentLoaderOptions options,
                       Device device);

  int64_t batches_per_epoch() const;
  // The epoch's shuffled, sharded indices go to the device from pinned memory (no host wait).
  void start_epoch(int64_t epoch, int64_t start_batch) override;
  bool next(Batch& out) override;

 private:
  DeviceResidentLoaderOptions options_;
  Device device_;
  Tensor images_, labels_;         // the dataset on the device: u8 [N, H, W, C], i64 [N]
  int64_t size_ = 0;               // N
  int64_t shard_size_ = 0;         // this rank's samples per epoch
  CropFlipParams params_;          // epoch set by start_epoch
  Tensor indices_host_, indices_;  // this rank's indices for the epoch (pinned, device)
  int64_t next_batch_ = 0, end_batch_ = 0;
};

}  // namespace ska::data
