// Dataset readers: every value of the format fixtures (scripts/make_data_fixtures.py), the error
// for each kind of corrupt file (naming the file and what was expected), ImageNet-style folders,
// the factory, and the real Fashion-MNIST files of Debian's dataset-fashion-mnist.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "data/datasets/cifar.h"
#include "data/datasets/factory.h"
#include "data/datasets/idx.h"
#include "data/datasets/image_decode.h"
#include "data/datasets/image_folder.h"
#include "data/datasets/mat_file.h"
#include "data/datasets/svhn.h"
#include "io/png.h"
#include "train/run_data.h"

using namespace ska;
using namespace ska::data;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// The pixel formulas of scripts/make_data_fixtures.py.
int cifar_pixel(int n, int c, int h, int w) { return (n * 7 + c * 50 + h * 3 + w * 5) % 256; }
int svhn_pixel(int n, int r, int c, int ch) { return (n * 11 + ch * 40 + r * 2 + c * 7) % 256; }
int fmnist_pixel(int n, int r, int c) { return (n * 13 + r * 5 + c * 3) % 256; }

std::string fixture(const std::string& relative) {
  return std::string(SKA_TEST_FIXTURES) + "/data/" + relative;
}

// A fresh directory for one test case, removed afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : dir_(fs::temp_directory_path() / ("ska_data_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ScratchDir() { fs::remove_all(dir_); }
  std::string path(const std::string& name = "") const { return (dir_ / name).string(); }
  // Copies the fixture folder `sub` here; returns the copy's path.
  std::string copy_fixture(const std::string& sub) const {
    fs::copy(fixture(sub), dir_ / sub, fs::copy_options::recursive);
    return path(sub);
  }

 private:
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The little-endian uint32 at `offset` of `bytes`.
uint32_t load_le32_at(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(bytes.at(offset + k));
  return v;
}

// Position of `pattern` in `bytes` (fails the test when absent).
size_t find_bytes(const std::string& bytes, const std::string& pattern) {
  const size_t at = bytes.find(pattern);
  REQUIRE(at != std::string::npos);
  return at;
}

// Every pixel of a CIFAR dataset against the formula, for global record indices `first`...
void check_cifar_images(const InMemoryDataset& d, int first) {
  REQUIRE(d.images().shape() == Shape{d.size(), 32, 32, 3});
  const uint8_t* p = d.images().data<uint8_t>();
  int64_t mismatches = 0;
  for (int n = 0; n < d.size(); ++n)
    for (int h = 0; h < 32; ++h)
      for (int w = 0; w < 32; ++w)
        for (int c = 0; c < 3; ++c) mismatches += *p++ != cifar_pixel(first + n, c, h, w);
  CHECK(mismatches == 0);
}

void check_svhn_images(const InMemoryDataset& d, int first) {
  REQUIRE(d.images().shape() == Shape{d.size(), 32, 32, 3});
  const uint8_t* p = d.images().data<uint8_t>();
  int64_t mismatches = 0;
  for (int n = 0; n < d.size(); ++n)
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c)
        for (int ch = 0; ch < 3; ++ch) mismatches += *p++ != svhn_pixel(first + n, r, c, ch);
  CHECK(mismatches == 0);
}

std::vector<int64_t> labels_of(const InMemoryDataset& d) { return d.labels().to_vector<int64_t>(); }

// --- CIFAR ---

TEST_CASE("cifar10 binary fixture: every label and pixel", "[cpu][data]") {
  const InMemoryDataset train = read_cifar10(fixture("cifar10"), Split::kTrain);
  CHECK(train.name() == "cifar10");
  CHECK(train.num_classes() == 10);
  CHECK(labels_of(train) == std::vector<int64_t>{1, 4, 7, 0, 3});
  check_cifar_images(train, 0);
  const InMemoryDataset test = read_cifar10(fixture("cifar10"), Split::kTest);
  CHECK(labels_of(test) == std::vector<int64_t>{6, 9});
  check_cifar_images(test, 5);
  const Sample s = test.get(1);
  CHECK(s.label == 9);
  CHECK(s.image.shape() == Shape{32, 32, 3});
  CHECK(s.image.select(0, 2).select(0, 4).to_vector<int64_t>() ==
        std::vector<int64_t>{cifar_pixel(6, 0, 2, 4), cifar_pixel(6, 1, 2, 4),
                             cifar_pixel(6, 2, 2, 4)});
  CHECK_THROWS_AS(test.get(2), ValueError);
}

TEST_CASE("cifar10 finds the archive's cifar-10-batches-bin folder", "[cpu][data]") {
  ScratchDir dir("cifar10_nested");
  fs::copy(fixture("cifar10"), dir.path("cifar-10-batches-bin"));
  CHECK(read_cifar10(dir.path(), Split::kTrain).size() == 5);
}

TEST_CASE("cifar100 binary fixture: fine labels and pixels", "[cpu][data]") {
  const InMemoryDataset train = read_cifar100(fixture("cifar100"), Split::kTrain);
  CHECK(train.num_classes() == 100);
  CHECK(labels_of(train) == std::vector<int64_t>{5, 42});
  check_cifar_images(train, 0);
  const InMemoryDataset test = read_cifar100(fixture("cifar100"), Split::kTest);
  CHECK(labels_of(test) == std::vector<int64_t>{79});
  check_cifar_images(test, 2);
}

