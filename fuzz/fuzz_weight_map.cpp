// Fuzz target: weight-map YAML (rules, transforms, ignore/keep globs) through parse_weight_map,
// then its patterns against a typical state-dict name.
#include "config/config.h"
#include "fuzz_util.h"
#include "io/weight_map.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ska::fuzz::expect_ska_errors([&] {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const ska::WeightMap map = ska::parse_weight_map(ska::Config::parse(text, "<fuzz>"), "<fuzz>");
    const std::string name = "blocks.11.attn.qkv.weight";
    for (const auto& pattern : map.ignore) ska::glob_match(pattern, name);
    for (const auto& pattern : map.keep) ska::glob_match(pattern, name);
  });
}
