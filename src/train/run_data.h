// The datasets of a run shaped for its model, and the loader options for training and
// evaluation (sharded by rank when several workers train together).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/datasets/dataset.h"
#include "data/pipeline/loader.h"
#include "train/options.h"

namespace ska::train {

// Loads a split as an in-memory dataset shaped for the model: grey 28x28 images are zero-padded
// and replicated (pad_and_replicate) when the model wants a larger or 3-channel input; `subset`
// keeps the first N images (0: all). ValueError when the sizes cannot be reconciled.
std::unique_ptr<data::InMemoryDataset> load_training_dataset(const DataOptions& options,
                                                             const std::string& split,
                                                             int64_t image_size, int64_t channels,
                                                             int64_t subset);

// Loads a split for the trainer: in-memory datasets as load_training_dataset does; folder datasets
// (imagenet) stay on disk and the loader decodes each sample. For those, `subset` N keeps N images
// spread evenly over the split (the folders are sorted by class, so the first N would be one).
std::unique_ptr<data::Dataset> load_dataset_split(const DataOptions& options,
                                                  const std::string& split, int64_t image_size,
                                                  int64_t channels, int64_t subset);

// The loader options for `dataset`. Training: data.batch_size, workers, the seed and data.augment's
// per-sample transform, which must crop datasets of varying image sizes to the model's size
// (ConfigError naming data.augment.random_resized_crop otherwise). Evaluation: eval_batch_size,
// dataset order, no augmentation; datasets decoded per sample get the eval transform (shorter
// side to image_size / crop_pct, centre crop). Worker `rank` of `world_size` reads its shard:
// training drops the tail that does not divide evenly; evaluation splits the whole set unevenly
// (no sample twice, none left out), so summed counts equal one worker's.
data::LoaderOptions train_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                   uint64_t seed, int rank = 0, int world_size = 1);
data::LoaderOptions eval_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                  int rank = 0, int world_size = 1);

}  // namespace ska::train
