// Datasets and loader options for a run (see run_data.h).
#include "train/run_data.h"

#include <algorithm>
#include <cstdint>

#include "config/config.h"
#include "core/error.h"
#include "data/datasets/factory.h"

namespace ska::train {

namespace {

// An in-memory split shaped for the model (see load_training_dataset).
std::unique_ptr<data::InMemoryDataset> shape_for_model(const data::InMemoryDataset* mem,
                                                       const DataOptions& options,
                                                       int64_t image_size, int64_t channels,
                                                       int64_t subset) {
  Tensor images = mem->images(), labels = mem->labels();
  if (subset > 0 && subset < images.size(0)) {
    images = images.narrow(0, 0, subset).contiguous();
    labels = labels.narrow(0, 0, subset).contiguous();
  }
  if (images.size(1) != image_size || images.size(3) != channels) {
    // The dataset's images are padded (centred) and their channels replicated to the model's
    // input; a model input they cannot become is a config error naming the keys.
    const int64_t h = images.size(1), w = images.size(2), c = images.size(3);
    SKA_CHECK(h <= image_size && w <= image_size && (image_size - h) % 2 == 0 &&
                  (image_size - w) % 2 == 0 && (c == channels || c == 1),
              ConfigError, "model.image_size ", image_size, ", model.in_channels ", channels, ": ",
              options.dataset, "'s ", h, "x", w, "x", c,
              " images are padded equally on each side (and grey ones replicated) to the model's "
              "input; expected model.image_size ",
              std::max(h, w), " + 2k (k >= 0)",
              c == 1 ? std::string() : ", model.in_channels " + std::to_string(c));
    images = data::pad_and_replicate(images, image_size, channels);
  }
  SKA_CHECK(images.size(1) == image_size && images.size(2) == image_size, ValueError,
            options.dataset, " images are ", images.size(1), "x", images.size(2),
            "; the model takes ", image_size, "x", image_size);
  return std::make_unique<data::InMemoryDataset>(mem->name(), images, labels, mem->num_classes());
}

// The split of the configured dataset; IOError when it holds no images.
std::unique_ptr<data::Dataset> load_split(const DataOptions& options, const std::string& split) {
  std::unique_ptr<data::Dataset> loaded = data::load_dataset(options.dataset, options.root, split);
  SKA_CHECK(loaded->size() > 0, IOError, "data.dataset: ", options.dataset, "'s ", split, " split",
            options.root.empty() ? std::string() : " under '" + options.root + "'",
            " holds no images: nothing to ", split == "test" ? "evaluate on" : "train on");
  return loaded;
}

}  // namespace

std::unique_ptr<data::InMemoryDataset> load_training_dataset(const DataOptions& options,
                                                             const std::string& split,
                                                             int64_t image_size, int64_t channels,
                                                             int64_t subset) {
  std::unique_ptr<data::Dataset> loaded = load_split(options, split);
  const auto* mem = dynamic_cast<const data::InMemoryDataset*>(loaded.get());
  SKA_CHECK(mem != nullptr, ValueError, "load_training_dataset reads in-memory datasets only; '",
            options.dataset, "' is a folder dataset (use load_dataset_split)");
  return shape_for_model(mem, options, image_size, channels, subset);
}

std::unique_ptr<data::Dataset> load_dataset_split(const DataOptions& options,
                                                  const std::string& split, int64_t image_size,
                                                  int64_t channels, int64_t subset) {
  std::unique_ptr<data::Dataset> loaded = load_split(options, split);
  if (const auto* mem = dynamic_cast<const data::InMemoryDataset*>(loaded.get())) {
    return shape_for_model(mem, options, image_size, channels, subset);
  }
  if (subset <= 0 || subset >= loaded->size()) return loaded;
  std::vector<int64_t> keep = data::spread_indices(loaded->size(), subset);
  return std::make_unique<data::SubsetDataset>(std::move(loaded), std::move(keep));
}

data::LoaderOptions train_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                   uint64_t seed, int rank, int world_size) {
  data::LoaderOptions lo;
  lo.rank = rank;
  lo.world_size = world_size;
  lo.batch_size = options.batch_size;
  lo.workers = options.workers;
  lo.seed = seed;
  lo.mean = options.mean;
  lo.std = options.std;
  lo.transform = options.augment.transform;
  lo.image_size = options.eval.image_size;
  if (dynamic_cast<const data::InMemoryDataset*>(&dataset) == nullptr) {
    const auto& steps = options.augment.steps;
    SKA_CHECK(std::find(steps.begin(), steps.end(), "RandomResizedCrop") != steps.end(),
              ConfigError, "data.augment.random_resized_crop: ", dataset.name(),
              " images vary in size, so training needs random_resized_crop: true (it crops every "
              "image to the model's ", lo.image_size, "x", lo.image_size, ")");
  }
  return lo;
}

data::LoaderOptions eval_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                  int rank, int world_size) {
  data::LoaderOptions lo;
  lo.rank = rank;
  lo.world_size = world_size;
  lo.pad_shards = false;
  lo.batch_size = options.eval_batch_size;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.workers = options.workers;
  lo.mean = options.mean;
  lo.std = options.std;
  if (dynamic_cast<const data::InMemoryDataset*>(&dataset) == nullptr) {
    lo.eval_transform = std::make_shared<data::EvalTransform>(options.eval);
  }
  return lo;
}

}  // namespace ska::train
