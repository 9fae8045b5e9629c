// Storage and the host allocators.
#include "core/storage.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_pool.h"
#include "core/error.h"
#include "core/memory_census.h"

namespace ska {

namespace {

// CPU kernel calls under way (HostKernelScratch), on any thread: their allocations are scratch.
std::atomic<int> g_kernel_scratch_depth{0};

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
    if (replay_ && g_kernel_scratch_depth.load(std::memory_order_relaxed) == 0) {
      replay_allocate(p, nbytes);
    }
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
    replay_deallocate(ptr);
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
    device_rules_.peak_reserved = device_rules_.reserved;
    device_rules_.peak_requested = device_rules_.requested;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
    stats_.reserved = stats_.allocated;
    if (replay_) {  // as the device allocator's empty_cache gives its free segments back
      pool_.remove_free_segments();
      device_rules_.reserved = static_cast<int64_t>(pool_.reserved_bytes());
      device_rules_.segments = static_cast<int64_t>(pool_.segment_count());
    }
  }

  // Turning the replay on starts a fresh one: no segments, no peak.
  void set_device_rules(bool enabled) {
    std::lock_guard<std::mutex> lock(mu_);
    if (enabled && !replay_) {
      pool_ = BlockPool(true);
      replayed_.clear();
      device_rules_ = {};
    }
    replay_ = enabled;
  }
  DeviceRulesStats device_rules() const {
    std::lock_guard<std::mutex> lock(mu_);
    return device_rules_;
  }

 private:
  // The request at `p` replayed through the device rules (mu_ held). A made-up address space:
  // each new segment starts where the last one ended, never reused.
  void replay_allocate(void* p, size_t nbytes) {
    const size_t size = pool_.round(std::max<size_t>(nbytes, 1));
    size_t block_size = 0;
    void* block = pool_.take(0, size, &block_size);
    if (block == nullptr) {
      const size_t segment = pool_.segment_size(size);
      block = pool_.take_from_new_segment(0, reinterpret_cast<void*>(next_segment_), segment, size,
                                          &block_size);
      next_segment_ += segment;
      device_rules_.reserved = static_cast<int64_t>(pool_.reserved_bytes());
      device_rules_.peak_reserved = std::max(device_rules_.peak_reserved, device_rules_.reserved);
      device_rules_.segments = static_cast<int64_t>(pool_.segment_count());
    }
    replayed_[p] = {block, nbytes};
    device_rules_.requested += static_cast<int64_t>(nbytes);
    device_rules_.peak_requested = std::max(device_rules_.peak_requested, device_rules_.requested);
  }
  void replay_deallocate(void* p) {
    const auto it = replayed_.find(p);
    if (it == replayed_.end()) return;  // made before the replay began
    pool_.give_back(it->second.first);
    device_rules_.requested -= static_cast<int64_t>(it->second.second);
    replayed_.erase(it);
  }

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
  bool replay_ = false;
  BlockPool pool_{true};
  std::unordered_map<void*, std::pair<void*, size_t>> replayed_;  // host block -> replayed, bytes
  uintptr_t next_segment_ = uintptr_t{1} << 40;
  DeviceRulesStats device_rules_;
};

}  // namespace

namespace {
HostAllocator& the_host_allocator() {
  static HostAllocator* a = new HostAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}
}  // namespace

Allocator& host_allocator() { return the_host_allocator(); }

void set_host_device_rules(bool enabled) { the_host_allocator().set_device_rules(enabled); }
DeviceRulesStats host_device_rules_stats() { return the_host_allocator().device_rules(); }

