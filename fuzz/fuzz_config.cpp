// Fuzz target: YAML config text through Config::parse, then the strict-validation and dump paths.
#include "config/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ska::fuzz::expect_ska_errors([&] {
    const ska::Config config =
        ska::Config::parse(std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
    config.dump();
    config.check_unused();
  });
}
