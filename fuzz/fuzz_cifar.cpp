// Fuzz target: a CIFAR binary test file through read_cifar10 / read_cifar100. Input: a selector
// byte (odd: CIFAR-100's test.bin, even: CIFAR-10's test_batch.bin), then the file.
#include "data/datasets/cifar.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool cifar100 = data[0] & 1;
  const std::string path =
      ska::fuzz::write_input(cifar100 ? "test.bin" : "test_batch.bin", data + 1, size - 1);
  const std::string root = ska::fuzz::scratch_dir();
  return ska::fuzz::expect_ska_errors([&] {
    if (cifar100) {
      ska::data::read_cifar100(root, ska::data::Split::kTest);
    } else {
      ska::data::read_cifar10(root, ska::data::Split::kTest);
    }
  });
}
