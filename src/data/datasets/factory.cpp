// The dataset factory (see factory.h): one table row per dataset with its class count, the files
// it expects (for the "no root given" message) and its reader.
#include "data/datasets/factory.h"

#include <cstdint>
#include <filesystem>

#include "data/datasets/cifar.h"
#include "data/datasets/idx.h"
#include "data/datasets/image_folder.h"
#include "data/datasets/svhn.h"

namespace ska::data {
namespace {

namespace fs = std::filesystem;

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

// The repository holding `executable`: the nearest folder above it with data/README.md ("" if
// none).
std::string repository_above(const std::string& executable) {
  if (executable.empty()) return "";
  for (fs::path dir = fs::path(executable).parent_path(); !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / "data" / "README.md")) return dir.string();
  }
  return "";
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
  return e.reader(resolve_data_root(name, root), split);
}

std::vector<std::string> default_data_roots(const std::string& name, const std::string& cwd,
                                            const std::string& executable) {
  std::vector<std::string> roots = {(fs::path(cwd) / "data" / name).lexically_normal().string()};
  const std::string repo = repository_above(executable);
  if (!repo.empty()) {
    const std::string in_repo = (fs::path(repo) / "data" / name).lexically_normal().string();
    std::error_code e1, e2;
    if (fs::weakly_canonical(in_repo, e1) != fs::weakly_canonical(roots[0], e2))
      roots.push_back(in_repo);
  }
  if (name == "fashion_mnist") roots.emplace_back(kFashionMnistDebianDir);
  return roots;
}

std::string resolve_data_root(const std::string& name, const std::string& root,
                              const std::string& cwd, const std::string& executable) {
  if (!root.empty()) return root;
  const DatasetEntry& e = find_entry(name);
  const std::vector<std::string> roots = default_data_roots(name, cwd, executable);
  std::string tried;
  for (const std::string& candidate : roots) {
    if (fs::is_directory(candidate)) return candidate;
    tried += (tried.empty() ? "" : ", ") + candidate;
  }
  if (name == "fashion_mnist") return roots.back();
  SKA_FAIL(IOError, name, ": no data root given and no folder at the default places (", tried,
           "); expected ", e.expected_files, "; get them with scripts/download_data.sh ", name,
           " (writes data/", name, ") or set data.root");
}

std::string resolve_data_root(const std::string& name, const std::string& root) {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  return resolve_data_root(name, root, fs::current_path().string(), error ? "" : exe.string());
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
