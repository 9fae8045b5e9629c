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

// The folders an empty data root means for dataset `name`, in the order they are tried:
// <cwd>/data/<name>, then <repo>/data/<name> for the repository holding `executable` (the nearest
// folder above it with data/README.md; skipped when there is none or it is the same folder), then
// for fashion_mnist Debian's /usr/share/datasets/fashion-mnist.
std::vector<std::string> default_data_roots(const std::string& name, const std::string& cwd,
                                            const std::string& executable);

// `root` when not empty; else the first of default_data_roots (for this process's current
// directory and executable) that is a folder. When none is: fashion_mnist's last candidate
// (Debian's folder, whose reader then names the missing files), for the others an IOError listing
// the folders tried and the files expected, pointing to scripts/download_data.sh.
std::string resolve_data_root(const std::string& name, const std::string& root);
std::string resolve_data_root(const std::string& name, const std::string& root,
                              const std::string& cwd, const std::string& executable);

// Reads `split` of dataset `name` from `root` (resolve_data_root: "" looks in data/<name>, and
// Debian's folder for fashion_mnist). ValueError for unknown
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
