// Counter-based random numbers (Philox4x32-10) and the per-device generators.
// A generator is (seed, offset): each draw of n numbers consumes ceil(n / 4) counters, so the
// state is two integers, trivially saved and restored, and CPU and CUDA draw identical streams.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "core/device.h"
#include "core/tensor.h"

#if defined(__CUDACC__)
#define SKA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SKA_HOST_DEVICE inline
#endif

namespace ska {

struct PhiloxOut {
  uint32_t w[4];
};

// Philox4x32-10 of counter (lo 64 bits = `counter`, hi 64 bits = 0) under key `seed`.
SKA_HOST_DEVICE PhiloxOut philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from the top 24 bits of a word.
SKA_HOST_DEVICE float philox_uniform(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// What a CUDA Graph's captured work draws from a generator (Generator::end_capture): its kernels
// add the value of `base` to the offsets they were given, and `counters` is how far one replay
// advances the generator.
struct CapturedDraws {
  Tensor base;  // i64 [1] on the device
  uint64_t counters = 0;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves counters for n numbers and returns the first counter.
  uint64_t advance(uint64_t n) {
    if (!forbidden_.empty()) fail_forbidden_draw(n);
    const uint64_t start = offset_;
    offset_ += (n + 3) / 4;
    return start;
  }

  // Graph capture. Between begin_capture and end_capture, advance() hands out offsets relative to
  // 0 and capture_base() is an i64 tensor on `device` the kernels add to them (random_bernoulli:
  // dropout, drop-path). end_capture restores the offset and returns the draws; before each
  // replay, before_replay writes the current offset into the base and advances past what the
  // replay draws, so replays draw the numbers the same steps run eagerly would.
  void begin_capture(Device device);
  CapturedDraws end_capture();
  void before_replay(const CapturedDraws& draws);
  // Undefined unless a capture is under way.
  const Tensor& capture_base() const { return capture_base_; }

  // While `why` is set (ForbidDraws), every draw throws a ValueError naming it: the host's
  // generator during a CUDA Graph capture, whose replays repeat only the device's work, so a
  // number drawn on the host then would be the same in every replay.
  void forbid_draws(std::string why) { forbidden_ = std::move(why); }
  void allow_draws() { forbidden_.clear(); }

 private:
  [[noreturn]] void fail_forbidden_draw(uint64_t n) const;

  uint64_t seed_;
  uint64_t offset_ = 0;
  Tensor capture_base_;
  uint64_t offset_before_capture_ = 0;
  std::string forbidden_;
};

// Forbids draws from `gen` while alive (Generator::forbid_draws), allowing them again after.
class ForbidDraws {
 public:
  ForbidDraws(Generator& gen, std::string why) : gen_(gen) { gen_.forbid_draws(std::move(why)); }
  ~ForbidDraws() { gen_.allow_draws(); }
  ForbidDraws(const ForbidDraws&) = delete;
  ForbidDraws& operator=(const ForbidDraws&) = delete;

 private:
  Generator& gen_;
};

// The default generator of a device (one per CUDA device, one for the host).
Generator& default_generator(Device device);
// Seeds every default generator (host and all CUDA devices) from one seed.
void manual_seed(uint64_t seed);

}  // namespace ska
