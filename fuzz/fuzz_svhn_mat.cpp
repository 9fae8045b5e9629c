// Fuzz target: a MATLAB level-5 file through read_svhn_file (read_mat_file, then SVHN's checks).
#include "data/datasets/svhn.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("test_32x32.mat", data, size);
  return ska::fuzz::expect_ska_errors([&] { ska::data::read_svhn_file(path); });
}