TEST_CASE("cifar readers reject truncated files and bad labels", "[cpu][data]") {
  ScratchDir dir("cifar_corrupt");
  const std::string root10 = dir.copy_fixture("cifar10");
  const std::string test_batch = root10 + "/test_batch.bin";
  const std::string good = read_bytes(test_batch);  // 2 records of 3073 bytes
  for (size_t cut : {size_t{1}, size_t{3072}, size_t{3074}, size_t{6000}, good.size() - 1}) {
    write_bytes(test_batch, good.substr(0, cut));
    REQUIRE_THROWS_WITH(read_cifar10(root10, Split::kTest),
                        Contains(test_batch) &&
                            Contains("not a whole number of 3073-byte records") &&
                            Contains("is truncated"));
  }
  write_bytes(test_batch, good.substr(0, 4000));
  REQUIRE_THROWS_WITH(
      read_cifar10(root10, Split::kTest),
      Contains("record 1 at offset 3073 is truncated (expected 3073 bytes, got 927)"));
  write_bytes(test_batch, "");
  REQUIRE_THROWS_WITH(read_cifar10(root10, Split::kTest),
                      Contains(test_batch) && Contains("is empty; expected 3073-byte records"));
  std::string bad = good;
  bad[3073] = 10;
  write_bytes(test_batch, bad);
  REQUIRE_THROWS_WITH(
      read_cifar10(root10, Split::kTest),
      Contains(test_batch) && Contains("record 1 (offset 3073): label 10 is outside [0, 10)"));
  fs::remove(root10 + "/data_batch_4.bin");
  REQUIRE_THROWS_WITH(read_cifar10(root10, Split::kTrain),
                      Contains(root10 + "/data_batch_4.bin") && Contains("expected every file"));
  REQUIRE_THROWS_WITH(read_cifar10(dir.path("nowhere"), Split::kTrain),
                      Contains("data_batch_1.bin") && Contains("download_data.sh"));

  const std::string root100 = dir.copy_fixture("cifar100");
  const std::string train = root100 + "/train.bin";
  const std::string good100 = read_bytes(train);  // 2 records of 3074 bytes
  bad = good100;
  bad[3074] = 20;
  write_bytes(train, bad);
  REQUIRE_THROWS_WITH(
      read_cifar100(root100, Split::kTrain),
      Contains(train) && Contains("record 1 (offset 3074): coarse label 20 is outside [0, 20)"));
  bad = good100;
  bad[1] = 100;
  write_bytes(train, bad);
  REQUIRE_THROWS_WITH(
      read_cifar100(root100, Split::kTrain),
      Contains(train) && Contains("record 0 (offset 1): fine label 100 is outside [0, 100)"));
  write_bytes(train, good100.substr(0, 3073 * 2));
  REQUIRE_THROWS_WITH(read_cifar100(root100, Split::kTrain),
                      Contains(train) && Contains("3074-byte records"));
}

// --- SVHN (MAT level 5) ---

TEST_CASE("svhn MAT fixtures, compressed and not: every label and pixel", "[cpu][data]") {
  for (const std::string folder : {"svhn", "svhn_plain"}) {
    INFO(folder);
    const InMemoryDataset train = read_svhn(fixture(folder), Split::kTrain);
    CHECK(train.name() == "svhn");
    CHECK(train.num_classes() == 10);
    CHECK(labels_of(train) == std::vector<int64_t>{1, 4, 7});
    check_svhn_images(train, 0);
    const InMemoryDataset test = read_svhn(fixture(folder), Split::kTest);
    CHECK(labels_of(test) == std::vector<int64_t>{0, 3});  // stored 10 (the digit 0) and 3
    check_svhn_images(test, 3);
  }
}

TEST_CASE("mat reader lists every variable with class and dims", "[cpu][data]") {
  const std::vector<MatArray> arrays = read_mat_file(fixture("svhn/train_32x32.mat"));
  REQUIRE(arrays.size() == 3);
  CHECK(arrays[0].name == "note");
  CHECK(std::string(mat_class_name(arrays[0].mx_class)) == "char");
  CHECK_FALSE(arrays[0].has_data);
  const MatArray* x = find_mat_array(arrays, "X");
  REQUIRE(x != nullptr);
  CHECK(x->dims == std::vector<int64_t>{32, 32, 3, 3});
  CHECK(x->mx_class == kMxUInt8);
  CHECK(x->value(1) == svhn_pixel(0, 1, 0, 0));  // column-major: the row index runs first
  const MatArray* y = find_mat_array(arrays, "y");
  REQUIRE(y != nullptr);
  CHECK(y->mx_class == kMxDouble);
  CHECK(y->data_type == kMiDouble);
  CHECK(y->dims == std::vector<int64_t>{3, 1});
  CHECK(y->value(2) == 7.0);
  CHECK(find_mat_array(arrays, "Z") == nullptr);
}

