// Fuzz target: an IDX images file and labels file through read_idx_dataset. Input: a flags byte
// (bit 0: gzip the images file, bit 1: gzip the labels file), the labels file's length (2 bytes,
// little-endian), the images file, the labels file. Raw .gz inputs reach the corrupt-stream paths.
#include <algorithm>

#include "data/datasets/idx.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int flags = data[0];
  const size_t rest = size - 3;
  const size_t labels_size = std::min<size_t>(data[1] | (data[2] << 8), rest);
  const uint8_t* images = data + 3;
  const uint8_t* labels = images + (rest - labels_size);
  auto write = [](const char* name, const uint8_t* p, size_t n, bool gzip) {
    return gzip ? ska::fuzz::write_input_gzip(name, p, n) : ska::fuzz::write_input(name, p, n);
  };
  const std::string images_path = write("images-idx3-ubyte", images, rest - labels_size, flags & 1);
  const std::string labels_path = write("labels-idx1-ubyte", labels, labels_size, flags & 2);
  return ska::fuzz::expect_ska_errors(
      [&] { ska::data::read_idx_dataset(images_path, labels_path, "fuzz", 10); });
}
