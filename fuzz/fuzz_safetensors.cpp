// Fuzz target: a safetensors file through read_safetensors.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ska::fuzz::write_input("input.safetensors", data, size);
  return ska::fuzz::expect_ska_errors([&] { ska::read_safetensors(path); });
}
