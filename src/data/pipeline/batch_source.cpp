// The trainer's batch source: data.device_resident validation and the choice between the host
// loader, the pinned prefetcher and the device-resident dataset.
#include "data/pipeline/batch_source.h"

#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/pipeline/device_prefetcher.h"
#include "data/pipeline/device_resident.h"

namespace ska::data {

DeviceResidentOptions DeviceResidentOptions::from_config(const ConfigNode& data,
                                                         const TrainAugment& augment,
                                                         int64_t image_size) {
  DeviceResidentOptions o;
  o.enabled = data.get<bool>("device_resident", false);
  if (!o.enabled) return o;
  const ConfigNode aug = data["augment"];
  const std::string ra = aug.get("randaugment", "none");
  if (ra != "none" && !ra.empty()) {
    data.fail("device_resident",
              "true cannot be combined with data.augment.randaugment: " + ra +
                  ". RandAugment's operations (rotations, shears, posterize, solarize, equalize, "
                  "...) are PIL-exact per-sample transforms that run on the host in the loader's "
                  "workers and have no CUDA kernels; set data.device_resident: false to keep "
                  "RandAugment, or data.augment.randaugment: none to train from the GPU copy");
  }
  if (aug.get<bool>("random_resized_crop", false) ||
      aug.get_double_in("color_jitter", 0.0, 0.0, 1.0) > 0) {
    data.fail("device_resident",
              "true supports only data.augment.crop_padding and data.augment.hflip on the "
              "device (plus random_erasing and mixup, which run on the batch afterwards); "
              "data.augment.random_resized_crop and data.augment.color_jitter need the host "
              "loader (data.device_resident: false)");
  }
  const int64_t pad_to = aug.get_int_in("pad_to", 0, 0, 4096);
  if (pad_to != 0 && pad_to != image_size) {
    const std::string sizes = std::to_string(image_size) + ", got " + std::to_string(pad_to);
    data.fail("device_resident",
              "true needs data.augment.pad_to to be 0 or the model's image "
              "size (the dataset is padded once, before the upload): " +
                  sizes);
  }
  o.crop_padding = aug.get_int_in("crop_padding", 0, 0, 64);
  o.hflip = aug.get_double_in("hflip", 0.0, 0.0, 1.0);
  // Anything else the host pipeline would run per sample is not on the device.
  for (const std::string& step : augment.steps) {
    if (step != "RandomCrop" && step != "RandomHorizontalFlip" && step != "PadReplicate") {
      data.fail("device_resident",
                "true cannot run the per-sample step " + step + " of data.augment on the device");
    }
  }
  return o;
}

std::unique_ptr<BatchSource> make_batch_source(DataLoader& loader, const Dataset& dataset,
                                               const DeviceResidentOptions& resident,
                                               Device device) {
  if (resident.enabled) {
    const auto* memory = dynamic_cast<const InMemoryDataset*>(&dataset);
    SKA_CHECK(memory != nullptr, ConfigError,
              "data.device_resident: true needs an in-memory "
              "dataset (cifar10, cifar100, svhn, fashion_mnist); ",
              dataset.name(),
              " is decoded from files per sample (set data.device_resident: false)");
    SKA_CHECK(device.is_cuda(), ConfigError,
              "data.device_resident: true keeps the dataset in GPU "
              "memory and needs a CUDA device; this run trains on ",
              device, " (set data.device_resident: false)");
    const LoaderOptions& lo = loader.options();
    DeviceResidentLoaderOptions o;
    o.batch_size = lo.batch_size;
    o.shuffle = lo.shuffle;
    o.drop_last = lo.drop_last;
    o.seed = lo.seed;
    o.rank = lo.rank;
    o.world_size = lo.world_size;
    o.mean = lo.mean;
    o.std = lo.std;
    o.crop_padding = resident.crop_padding;
    o.hflip = resident.hflip;
    return std::make_unique<DeviceResidentLoader>(*memory, o, device);
  }
  if (device.is_cuda()) return std::make_unique<DevicePrefetcher>(loader, device);
  return std::make_unique<LoaderBatches>(loader);
}

}  // namespace ska::data
