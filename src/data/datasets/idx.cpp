// The IDX reader and Fashion-MNIST (see idx.h): header and size checks on the decompressed bytes,
// then the pixels copied as they are (row-major, one channel).
#include "data/datasets/idx.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "data/datasets/file_bytes.h"

namespace ska::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dim
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 32;

// A decoded IDX file: its dims and where the data starts.
struct IdxFile {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> dims;
  size_t data = 0;
};

const char* magic_meaning(uint32_t magic) {
  return magic == kImagesMagic ? "unsigned bytes, 3 dims" : "unsigned bytes, 1 dim";
}

IdxFile read_idx(const std::string& path, uint32_t magic, const std::string& who) {
  IdxFile f;
  f.bytes = read_maybe_gzip(path, who, kMaxIdxBytes);
  const size_t ndims = magic & 0xff;
  const size_t header = 4 + 4 * ndims;
  SKA_CHECK(f.bytes.size() >= 4, IOError, who, ": '", path, "' is ", f.bytes.size(),
            " bytes; expected the 4-byte IDX magic at offset 0");
  const uint32_t got = load_be32(f.bytes.data());
  SKA_CHECK(got == magic, IOError, who, ": '", path, "' offset 0: magic 0x", std::hex, got,
            "; expected 0x", magic, std::dec, " (IDX, ", magic_meaning(magic), ")");
  SKA_CHECK(f.bytes.size() >= header, IOError, who, ": '", path,
            "' is truncated in its header: ", f.bytes.size(), " bytes; expected ", header,
            " (magic and ", ndims, " dims)");
  uint64_t numel = 1;
  for (size_t k = 0; k < ndims; ++k) {
    f.dims.push_back(load_be32(f.bytes.data() + 4 + 4 * k));
    numel *= static_cast<uint64_t>(f.dims.back());
  }
  f.data = header;
  const uint64_t have = f.bytes.size() - header;
  SKA_CHECK(have == numel, IOError, who, ": '", path, "' holds ", have, " data bytes after the ",
            header, "-byte header; expected exactly ", numel, " (dims ", shape_str(f.dims), ")",
            have < numel ? ": the file is truncated" : ": trailing data");
  return f;
}

Tensor label_tensor(const IdxFile& labels, const std::string& path, const std::string& who,
                    int64_t num_classes) {
  const int64_t n = labels.dims[0];
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int label = labels.bytes[labels.data + i];
    SKA_CHECK(label < num_classes, IOError, who, ": '", path, "' record ", i, " (offset ",
              labels.data + i, "): label ", label, " is outside [0, ", num_classes, ")");
    values[i] = label;
  }
  return Tensor::from_vector(values, {n});
}

// path/name or path/name.gz, whichever exists (plain first).
std::string find_idx(const std::string& root, const std::string& name) {
  const std::string plain = root + "/" + name;
  const std::string found = first_existing_file({plain, plain + ".gz"});
  SKA_CHECK(!found.empty(), IOError, "fashion_mnist: missing '", plain, "' and '", plain,
            ".gz'; expected {train,t10k}-images-idx3-ubyte and {train,t10k}-labels-idx1-ubyte ",
            "(plain or .gz) in '", root, "' (Debian: apt-get install dataset-fashion-mnist; or ",
            "scripts/download_data.sh fashion_mnist <dir>)");
  return found;
}

}  // namespace

InMemoryDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                                 const std::string& name, int64_t num_classes) {
  const IdxFile images = read_idx(images_path, kImagesMagic, name);
  const IdxFile labels = read_idx(labels_path, kLabelsMagic, name);
  const int64_t n = images.dims[0], rows = images.dims[1], cols = images.dims[2];
  SKA_CHECK(rows > 0 && cols > 0, IOError, name, ": '", images_path, "' has images of ", rows, "x",
            cols, "; expected a positive size");
  SKA_CHECK(labels.dims[0] == n, IOError, name, ": '", labels_path, "' holds ", labels.dims[0],
            " labels but '", images_path, "' holds ", n, " images; expected the same count");
  Tensor pixels = Tensor::empty({n, rows, cols, 1}, DType::kU8);
  std::memcpy(pixels.data<uint8_t>(), images.bytes.data() + images.data,
              static_cast<size_t>(n * rows * cols));
  return InMemoryDataset(name, pixels, label_tensor(labels, labels_path, name, num_classes),
                         num_classes);
}

InMemoryDataset read_fashion_mnist(const std::string& root, Split split) {
  const std::string dir = root.empty() ? kFashionMnistDebianDir : root;
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  return read_idx_dataset(find_idx(dir, prefix + "-images-idx3-ubyte"),
                          find_idx(dir, prefix + "-labels-idx1-ubyte"), "fashion_mnist", 10);
}

}  // namespace ska::data
