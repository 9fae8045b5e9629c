// The dataset factory: a name (cifar10, cifar100, svhn, fashion_mnist, imagenet), a root folder
// and a split give the matching reader's dataset; also the data config keys that choose them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/datasets/dataset.h"

namespace ska::data {

// The known names, in a fixed order.
const std::vector<std::string>& dataset_names();

// The class count of a known dataset (ValueError listing the known names otherwise).
int64_t dataset_num_classes(const std::string& name);

// Reads `split` of dataset `name` from `root`. root "" means the default location: Debian's
// /usr/share/datasets/fashion-mnist for fashion_mnist; for the others an IOError saying which
// files are expected where and pointing to scripts/download_data.sh. ValueError for unknown
// names (listing the known ones); the readers' IOErrors otherwise. Small datasets come back as
// InMemoryDataset, imagenet as ImageFolderDataset.
std::unique_ptr<Dataset> load_dataset(const std::string& name, const std::string& root,
                                      Split split);
std::unique_ptr<Dataset> load_dataset(const std::string& name, const std::string& root,
                                      const std::string& split);  // "train", "test" or "val"

// The `data:` keys naming the dataset: `dataset` (required, one of dataset_names()) and `root`
// (optional, default ""). ConfigError naming the key otherwise.
struct DatasetSpec {
  std::string name;
  std::string root;
};
DatasetSpec read_dataset_spec(const ConfigNode& data);

}  // namespace ska::data
