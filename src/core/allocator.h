// Memory allocators: an aligned host allocator, pinned host memory, and the per-device CUDA
// caching allocator (cuda/runtime/caching_allocator.*), all behind one interface with statistics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace ska {

struct MemoryStats {
  int64_t allocated = 0;       // bytes handed out and not yet returned
  int64_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
  int64_t reserved = 0;        // bytes held from the system (allocated + cached)
  // High-water mark of `reserved` since the last reset: what the device (or process) held at
  // most, cache included; compares with PyTorch's max_memory_reserved.
  int64_t peak_reserved = 0;
  int64_t num_allocs = 0;      // allocation calls served
  int64_t num_system_allocs = 0;  // of those, how many went to the system (cudaMalloc/malloc)
  // The bytes callers asked for, before rounding and before a cached block larger than the
  // request was handed out whole: what the tensors themselves hold. `allocated` minus this is
  // the allocator's slack. PyTorch's max_memory_allocated counts its blocks, which it splits down
  // to the request rounded to 512 bytes, so its figure compares with peak_requested.
  int64_t requested = 0;
  int64_t peak_requested = 0;  // high-water mark of `requested` since the last reset
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // throws OutOfMemoryError
  virtual void deallocate(void* ptr) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() {}  // returns cached, unused blocks to the system
};

// The allocator for tensors on `device`. CUDA devices throw DeviceError when built without CUDA.
Allocator& allocator_for(Device device);

// Plain 64-byte aligned host memory (the CPU device's allocator).
Allocator& host_allocator();

// The host allocator's requests replayed through the CUDA caching allocator's block rules
// (core/block_pool.h: 512-byte rounding, 2 and 20 MiB segments, splitting and merging; one
// stream) at made-up addresses: what a CUDA run of the same ops would hold from the device at
// most, its kernels' own workspaces aside. Off until enabled (a map lookup per allocation);
// enabling starts afresh, and allocations made before it are not replayed. The host allocator's
// reset_peak() resets its peak too, and its empty_cache() gives the free segments back.
struct DeviceRulesStats {
  int64_t reserved = 0;       // the replayed segments' bytes
  int64_t peak_reserved = 0;  // their high-water mark since the last reset
  int64_t segments = 0;
  int64_t requested = 0;       // the bytes asked for by the replayed allocations still live
  int64_t peak_requested = 0;  // their high-water mark since the last reset
};
void set_host_device_rules(bool enabled);
DeviceRulesStats host_device_rules_stats();

// While one lives (SKA_KERNEL's calls of CPU kernels), the replay leaves out what is allocated:
// a kernel's own scratch (the CPU's widened f32 copies, im2col buffers), which a CUDA kernel
// makes differently or not at all. The op layer allocates every kernel's operands outside.
class HostKernelScratch {
 public:
  explicit HostKernelScratch(bool on);
  ~HostKernelScratch();
  HostKernelScratch(const HostKernelScratch&) = delete;
  HostKernelScratch& operator=(const HostKernelScratch&) = delete;

 private:
  bool on_;
};

// Page-locked host memory for fast, asynchronous host<->device copies (plain memory without CUDA).
Allocator& pinned_host_allocator();

}  // namespace ska