TEST_CASE("svhn reader rejects truncated and malformed MAT files", "[cpu][data]") {
  ScratchDir dir("svhn_corrupt");
  for (const std::string folder : {"svhn", "svhn_plain"}) {
    const std::string path = dir.copy_fixture(folder) + "/train_32x32.mat";
    const std::string good = read_bytes(path);
    for (size_t cut : {size_t{0}, size_t{100}, size_t{131}, size_t{140}, size_t{200},
                       good.size() / 2, good.size() - 40, good.size() - 1}) {
      INFO(folder << " cut at " << cut);
      write_bytes(path, good.substr(0, cut));
      REQUIRE_THROWS_WITH(read_svhn_file(path), Contains(path) && Contains("expected"));
    }
    write_bytes(path, good.substr(0, 100));
    REQUIRE_THROWS_WITH(read_svhn_file(path),
                        Contains("expected at least the 128-byte MAT header"));
    std::string bad = good;
    bad[126] = 'M';
    bad[127] = 'I';
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(read_svhn_file(path), Contains(path) && Contains("big-endian"));
    bad = good;
    bad[125] = 2;
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(read_svhn_file(path),
                        Contains("offset 124: version 0x200; expected 0x100"));
    bad = good;
    bad[128] = 7;
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(read_svhn_file(path),
                        Contains(path + "' offset 128: data element of type 7; expected miMATRIX"));
  }
}

