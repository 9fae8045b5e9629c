// Default generators, one per device.
#include "core/random.h"

#include <cstdint>
#include <map>
#include <mutex>

namespace ska {

namespace {
std::mutex& generators_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::pair<int, int>, Generator>& generators() {
  static std::map<std::pair<int, int>, Generator> g;
  return g;
}
uint64_t& base_seed() {
  static uint64_t s = 0;
  return s;
}
}  // namespace

Generator& default_generator(Device device) {
  std::lock_guard<std::mutex> lock(generators_mutex());
  const auto key = std::make_pair(static_cast<int>(device.type), device.index);
  auto it = generators().find(key);
  if (it == generators().end()) {
    // Each device's stream differs: mix the device into the seed.
    const uint64_t s = base_seed() + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(key.first * 64 + key.second);
    it = generators().emplace(key, Generator(s)).first;
  }
  return it->second;
}

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(generators_mutex());
  base_seed() = seed;
  generators().clear();
}

}  // namespace ska
