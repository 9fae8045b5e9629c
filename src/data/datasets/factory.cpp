// The dataset factory (see factory.h): one table row per dataset with its class count, the files
// it expects (for the "no root given" message) and its reader.
#include "data/datasets/factory.h"

#include <cstdint>

#include "data/datasets/cifar.h"
#include "data/datasets/idx.h"
#include "data/datasets/image_folder.h"
#include "data/datasets/svhn.h"

namespace ska::data {
namespace {

using Reader = std::unique_ptr<Dataset> (*)(const std::string& root, Split split);

template <typename D, D (*read)(const std::string&, Split)>
std::unique_ptr<Dataset> wrap(const std::string& root, Split split) {
  return std::make_unique<D>(read(root, split));
}

struct DatasetEntry {
  const char* name;
  int64_t num_classes;
  const char* expected_files;  // what a root folder must hold
  Reader reader;
};

const DatasetEntry kDatasets[] = {
    {"cifar10", 10, "data_batch_1..5.bin and test_batch.bin (cifar-10-binary.tar.gz)",
     wrap<InMemoryDataset, read_cifar10>},
    {"cifar100", 100, "train.bin and test.bin (cifar-100-binary.tar.gz)",
     wrap<InMemoryDataset, read_cifar100>},
    {"svhn", 10, "train_32x32.mat and test_32x32.mat (SVHN format 2)",
     wrap<InMemoryDataset, read_svhn>},
    {"fashion_mnist", 10, "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
     wrap<InMemoryDataset, read_fashion_mnist>},
    {"imagenet", 1000, "train/<class>/*.JPEG and val/<class>/*.JPEG (manual download)",
     wrap<ImageFolderDataset, read_imagenet>},
};

std::string known_names() {
  std::string out;
  for (const std::string& n : dataset_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const DatasetEntry& find_entry(const std::string& name) {
  for (const DatasetEntry& e : kDatasets) {
    if (name == e.name) return e;
  }
  SKA_FAIL(ValueError, "unknown dataset '", name, "'; known datasets: ", known_names());
}

}  // namespace

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const DatasetEntry& e : kDatasets) out.emplace_back(e.name);
    return out;
  }();
  return names;
}

int64_t dataset_num_classes(const std::string& name) { return find_entry(name).num_classes; }

std::unique_ptr<Dataset> load_dataset(const std::string& name, const std::string& root,
                                      Split split) {
  const DatasetEntry& e = find_entry(name);
  const bool has_default = name == "fashion_mnist";
  SKA_CHECK(!root.empty() || has_default, IOError, name,
            ": no data root given and no default location; expected ", e.expected_files,
            " in a folder passed as the root; see scripts/download_data.sh ", name, " DIR");
  return e.reader(root, split);
}

std::unique_ptr<Dataset> load_dataset(const std::string& name, const std::string& root,
                                      const std::string& split) {
  return load_dataset(name, root, parse_split(split));
}

DatasetSpec read_dataset_spec(const ConfigNode& data) {
  DatasetSpec spec;
  spec.name = data.get<std::string>("dataset");
  spec.name = data.get_choice("dataset", spec.name, dataset_names());
  spec.root = data.get("root", "");
  return spec;
}

}  // namespace ska::data