TEST_CASE("svhn reader rejects a bad zlib stream", "[cpu][data]") {
  ScratchDir dir("svhn_zlib");
  const std::string path = dir.copy_fixture("svhn") + "/train_32x32.mat";
  const std::string good = read_bytes(path);
  std::string bad = good;
  bad[136] = 0x12;  // the first miCOMPRESSED element's zlib header (78 9c)
  write_bytes(path, bad);
  REQUIRE_THROWS_WITH(read_svhn_file(path),
                      Contains(path + "' offset 136: corrupt zlib stream") && Contains("expected"));
  // Flip the compressed bytes of the last element (y): bad data, a bad length or checksum.
  const size_t y_at = good.size() - 20;
  bad = good;
  for (size_t i = y_at; i < y_at + 8; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_bytes(path, bad);
  REQUIRE_THROWS_WITH(read_svhn_file(path), Contains(path) && Contains("zlib stream"));
  // Shorten the last element's zlib stream (and its byte count): a truncated stream, then a
  // stream that only lacks its 4-byte checksum.
  size_t last = 128;
  while (last + 8 + load_le32_at(good, last + 4) < good.size())
    last += 8 + load_le32_at(good, last + 4);
  const uint32_t nbytes = load_le32_at(good, last + 4);
  for (uint32_t drop : {10u, 4u}) {
    bad = good.substr(0, good.size() - drop);
    for (int k = 0; k < 4; ++k)
      bad[last + 4 + k] = static_cast<char>(((nbytes - drop) >> (8 * k)) & 0xff);
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(read_svhn_file(path),
                        Contains(path + "' offset " + std::to_string(last + 8) + ": zlib stream") &&
                            Contains(drop == 10 ? "is truncated after" : "does not end after"));
  }
}

TEST_CASE("svhn reader checks the variables X and y", "[cpu][data]") {
  ScratchDir dir("svhn_vars");
  const std::string path = dir.copy_fixture("svhn_plain") + "/train_32x32.mat";
  const std::string good = read_bytes(path);
  const std::string name_x("\x01\x00\x01\x00X\x00\x00\x00", 8);  // small miINT8 element "X"
  const std::string name_y("\x01\x00\x01\x00y\x00\x00\x00", 8);
  std::string bad = good;
  bad[find_bytes(good, name_x) + 4] = 'Z';
  write_bytes(path, bad);
  REQUIRE_THROWS_WITH(
      read_svhn_file(path),
      Contains(path) && Contains("has no variable 'X'; expected X (uint8 [32, 32, 3, N])"));
  const size_t label0 = find_bytes(good, name_y) + 12;  // y is uint8 [3, 1]: a small element
  for (char label : {char{11}, char{0}}) {
    bad = good;
    bad[label0] = label;
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(
        read_svhn_file(path),
        Contains(path) && Contains("variable 'y' record 0 is " + std::to_string(label) +
                                   "; expected a label 1..10"));
  }
  // X's channel dim 3 -> 2: the real part no longer matches the dims.
  bad = good;
  const std::string dims_x("\x20\x00\x00\x00\x20\x00\x00\x00\x03\x00\x00\x00", 12);
  bad[find_bytes(good, dims_x) + 8] = 2;
  write_bytes(path, bad);
  REQUIRE_THROWS_WITH(
      read_svhn_file(path),
      Contains(path) && Contains("real part of 'X' holds 9216 bytes; expected 6144"));
  // y's row count 3 -> 2 (and the small element shortened to match): a count mismatch.
  bad = good;
  const size_t y_dims = find_bytes(good, name_y) - 8;
  bad[y_dims] = 2;
  bad[label0 - 2] = 2;
  write_bytes(path, bad);
  REQUIRE_THROWS_WITH(read_svhn_file(path),
                      Contains(path) && Contains("variable 'y' has dims [2, 1]; expected [3, 1]"));
  REQUIRE_THROWS_WITH(read_svhn(dir.path("nowhere"), Split::kTest),
                      Contains("test_32x32.mat") && Contains("download_data.sh"));
}

// --- Fashion-MNIST (IDX) ---

TEST_CASE("fashion_mnist IDX fixtures, gzip and plain: every label and pixel", "[cpu][data]") {
  for (Split split : {Split::kTrain, Split::kTest}) {
    const InMemoryDataset d = read_fashion_mnist(fixture("fashion_mnist"), split);
    const int first = split == Split::kTrain ? 0 : 3;
    CHECK(d.name() == "fashion_mnist");
    CHECK(labels_of(d) ==
          (split == Split::kTrain ? std::vector<int64_t>{9, 0, 4} : std::vector<int64_t>{2, 7}));
    REQUIRE(d.images().shape() == Shape{d.size(), 28, 28, 1});
    const uint8_t* p = d.images().data<uint8_t>();
    int64_t mismatches = 0;
    for (int n = 0; n < d.size(); ++n)
      for (int r = 0; r < 28; ++r)
        for (int c = 0; c < 28; ++c) mismatches += *p++ != fmnist_pixel(first + n, r, c);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("pad_and_replicate makes the paper's 32x32x3 layout", "[cpu][data]") {
  const InMemoryDataset d = read_fashion_mnist(fixture("fashion_mnist"), Split::kTest);
  const Tensor padded = pad_and_replicate(d.images(), 32, 3);
  REQUIRE(padded.shape() == Shape{2, 32, 32, 3});
  const uint8_t* p = padded.data<uint8_t>();
  int64_t mismatches = 0;
  for (int n = 0; n < 2; ++n)
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c)
        for (int ch = 0; ch < 3; ++ch) {
          const bool inside = r >= 2 && r < 30 && c >= 2 && c < 30;
          mismatches += *p++ != (inside ? fmnist_pixel(3 + n, r - 2, c - 2) : 0);
        }
  CHECK(mismatches == 0);
  CHECK_THROWS_AS(pad_and_replicate(d.images(), 31, 3), ValueError);
}

TEST_CASE("idx reader rejects wrong magic, truncation, bad counts and labels", "[cpu][data]") {
  ScratchDir dir("idx_corrupt");
  const std::string root = dir.copy_fixture("fashion_mnist");
  const std::string images = root + "/t10k-images-idx3-ubyte";
  const std::string labels = root + "/t10k-labels-idx1-ubyte";
  const std::string good_images = read_bytes(images);
  const std::string good_labels = read_bytes(labels);
  auto load = [&] { return read_fashion_mnist(root, Split::kTest); };

  std::string bad = good_images;
  bad[3] = 1;
  write_bytes(images, bad);
  REQUIRE_THROWS_WITH(load(), Contains(images + "' offset 0: magic 0x801; expected 0x803"));
  for (size_t cut :
       {size_t{0}, size_t{3}, size_t{10}, size_t{16}, size_t{800}, good_images.size() - 1}) {
    INFO("cut at " << cut);
    write_bytes(images, good_images.substr(0, cut));
    REQUIRE_THROWS_WITH(load(), Contains(images) && Contains("expected"));
  }
  write_bytes(images, good_images.substr(0, 800));
  REQUIRE_THROWS_WITH(load(), Contains("holds 784 data bytes after the 16-byte header; expected "
                                       "exactly 1568 (dims [2, 28, 28]): the file is truncated"));
  write_bytes(images, good_images + "x");
  REQUIRE_THROWS_WITH(load(), Contains(images) && Contains("trailing data"));
  write_bytes(images, good_images);

  bad = good_labels;
  bad[7] = 3;
  write_bytes(labels, bad + "\x01");
  REQUIRE_THROWS_WITH(load(), Contains(labels + "' holds 3 labels but '" + images +
                                       "' holds 2 images; expected the same count"));
  bad = good_labels;
  bad[9] = 10;
  write_bytes(labels, bad);
  REQUIRE_THROWS_WITH(load(),
                      Contains(labels + "' record 1 (offset 9): label 10 is outside [0, 10)"));
  fs::remove(labels);
  REQUIRE_THROWS_WITH(load(), Contains(labels) && Contains("dataset-fashion-mnist"));
}

TEST_CASE("idx reader rejects corrupt and truncated gzip files", "[cpu][data]") {
  ScratchDir dir("idx_gzip");
  const std::string root = dir.copy_fixture("fashion_mnist");
  const std::string images = root + "/train-images-idx3-ubyte.gz";
  const std::string good = read_bytes(images);
  auto load = [&] { return read_fashion_mnist(root, Split::kTrain); };
  for (size_t cut : {size_t{12}, good.size() / 2, good.size() - 4}) {
    INFO("cut at " << cut);
    write_bytes(images, good.substr(0, cut));
    REQUIRE_THROWS_WITH(load(), Contains(images) && Contains("corrupt or truncated gzip stream") &&
                                    Contains("expected a complete gzip file"));
  }
  std::string bad = good;
  for (size_t i = 20; i < 40; ++i) bad[i] = static_cast<char>(bad[i] ^ 0xff);
  write_bytes(images, bad);
  REQUIRE_THROWS_WITH(load(), Contains(images) && Contains("expected"));
}

namespace {

// An IDX images header (magic 0x803) with `dims`, big-endian.
std::string idx_images_header(const std::vector<uint32_t>& dims) {
  std::string out = {'\0', '\0', '\x08', '\x03'};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return out;
}

// Writes `header` then `zeros` zero bytes as a gzip file, a MiB at a time.
void write_gzip(const std::string& path, const std::string& header, size_t zeros) {
  gzFile out = gzopen(path.c_str(), "wb1");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, header.data(), static_cast<unsigned>(header.size())) ==
          static_cast<int>(header.size()));
  const std::string chunk(1 << 20, '\0');
  for (size_t left = zeros; left > 0;) {
    const size_t n = std::min(left, chunk.size());
    REQUIRE(gzwrite(out, chunk.data(), static_cast<unsigned>(n)) == static_cast<int>(n));
    left -= n;
  }
  REQUIRE(gzclose(out) == Z_OK);
}

}  // namespace

