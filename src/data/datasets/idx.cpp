// The IDX reader and Fashion-MNIST (see idx.h): the header read and checked first, then only the
// data it announces (decompressed piecewise), copied as it is (row-major, one channel).
#include "data/datasets/idx.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/checked_math.h"
#include "core/error.h"
#include "data/datasets/file_bytes.h"

namespace ska::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dim
constexpr int64_t kMaxIdxBytes = int64_t{1} << 32;

// A decoded IDX file: its dims and its data (the bytes after the header).
struct IdxFile {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> dims;
  size_t header = 0;  // the header's size: the file offset of bytes[0]
};

const char* magic_meaning(uint32_t magic) {
  return magic == kImagesMagic ? "unsigned bytes, 3 dims" : "unsigned bytes, 1 dim";
}

// Reads and checks the magic and the dims; returns how many data bytes they announce.
int64_t read_idx_header(GzipReader& in, IdxFile& f, const std::string& path, uint32_t magic,
                        const std::string& who) {
  const size_t ndims = magic & 0xff;
  f.header = 4 + 4 * ndims;
  std::vector<uint8_t> head;
  in.read(head, f.header);
  SKA_CHECK(head.size() >= 4, IOError, who, ": '", path, "' is ", head.size(),
            " bytes; expected the 4-byte IDX magic at offset 0");
  const uint32_t got = load_be32(head.data());
  SKA_CHECK(got == magic, IOError, who, ": '", path, "' offset 0: magic 0x", std::hex, got,
            "; expected 0x", magic, std::dec, " (IDX, ", magic_meaning(magic), ")");
  SKA_CHECK(head.size() == f.header, IOError, who, ": '", path, "' is truncated in its header: ",
            head.size(), " bytes; expected ", f.header, " (magic and ", ndims, " dims)");
  for (size_t k = 0; k < ndims; ++k) f.dims.push_back(load_be32(head.data() + 4 + 4 * k));
  const int64_t numel = checked_numel<IOError>(f.dims, who, ": '", path, "' header");
  SKA_CHECK(numel <= kMaxIdxBytes, IOError, who, ": '", path, "' header dims ", shape_str(f.dims),
            " announce ", numel, " data bytes; expected at most ", kMaxIdxBytes);
  return numel;
}

// A plain file's size against what its header announces, before any data is read.
void check_plain_size(const std::string& path, const IdxFile& f, int64_t numel,
                      const std::string& who) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  SKA_CHECK(!ec, IOError, who, ": cannot tell the size of '", path, "': ", ec.message());
  const uint64_t have = size - f.header, want = static_cast<uint64_t>(numel);
  SKA_CHECK(have == want, IOError, who, ": '", path, "' holds ", have, " data bytes after the ",
            f.header, "-byte header; expected exactly ", want, " (dims ", shape_str(f.dims), ")",
            have < want ? ": the file is truncated" : ": trailing data");
}

// The header first, then at most the data it announces plus one byte (to detect trailing data):
// a gzip stream never expands further than that.
IdxFile read_idx(const std::string& path, uint32_t magic, const std::string& who) {
  IdxFile f;
  GzipReader in(path, who);
  const int64_t numel = read_idx_header(in, f, path, magic, who);
  if (!in.compressed()) check_plain_size(path, f, numel, who);
  const uint64_t want = static_cast<uint64_t>(numel);
  const uint64_t have = in.read(f.bytes, want + 1);
  SKA_CHECK(have == want, IOError, who, ": '", path, "' holds ",
            have > want ? "more than " : "", have > want ? want : have,
            " data bytes after the ", f.header, "-byte header", in.compressed() ? " (uncompressed)" : "",
            "; expected exactly ", want, " (dims ", shape_str(f.dims), ")",
            have < want ? ": the file is truncated" : ": trailing data");
  return f;
}

Tensor label_tensor(const IdxFile& labels, const std::string& path, const std::string& who,
                    int64_t num_classes) {
  const int64_t n = labels.dims[0];
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int label = labels.bytes[i];
    SKA_CHECK(label < num_classes, IOError, who, ": '", path, "' record ", i, " (offset ",
              labels.header + i, "): label ", label, " is outside [0, ", num_classes, ")");
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
  std::memcpy(pixels.data<uint8_t>(), images.bytes.data(), images.bytes.size());
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