HostKernelScratch::HostKernelScratch(bool on) : on_(on) {
  if (on_) g_kernel_scratch_depth.fetch_add(1, std::memory_order_relaxed);
}
HostKernelScratch::~HostKernelScratch() {
  if (on_) g_kernel_scratch_depth.fetch_sub(1, std::memory_order_relaxed);
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

namespace {

// The memory census (core/memory_census.h): per device, the live counted storages by size, their
// bytes and the counts at the high-water mark; the counted storages by address.
struct DeviceCensus {
  std::unordered_map<int64_t, int64_t> live;  // size -> how many
  int64_t bytes = 0, storages = 0;
  // At the high-water mark of `bytes` (copied there; sorted when read).
  std::unordered_map<int64_t, int64_t> peak_live;
  int64_t peak_bytes = 0, peak_storages = 0;
  void mark() {
    peak_live = live;
    peak_bytes = bytes;
    peak_storages = storages;
  }
};
struct Census {
  std::atomic<bool> on{false};
  std::atomic<int64_t> counted_storages{0};  // counted.size(), read without the lock
  std::mutex mutex;
  std::map<std::pair<int, int>, DeviceCensus> devices;  // (type, index)
  std::unordered_map<const void*, std::pair<std::pair<int, int>, int64_t>> counted;
};
Census& census() {
  static Census* c = new Census;  // never destroyed: storages may be freed during exit
  return *c;
}
std::pair<int, int> device_key(Device d) { return {static_cast<int>(d.type), d.index}; }

// dc's counts at its mark as a census, the largest totals first.
MemoryCensus census_at_peak(const DeviceCensus& dc) {
  MemoryCensus m;
  m.peak_bytes = dc.peak_bytes;
  m.peak_storages = dc.peak_storages;
  for (const auto& [bytes, count] : dc.peak_live) m.at_peak.push_back({bytes, count});
  std::sort(m.at_peak.begin(), m.at_peak.end(), [](const CensusEntry& a, const CensusEntry& b) {
    const int64_t ta = a.bytes * a.count, tb = b.bytes * b.count;
    return ta != tb ? ta > tb : a.bytes > b.bytes;
  });
  return m;
}

void census_add(const void* data, Device device, size_t nbytes) {
  if (device.is_cpu() && g_kernel_scratch_depth.load(std::memory_order_relaxed) > 0) return;
  Census& c = census();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.on.load(std::memory_order_relaxed)) return;
  const auto key = device_key(device);
  const auto bytes = static_cast<int64_t>(nbytes);
  c.counted[data] = {key, bytes};
  c.counted_storages.store(static_cast<int64_t>(c.counted.size()), std::memory_order_relaxed);
  DeviceCensus& dc = c.devices[key];
  ++dc.live[bytes];
  dc.bytes += bytes;
  ++dc.storages;
  if (dc.bytes > dc.peak_bytes) dc.mark();
}

void census_remove(const void* data) {
  Census& c = census();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.counted.find(data);
  if (it == c.counted.end()) return;
  DeviceCensus& dc = c.devices[it->second.first];
  const int64_t bytes = it->second.second;
  if (--dc.live[bytes] == 0) dc.live.erase(bytes);
  dc.bytes -= bytes;
  --dc.storages;
  c.counted.erase(it);
  c.counted_storages.store(static_cast<int64_t>(c.counted.size()), std::memory_order_relaxed);
}

}  // namespace

void set_memory_census(bool enabled) {
  Census& c = census();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (enabled && !c.on.load()) {
    c.devices.clear();
    c.counted.clear();
    c.counted_storages.store(0, std::memory_order_relaxed);
  }
  c.on.store(enabled);
}

void reset_memory_census_peak() {
  Census& c = census();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [key, dc] : c.devices) dc.mark();
}

MemoryCensus memory_census(Device device) {
  Census& c = census();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.devices.find(device_key(device));
  return it == c.devices.end() ? MemoryCensus{} : census_at_peak(it->second);
}

Storage::Storage(size_t nbytes, Device device, Allocator* allocator)
    : nbytes_(nbytes), device_(device), allocator_(allocator ? allocator : &allocator_for(device)) {
  data_ = allocator_->allocate(nbytes);
  if (census().on.load(std::memory_order_relaxed) && nbytes > 0) census_add(data_, device, nbytes);
}

Storage::~Storage() {
  if (census().counted_storages.load(std::memory_order_relaxed) > 0) census_remove(data_);
  allocator_->deallocate(data_);
}

bool Storage::pinned() const { return device_.is_cpu() && allocator_ == &pinned_host_allocator(); }

}  // namespace ska