TEST_CASE("idx reader: dims whose product overflows 64 bits are rejected, plain and gzip",
          "[cpu][data][hardening]") {
  ScratchDir dir("idx_overflow");
  const std::string root = dir.copy_fixture("fashion_mnist");
  // 256 * 2^28 * 2^28 = 2^64: wraps to 0 in 64 bits, which "matched" an empty data section.
  const std::string header = idx_images_header({256, 1u << 28, 1u << 28});
  const std::string plain = root + "/t10k-images-idx3-ubyte";
  write_bytes(plain, header);
  REQUIRE_THROWS_AS(read_fashion_mnist(root, Split::kTest), IOError);
  REQUIRE_THROWS_WITH(read_fashion_mnist(root, Split::kTest),
                      Contains(plain) && Contains("[256, 268435456, 268435456]") &&
                          Contains("more elements than a 64-bit integer holds"));
  const std::string gz = root + "/train-images-idx3-ubyte.gz";
  write_gzip(gz, header, 0);
  REQUIRE_THROWS_AS(read_fashion_mnist(root, Split::kTrain), IOError);
  REQUIRE_THROWS_WITH(read_fashion_mnist(root, Split::kTrain),
                      Contains(gz) && Contains("more elements than a 64-bit integer holds"));
}

TEST_CASE("idx reader: a gzip bomb is decompressed no further than its header announces",
          "[cpu][data][hardening]") {
  ScratchDir dir("idx_bomb");
  const std::string root = dir.copy_fixture("fashion_mnist");
  const std::string gz = root + "/train-images-idx3-ubyte.gz";
  auto load = [&] { return read_fashion_mnist(root, Split::kTrain); };
  SECTION("3 images announced, 64 MiB of zeros behind them") {
    write_gzip(gz, idx_images_header({3, 28, 28}), size_t{64} << 20);
    REQUIRE(fs::file_size(gz) < (size_t{1} << 20));  // a small file
    REQUIRE_THROWS_AS(load(), IOError);
    // It stopped after 2353 bytes (inflating all 64 MiB takes only ~0.2 s: no timing tells).
    REQUIRE_THROWS_WITH(load(), Contains(gz) && Contains("holds more than 2352 data bytes") &&
                                    Contains("trailing data"));
  }
  SECTION("exactly what is announced is read") {
    write_gzip(gz, idx_images_header({3, 28, 28}), 3 * 28 * 28);
    const InMemoryDataset d = load();
    REQUIRE(d.images().shape() == Shape{3, 28, 28, 1});
  }
  SECTION("less than announced: truncated") {
    write_gzip(gz, idx_images_header({3, 28, 28}), 2 * 28 * 28);
    REQUIRE_THROWS_WITH(load(), Contains(gz) && Contains("holds 1568 data bytes") &&
                                    Contains("the file is truncated"));
  }
  SECTION("a truncated gzip stream names the file") {
    write_gzip(gz, idx_images_header({3, 28, 28}), 3 * 28 * 28);
    const std::string whole = read_bytes(gz);
    write_bytes(gz, whole.substr(0, whole.size() - 6));
    REQUIRE_THROWS_AS(load(), IOError);
    REQUIRE_THROWS_WITH(load(), Contains(gz) && Contains("corrupt or truncated gzip stream"));
  }
}

TEST_CASE("the real Fashion-MNIST files of dataset-fashion-mnist", "[cpu][data]") {
  const std::string dir = kFashionMnistDebianDir;
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    WARN("skipped: " << dir << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  const std::unique_ptr<Dataset> train_ptr = load_dataset("fashion_mnist", "", "train");
  const auto& train = dynamic_cast<const InMemoryDataset&>(*train_ptr);
  const InMemoryDataset test = read_fashion_mnist("", Split::kTest);
  REQUIRE(train.images().shape() == Shape{60000, 28, 28, 1});
  REQUIRE(test.images().shape() == Shape{10000, 28, 28, 1});
  std::vector<int64_t> histogram(10, 0);
  for (int64_t label : labels_of(train)) ++histogram[label];
  CHECK(histogram == std::vector<int64_t>(10, 6000));
  // Statistics computed with numpy from the same files (mean 0.2860 * 255 of the train pixels).
  auto pixel_sum = [](const Tensor& t, int64_t count) {
    const uint8_t* p = t.data<uint8_t>();
    return std::accumulate(p, p + count, int64_t{0});
  };
  CHECK(pixel_sum(train.images(), train.images().numel()) == 3431114169);
  CHECK(pixel_sum(test.images(), test.images().numel()) == 573469082);
  CHECK(pixel_sum(train.images(), 784) == 76247);
  CHECK(train.images().data<uint8_t>()[14 * 28 + 14] == 217);
  CHECK(labels_of(train)[3] == 3);
  CHECK(test.label(2) == 1);
}

// --- ImageNet-style folders ---

// A solid-colour JPEG (libjpeg, quality 95).
void write_solid(const std::string& path, int h, int w, int r, int g, int b) {
  std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = static_cast<uint8_t>(r), rgb[i + 1] = static_cast<uint8_t>(g);
    rgb[i + 2] = static_cast<uint8_t>(b);
  }
  const std::vector<uint8_t> file = encode_jpeg_rgb(rgb.data(), h, w, 95);
  write_bytes(path, std::string(file.begin(), file.end()));
}

