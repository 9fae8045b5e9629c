// Fuzz target: a .npy file through read_npy.
#include "fuzz_util.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("input.npy", data, size);
  return ska::fuzz::expect_ska_errors([&] { ska::read_npy(path); });
}
