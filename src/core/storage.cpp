// Storage and the host allocators.
#include "core/storage.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ska {

namespace {

// 64-byte aligned host memory with the same statistics as the device allocators. Blocks of
// kLargeBlock bytes and more are rounded up to a multiple of it and cached when freed, for the
// next request of the same rounded size: a training step allocates the same large activations
// every step, and glibc would otherwise mmap and munmap each of them (then fault every page in
// again). At most kMaxCachedBytes stay cached; a failed allocation empties the cache and retries.
class HostAllocator : public Allocator {
 public:
  static constexpr size_t kLargeBlock = size_t{1} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{4} << 30;

  void* allocate(size_t nbytes) override {
    const size_t rounded = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    if (rounded >= kLargeBlock) {
      auto it = cached_.find(rounded);
      if (it != cached_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= rounded;
      }
    }
    if (!p) {
      p = std::aligned_alloc(64, rounded);
      if (!p && cached_bytes_ > 0) {
        release_cached();
        p = std::aligned_alloc(64, rounded);
      }
      SKA_CHECK(p != nullptr, OutOfMemoryError, "host allocation of ", nbytes,
                " bytes failed (", stats_.allocated, " bytes held)");
      ++stats_.num_system_allocs;
    }
    sizes_[p] = {rounded, nbytes};
    stats_.allocated += static_cast<int64_t>(rounded);
    stats_.requested += static_cast<int64_t>(nbytes);
    stats_.peak_requested = std::max(stats_.peak_requested, stats_.requested);
    stats_.reserved = stats_.allocated + static_cast<int64_t>(cached_bytes_);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocs;
    return p;
  }
  void deallocate(void* ptr) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    size_t size = 0;
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      size = it->second.first;
      stats_.allocated -= static_cast<int64_t>(size);
      stats_.requested -= static_cast<int64_t>(it->second.second);
      sizes_.erase(it);
    }
    if (size >= kLargeBlock && cached_bytes_ + size <= kMaxCachedBytes) {
      cached_[size].push_back(ptr);
      cached_bytes_ += size;
    } else {
      std::free(ptr);
    }
    stats_.reserved = stats_.allocated + static_cast<int64_t>(cached_bytes_);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_requested = stats_.requested;
    stats_.peak_reserved = stats_.reserved;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
    stats_.reserved = stats_.allocated;
  }

 private:
  static size_t round_size(size_t nbytes) {
    const size_t n = std::max<size_t>(nbytes, 1);
    return n >= kLargeBlock ? (n + kLargeBlock - 1) / kLargeBlock * kLargeBlock
                            : (n + 63) / 64 * 64;
  }
  // Frees every cached block (mu_ held).
  void release_cached() {
    for (auto& [size, blocks] : cached_) {
      for (void* p : blocks) std::free(p);
    }
    cached_.clear();
    cached_bytes_ = 0;
  }

  mutable std::mutex mu_;
  std::unordered_map<void*, std::pair<size_t, size_t>> sizes_;  // block size, bytes requested
  std::unordered_map<size_t, std::vector<void*>> cached_;  // free large blocks by size
  size_t cached_bytes_ = 0;
  MemoryStats stats_;
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator* a = new HostAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}

#ifndef SKA_WITH_CUDA
Allocator& allocator_for(Device device) {
  SKA_CHECK(device.is_cpu(), DeviceError, "device ", device,
            " requested, but this build has no CUDA support (configure with -DSKA_CUDA=ON)");
  return host_allocator();
}
Allocator& pinned_host_allocator() { return host_allocator(); }
bool cuda_is_available() { return false; }
int cuda_device_count() { return 0; }
#endif

Storage::Storage(size_t nbytes, Device device, Allocator* allocator)
    : nbytes_(nbytes), device_(device), allocator_(allocator ? allocator : &allocator_for(device)) {
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() { allocator_->deallocate(data_); }

bool Storage::pinned() const { return device_.is_cpu() && allocator_ == &pinned_host_allocator(); }

}  // namespace ska