// A PNG whose pixel (y, x) is RGB (10 y, 20 x, 7): lossless, checked value by value.
void write_gradient_png(const std::string& path) {
  io::RgbImage m(7, 5, {});
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x)
      m.set(x, y, {static_cast<uint8_t>(10 * y), static_cast<uint8_t>(20 * x), 7});
  io::write_png(path, m);
}

// root/{train,val}/{n01,n02}/ with 3 train and 2 val images and a file that is not an image.
std::string make_imagenet(const ScratchDir& dir) {
  const std::string root = dir.path("imagenet");
  for (const char* sub : {"train/n02", "train/n01", "val/n01", "val/n02"}) {
    fs::create_directories(root + "/" + sub);
  }
  write_solid(root + "/train/n01/a.JPEG", 10, 12, 200, 100, 50);
  write_gradient_png(root + "/train/n01/b.png");
  write_solid(root + "/train/n02/c.JPEG", 8, 8, 0, 255, 0);
  write_bytes(root + "/train/n02/notes.txt", "not an image");
  write_solid(root + "/val/n01/v1.JPEG", 4, 4, 10, 20, 30);
  write_gradient_png(root + "/val/n02/v2.png");
  return root;
}

TEST_CASE("imagenet folders: sorted classes, labels and RGB decoding", "[cpu][data]") {
  ScratchDir dir("imagenet");
  const std::string root = make_imagenet(dir);
  const ImageFolderDataset train = read_imagenet(root, Split::kTrain);
  CHECK(train.classes() == std::vector<std::string>{"n01", "n02"});
  REQUIRE(train.size() == 3);
  CHECK(train.samples()[0].path == root + "/train/n01/a.JPEG");
  CHECK(train.samples()[1].path == root + "/train/n01/b.png");
  CHECK(train.samples()[2].path == root + "/train/n02/c.JPEG");
  CHECK(std::vector<int64_t>{train.label(0), train.label(1), train.label(2)} ==
        std::vector<int64_t>{0, 0, 1});
  const Sample png = train.get(1);
  REQUIRE(png.image.shape() == Shape{5, 7, 3});
  const uint8_t* p = png.image.data<uint8_t>();
  int64_t mismatches = 0;
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x) {
      mismatches += p[0] != 10 * y || p[1] != 20 * x || p[2] != 7;
      p += 3;
    }
  CHECK(mismatches == 0);
  const Sample jpeg = train.get(0);  // lossy: solid colours come back within a few levels
  REQUIRE(jpeg.image.shape() == Shape{10, 12, 3});
  const std::vector<int64_t> rgb = jpeg.image.select(0, 5).select(0, 6).to_vector<int64_t>();
  CHECK(std::abs(rgb[0] - 200) <= 3);
  CHECK(std::abs(rgb[1] - 100) <= 3);
  CHECK(std::abs(rgb[2] - 50) <= 3);
  const std::unique_ptr<Dataset> val = load_dataset("imagenet", root, "val");
  CHECK(val->size() == 2);
  CHECK(val->num_classes() == 2);
  CHECK(val->label(1) == 1);
}

TEST_CASE("imagenet folders: class mismatch, undecodable files, missing root", "[cpu][data]") {
  ScratchDir dir("imagenet_bad");
  const std::string root = make_imagenet(dir);
  const std::string broken = root + "/train/n01/a.JPEG";
  write_bytes(broken, "\xff\xd8\xff garbage, not a JPEG");
  const ImageFolderDataset train = read_imagenet(root, Split::kTrain);
  REQUIRE_THROWS_WITH(train.get(0), Contains(broken) && Contains("sample 0, class 'n01'") &&
                                        Contains("cannot decode the JPEG"));
  fs::create_directories(root + "/val/n03");
  REQUIRE_THROWS_WITH(read_imagenet(root, Split::kTrain),
                      Contains("'n03' is only in '" + root + "/val'") &&
                          Contains("expected the same classes in both splits"));
  REQUIRE_THROWS_WITH(read_imagenet(dir.path("none"), Split::kTest),
                      Contains(dir.path("none") + "/val'") && Contains("/train/<class>/*.JPEG"));
}

