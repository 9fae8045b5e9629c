// Fuzz target: train_state.bin through read_train_state. The input's last 8 bytes are replaced by
// the checksum of the rest, so mutations reach the header and tensor records behind the checksum.
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "train/checkpoint.h"

namespace {

uint64_t fnv1a(const uint8_t* data, size_t n) {  // the file's checksum (src/train/checkpoint.cpp)
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (size >= 8) {
    const uint64_t sum = fnv1a(bytes.data(), size - 8);
    std::memcpy(bytes.data() + size - 8, &sum, 8);
  }
  const std::string path = ska::fuzz::write_input("train_state.bin", bytes.data(), bytes.size());
  return ska::fuzz::expect_ska_errors([&] { ska::train::read_train_state(path); });
}
