// Default generators, one per device.
#include "core/random.h"

#include <cstdint>
#include <map>
#include <mutex>

#include "core/error.h"

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

void Generator::fail_forbidden_draw(uint64_t n) const {
  SKA_FAIL(ValueError, "random numbers (", n, ") drawn on the host while ", forbidden_);
}

void Generator::begin_capture(Device device) {
  SKA_CHECK(!capture_base_.defined(), ValueError, "a generator can capture one graph at a time");
  capture_base_ = Tensor::zeros({1}, DType::kI64, device);
  offset_before_capture_ = offset_;
  offset_ = 0;
}

CapturedDraws Generator::end_capture() {
  SKA_CHECK(capture_base_.defined(), ValueError, "end_capture without begin_capture");
  CapturedDraws draws{capture_base_, offset_};
  capture_base_ = Tensor();
  offset_ = offset_before_capture_;
  return draws;
}

void Generator::before_replay(const CapturedDraws& draws) {
  // A fill with a double: exact for offsets below 2^53 (decades of draws).
  Tensor(draws.base).fill_(static_cast<double>(offset_));
  offset_ += draws.counters;
}

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