TEST_CASE("a dataset split without images is an error naming the dataset, split and root",
          "[cpu][data]") {
  // An IDX test split of 0 images loads (the format allows it), but a run on it would evaluate
  // nothing and report 0% (or, before, a train.max_steps message for a run that had none).
  ScratchDir dir("idx_empty_split");
  const std::string root = dir.copy_fixture("fashion_mnist");
  write_bytes(root + "/t10k-images-idx3-ubyte", idx_images_header({0, 28, 28}));
  write_bytes(root + "/t10k-labels-idx1-ubyte", std::string("\0\0\x08\x01\0\0\0\0", 8));
  CHECK(read_fashion_mnist(root, Split::kTest).size() == 0);
  train::DataOptions options;
  options.dataset = "fashion_mnist";
  options.root = root;
  REQUIRE_THROWS_WITH(train::load_dataset_split(options, "test", 28, 1, 0),
                      Contains("data.dataset: fashion_mnist's test split under '" + root +
                               "' holds no images: nothing to evaluate on"));
  CHECK(train::load_dataset_split(options, "train", 28, 1, 0)->size() > 0);
  // A model input the images cannot be padded to names the model's keys.
  REQUIRE_THROWS_WITH(train::load_dataset_split(options, "train", 16, 1, 0),
                      Contains("model.image_size 16, model.in_channels 1: fashion_mnist's "
                               "28x28x1 images") &&
                          Contains("expected model.image_size 28 + 2k (k >= 0)"));
  CHECK(train::load_dataset_split(options, "train", 32, 3, 0)->size() > 0);  // the paper's layout
}

TEST_CASE("imagenet folders: a class folder without images is an error naming it", "[cpu][data]") {
  // torchvision's ImageFolder refuses such a folder; silently training on the other classes
  // (with a class that never appears) would not be noticed.
  ScratchDir dir("imagenet_empty_class");
  const std::string root = make_imagenet(dir);
  for (const auto& e : fs::directory_iterator(root + "/train/n02")) fs::remove(e.path());
  REQUIRE_THROWS_WITH(read_imagenet(root, Split::kTrain),
                      Contains("1 of the 2 class folders under '" + root + "/train'") &&
                          Contains("'n02'") && Contains("hold no image files"));
  CHECK(read_imagenet(root, Split::kTest).size() == 2);  // val's n02 has its image
}

TEST_CASE("decode_image_rgb: a header announcing gigapixels, or no bytes, fail before decoding",
          "[cpu][data][hardening]") {
  // Found by fuzz/fuzz_image: 153 bytes of JPEG whose frame header announces 32264x12800 made
  // OpenCV allocate 1.2 GB, and the conversion to RGB and the copy 1.2 GB more each.
  ScratchDir dir("image_header");
  const std::string sof0("\xff\xc0\x00\x0b\x08\x32\x00\x7e\x08\x01\x01\x11\x00", 13);
  const std::string png_ihdr("\x00\x00\x00\x0dIHDR\x00\x01\x86\xa0\x00\x01\x86\xa0\x08\x02", 18);
  const std::string bmp_size("\x40\x9c\x00\x00\x40\x9c\x00\x00", 8);  // 40000 x 40000
  const std::vector<std::pair<std::string, std::string>> files = {
      {"bomb.jpg", "\xff\xd8" + sof0 + "\xff\xd9"},
      {"bomb.png", "\x89PNG\r\n\x1a\n" + png_ihdr},
      {"bomb.ppm", "P6\n# comment\n100000 100000\n255\n"},
      {"bomb.bmp", "BM" + std::string(16, '\0') + bmp_size}};
  const std::vector<std::string> announced = {"32264x12800", "100000x100000", "100000x100000",
                                              "40000x40000"};
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = dir.path(files[i].first);
    write_bytes(path, files[i].second);
    REQUIRE_THROWS_WITH(decode_image_rgb(path, "sample 3"),
                        Contains(path) && Contains("(sample 3)") &&
                            Contains("announces " + announced[i] + " pixels; expected at most"));
  }
  // Found by fuzz_image on the first version of the check: sides whose product overflows int64.
  const std::string huge_png("\x00\x00\x00\x0dIHDR\xf7\xf7\xf7\xf7\xf7\xf7\xf7\xf7\x08\x02", 18);
  write_bytes(dir.path("huge.png"), "\x89PNG\r\n\x1a\n" + huge_png);
  REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("huge.png")),
                      Contains("announces 4160223223x4160223223 pixels"));
  // And with bytes between two segments, which libjpeg skips: 55551x8968 pixels, 1.5 GB.
  const char gap[] =
      "\xff\xd8\xff\xdb\x00\x03\x00 junk "
      "\xff\xc0\x00\x0b\x08\xd8\xff\x23\x08\x01\x01\x11\x00\xff\xd9";
  write_bytes(dir.path("gap.jpg"), std::string(gap, sizeof(gap) - 1));
  REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("gap.jpg")),
                      Contains("announces 8968x55551 pixels"));
  // Found by the 10-minute fuzz_image run: OpenCV consumes the byte after a PNM number whatever
  // it is, so "1094U" is 1094 and the height 777777 follows (a 2.5 GB allocation); the header
  // walk read 1094x0.
  const std::string pbm("P4\n1094U\n\n777777#7\n777\xdf", 23);
  write_bytes(dir.path("odd.pbm"), pbm);
  REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("odd.pbm")),
                      Contains("announces 1094x777777 pixels"));
  // Found by fuzz_image: OpenCV's DICOM decoder (GDCM) aborts the process on a malformed file
  // ("DICM" at offset 128). Only JPEG, PNG, BMP, PNM, TIFF and WebP reach OpenCV.
  std::string dicom(133, '0');
  dicom.replace(128, 4, "DICM");
  for (const std::string& start : {std::string("\x01\nP6\n"), std::string("\xff\xd8\xff")}) {
    write_bytes(dir.path("scan.png"), start + dicom.substr(start.size()));
    REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("scan.png")),
                        Contains("not a JPEG, PNG, BMP, PNM, TIFF or WebP file"));
  }
  write_bytes(dir.path("j2k.jpg"), std::string("\x00\x00\x00\x0cjP  \r\n\x87\n", 12) + "rest");
  REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("j2k.jpg")),  // JPEG 2000, named .jpg
                      Contains("not a JPEG, PNG, BMP, PNM, TIFF or WebP file"));
  write_bytes(dir.path("empty.png"), "");  // refused before any decoder sees it
  REQUIRE_THROWS_WITH(decode_image_rgb(dir.path("empty.png")),
                      Contains("cannot decode the image '" + dir.path("empty.png") + "'"));
  write_solid(dir.path("small.jpg"), 3, 5, 1, 2, 3);
  CHECK(decode_image_rgb(dir.path("small.jpg")).shape() == Shape{3, 5, 3});
}

