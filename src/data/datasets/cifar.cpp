// The CIFAR binary readers (see cifar.h): size and label validation per file, CHW planes to the
// channels-last layout the datasets keep.
#include "data/datasets/cifar.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "data/datasets/file_bytes.h"

namespace ska::data {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kPlane = kSide * kSide;
constexpr int64_t kPixels = 3 * kPlane;

struct CifarFormat {
  const char* name;     // dataset name in messages
  const char* archive;  // the official archive
  const char* subdir;   // the folder the archive extracts to
  std::vector<std::string> train_files;
  std::vector<std::string> test_files;
  std::vector<const char*> label_names;  // one per label byte
  std::vector<int> label_limits;         // each label byte must be below its limit
  int64_t num_classes;                   // the limit of the last label byte, the one used
  int64_t record_bytes() const { return static_cast<int64_t>(label_limits.size()) + kPixels; }
};

const CifarFormat& cifar10_format() {
  static const CifarFormat f{"cifar10",
                             "cifar-10-binary.tar.gz",
                             "cifar-10-batches-bin",
                             {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                              "data_batch_4.bin", "data_batch_5.bin"},
                             {"test_batch.bin"},
                             {"label"},
                             {10},
                             10};
  return f;
}

const CifarFormat& cifar100_format() {
  static const CifarFormat f{
      "cifar100",   "cifar-100-binary.tar.gz",      "cifar-100-binary", {"train.bin"},
      {"test.bin"}, {"coarse label", "fine label"}, {20, 100},          100};
  return f;
}

// root, or root/<subdir> when the files are there instead.
std::string resolve_root(const CifarFormat& f, const std::string& root,
                         const std::vector<std::string>& files) {
  if (!first_existing_file({root + "/" + files[0]}).empty()) return root;
  const std::string nested = root + "/" + f.subdir;
  if (!first_existing_file({nested + "/" + files[0]}).empty()) return nested;
  std::string expected;
  for (const std::string& name : files) expected += (expected.empty() ? "" : ", ") + name;
  SKA_FAIL(IOError, f.name, ": missing '", root, "/", files[0], "'; expected ", expected, " (from ",
           f.archive, ") in '", root, "' or '", nested, "'; scripts/download_data.sh ", f.name,
           " <dir> downloads them");
}

// Checks the file's size and every label; returns the record count.
int64_t validate_file(const CifarFormat& f, const std::string& path,
                      const std::vector<uint8_t>& bytes) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  const int64_t record = f.record_bytes();
  SKA_CHECK(size > 0, IOError, f.name, ": '", path, "' is empty; expected ", record,
            "-byte records");
  if (size % record != 0) {
    const int64_t whole = size / record;
    SKA_FAIL(IOError, f.name, ": '", path, "' is ", size, " bytes, not a whole number of ", record,
             "-byte records: record ", whole, " at offset ", whole * record,
             " is truncated (expected ", record, " bytes, got ", size % record, ")");
  }
  const int64_t count = size / record;
  for (int64_t r = 0; r < count; ++r) {
    for (size_t k = 0; k < f.label_limits.size(); ++k) {
      const int64_t offset = r * record + static_cast<int64_t>(k);
      const int label = bytes[offset];
      SKA_CHECK(label < f.label_limits[k], IOError, f.name, ": '", path, "' record ", r,
                " (offset ", offset, "): ", f.label_names[k], " ", label, " is outside [0, ",
                f.label_limits[k], ")");
    }
  }
  return count;
}

// Appends the file's records (validated) to images [.., 32, 32, 3] and labels.
void append_file(const CifarFormat& f, const std::string& path, std::vector<uint8_t>* images,
                 std::vector<int64_t>* labels) {
  const std::vector<uint8_t> bytes = read_file_bytes(path, f.name);
  const int64_t count = validate_file(f, path, bytes);
  const int64_t record = f.record_bytes();
  const int64_t label_bytes = record - kPixels;
  const size_t base = images->size();
  images->resize(base + static_cast<size_t>(count * kPixels));
  uint8_t* out = images->data() + base;
  for (int64_t r = 0; r < count; ++r) {
    const uint8_t* rec = bytes.data() + r * record;
    labels->push_back(rec[label_bytes - 1]);
    const uint8_t* planes = rec + label_bytes;
    for (int64_t p = 0; p < kPlane; ++p) {
      for (int64_t c = 0; c < 3; ++c) out[p * 3 + c] = planes[c * kPlane + p];
    }
    out += kPixels;
  }
}

InMemoryDataset read_cifar(const CifarFormat& f, const std::string& root, Split split) {
  const std::vector<std::string>& files = split == Split::kTrain ? f.train_files : f.test_files;
  const std::string dir = resolve_root(f, root, files);
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    SKA_CHECK(!first_existing_file({path}).empty(), IOError, f.name, ": missing '", path,
              "'; expected every file of ", f.archive, " in '", dir, "'");
    append_file(f, path, &images, &labels);
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  Tensor image_tensor = Tensor::empty({n, kSide, kSide, 3}, DType::kU8);
  std::memcpy(image_tensor.data<uint8_t>(), images.data(), images.size());
  return InMemoryDataset(f.name, image_tensor, Tensor::from_vector(labels, {n}), f.num_classes);
}

}  // namespace

InMemoryDataset read_cifar10(const std::string& root, Split split) {
  return read_cifar(cifar10_format(), root, split);
}

InMemoryDataset read_cifar100(const std::string& root, Split split) {
  return read_cifar(cifar100_format(), root, split);
}

}  // namespace ska::data
