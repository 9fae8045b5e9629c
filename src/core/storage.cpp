// Storage and the host allocators.
#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace ska {

namespace {

// 64-byte aligned host memory with the same statistics as the device allocators.
class HostAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    SKA_CHECK(p != nullptr, OutOfMemoryError, "host allocation of ", nbytes, " bytes failed (",
              stats_.allocated, " bytes held)");
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = rounded;
    stats_.allocated += rounded;
    stats_.reserved = stats_.allocated;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocs;
    ++stats_.num_system_allocs;
    return p;
  }
  void deallocate(void* ptr) override {
    if (!ptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(ptr);
      if (it != sizes_.end()) {
        stats_.allocated -= static_cast<int64_t>(it->second);
        stats_.reserved = stats_.allocated;
        sizes_.erase(it);
      }
    }
    std::free(ptr);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
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