// --- The factory ---

TEST_CASE("load_dataset: names, splits and default roots", "[cpu][data]") {
  const std::unique_ptr<Dataset> cifar = load_dataset("cifar10", fixture("cifar10"), "train");
  CHECK(cifar->name() == "cifar10");
  CHECK(cifar->size() == 5);
  CHECK(load_dataset("cifar100", fixture("cifar100"), "test")->num_classes() == 100);
  CHECK(load_dataset("svhn", fixture("svhn"), Split::kTest)->label(0) == 0);
  CHECK(load_dataset("fashion_mnist", fixture("fashion_mnist"), "val")->size() == 2);
  REQUIRE_THROWS_WITH(load_dataset("mnist", "", "train"),
                      Contains("unknown dataset 'mnist'; known datasets: cifar10, cifar100, "
                               "svhn, fashion_mnist, imagenet"));
  for (const char* name : {"cifar10", "cifar100", "svhn", "imagenet"}) {
    REQUIRE_THROWS_WITH(load_dataset(name, "", Split::kTrain),
                        Contains(std::string(name) + ": no data root given") &&
                            Contains("scripts/download_data.sh"));
  }
  CHECK(parse_split("val") == Split::kTest);
  REQUIRE_THROWS_WITH(parse_split("valid"), Contains("expected train, test or val"));
  CHECK(dataset_num_classes("cifar100") == 100);
  const Config config = Config::parse("data:\n  dataset: svhn\n  root: /data/svhn\n");
  const DatasetSpec spec = read_dataset_spec(config.root()["data"]);
  CHECK(spec.name == "svhn");
  CHECK(spec.root == "/data/svhn");
  REQUIRE_THROWS_AS(read_dataset_spec(Config::parse("data: {dataset: mnist}").root()["data"]),
                    ConfigError);
}

}  // namespace

TEST_CASE("data roots: an empty root looks in data/<name> here, then in the repository",
          "[cpu][data]") {
  // tmp/work (the current directory) and tmp/repo (data/README.md, the executable in build/).
  const fs::path tmp = fs::temp_directory_path() / ("ska_data_roots_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  const fs::path work = tmp / "work", repo = tmp / "repo";
  fs::create_directories(work);
  fs::create_directories(repo / "data");
  std::ofstream(repo / "data" / "README.md") << "datasets\n";
  const std::string exe = (repo / "build" / "apps" / "train").string();
  const std::string here = (work / "data" / "cifar10").string();
  const std::string in_repo = (repo / "data" / "cifar10").string();

  CHECK(default_data_roots("cifar10", work.string(), exe) ==
        std::vector<std::string>{here, in_repo});
  CHECK(default_data_roots("fashion_mnist", work.string(), exe).back() == kFashionMnistDebianDir);
  CHECK(default_data_roots("svhn", work.string(), "/usr/bin/train").size() == 1);  // no repo
  CHECK(default_data_roots("svhn", repo.string(), exe).size() == 1);  // the same folder once

  CHECK(resolve_data_root("cifar10", "/given", work.string(), exe) == "/given");
  REQUIRE_THROWS_WITH(resolve_data_root("cifar10", "", work.string(), exe),
                      Contains("no folder at the default places (" + here + ", " + in_repo) &&
                          Contains("scripts/download_data.sh cifar10"));
  CHECK(resolve_data_root("fashion_mnist", "", work.string(), exe) == kFashionMnistDebianDir);
  fs::create_directories(in_repo);
  CHECK(resolve_data_root("cifar10", "", work.string(), exe) == in_repo);
  fs::create_directories(here);
  CHECK(resolve_data_root("cifar10", "", work.string(), exe) == here);
  fs::create_directories(repo / "data" / "fashion_mnist");
  CHECK(resolve_data_root("fashion_mnist", "", work.string(), exe) ==
        (repo / "data" / "fashion_mnist").string());

  // load_dataset with an empty root reads data/cifar10 under the current directory.
  fs::copy(fixture("cifar10"), here, fs::copy_options::recursive);
  const fs::path previous = fs::current_path();
  fs::current_path(work);
  const size_t size = load_dataset("cifar10", "", "train")->size();
  fs::current_path(previous);
  CHECK(size == 5);
  fs::remove_all(tmp);
}
