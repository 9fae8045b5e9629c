// The CUDA caching allocators: device memory (one per device) and pinned host memory. Freed blocks
// are cached and reused, so the steady state makes no cudaMalloc/cudaFree (or cudaHostAlloc) calls.
// Device blocks are cut from larger segments and merged again when freed (core/block_pool.h), so a
// block is the request rounded to 512 bytes, not a whole cudaMalloc; pinned blocks are whole.
//
// Device segments and blocks belong to the stream that was current when they were allocated: a
// freed block is only handed out again for an allocation on the same stream, so stream order
// guarantees that the kernels still using it have finished first. A tensor used on another stream
// must be synchronised with its allocation stream before it is freed. While a CUDA Graph is being
// captured on a stream (device_graph.cpp), that stream's allocations come from a private pool of
// the graph instead: the captured kernels keep their addresses for every replay, so no other work
// may be handed those blocks until the graph is destroyed; then the pool's segments return to the
// stream. Pinned blocks record an event for every asynchronous copy that uses them
// (record_pinned_use) and wait for those events when freed.
#include "cuda/runtime/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/block_pool.h"
#include "core/error.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska {

namespace cuda {
namespace {

std::string format_bytes(int64_t bytes) {
  return std::to_string(bytes) + " bytes (" +
         std::to_string(static_cast<double>(bytes) / static_cast<double>(1 << 20)) + " MiB)";
}

// The size-keyed cache with statistics; subclasses provide the system calls.
class CachingAllocator : public Allocator {
 public:
  explicit CachingAllocator(bool split) : pool_(split) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.num_allocs;
      return nullptr;
    }
    if (nbytes > BlockPool::kMaxRequest) throw_oom(nbytes, "request too large");
    const size_t size = pool_.round(nbytes);
    const cudaStream_t stream = allocation_stream();
    std::lock_guard<std::mutex> lock(mu_);
    // Only the capturing thread's allocations join the graph's pool: a block another thread
    // took from it could be one the captured kernels still write on every replay.
    const bool pooled = capture_.pool != 0 && capture_.stream == stream &&
                        capture_.thread == std::this_thread::get_id();
    const uintptr_t key = pooled ? capture_.pool : stream_key(stream);
    size_t block_size = 0;
    void* ptr = pool_.take(key, size, &block_size);
    if (!ptr) ptr = take_new_segment(key, nbytes, size, &block_size);
    active_[ptr] = Block{block_size, nbytes, {}};
    stats_.allocated += static_cast<int64_t>(block_size);
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.requested += static_cast<int64_t>(nbytes);
    stats_.peak_requested = std::max(stats_.peak_requested, stats_.requested);
    ++stats_.num_allocs;
    return ptr;
  }

  void deallocate(void* ptr) override {
    if (!ptr) return;
    Block block;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = active_.find(ptr);
      if (it == active_.end()) return;  // not ours; called from destructors, so never throw
      block = std::move(it->second);
      active_.erase(it);
      stats_.allocated -= static_cast<int64_t>(block.size);
      stats_.requested -= static_cast<int64_t>(block.requested);
    }
    for (cudaEvent_t ev : block.events) {  // pinned blocks: wait for copies still reading them
      (void)cudaEventSynchronize(ev);
      (void)cudaEventDestroy(ev);
    }
    std::lock_guard<std::mutex> lock(mu_);
    pool_.give_back(ptr);
  }

  // Graph capture: from now on, this thread's allocations on `stream` come from pool `pool`
  // (nonzero, never a stream's key: callers pass an odd number, streams are aligned pointers).
  void begin_capture_pool(uintptr_t pool, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    SKA_CHECK(capture_.pool == 0, ValueError, name(), ": a graph capture is already under way");
    capture_ = {pool, stream, std::this_thread::get_id()};
  }
  void end_capture_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    pools_[capture_.pool] = stream_key(capture_.stream);
    capture_ = {};
  }
  // The graph of `pool` is destroyed (its work finished): its segments return to the stream it
  // was captured on, with their free blocks and those still in use, which join it when freed.
  void release_capture_pool(uintptr_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = pools_.find(pool);
    if (it == pools_.end()) return;
    pool_.rekey(pool, it->second);
    pools_.erase(it);
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
    release_cached_locked();
  }

  // Pinned only: an asynchronous copy on `stream` uses the block at `base`.
  void record_use(const void* base, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(const_cast<void*>(base));
    if (it == active_.end()) return;
    std::vector<cudaEvent_t>& events = it->second.events;
    // Drop events that have completed, so a buffer reused for many copies keeps few.
    events.erase(std::remove_if(events.begin(), events.end(),
                                [](cudaEvent_t ev) {
                                  if (cudaEventQuery(ev) != cudaSuccess) return false;
                                  (void)cudaEventDestroy(ev);
                                  return true;
                                }),
                 events.end());
    (void)cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error
    cudaEvent_t ev = nullptr;
    SKA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    SKA_CUDA_CHECK(cudaEventRecord(ev, stream));
    events.push_back(ev);
  }

 protected:
  struct Block {
    size_t size = 0;
    size_t requested = 0;  // what the caller asked for (size: the block handed out)
    std::vector<cudaEvent_t> events;
  };

  virtual cudaError_t system_alloc(void** ptr, size_t size) = 0;
  virtual void system_free(void* ptr) = 0;
  virtual void synchronize_before_release() {}
  virtual cudaStream_t allocation_stream() = 0;
  virtual std::string name() const = 0;

 private:
  static uintptr_t stream_key(cudaStream_t s) { return reinterpret_cast<uintptr_t>(s); }

  // A block for a request that no cached block serves, from a new segment. When the system
  // refuses, the cache's free segments go back to it and the request is retried, then with a
  // segment of the request's own size.
  void* take_new_segment(uintptr_t key, size_t nbytes, size_t size, size_t* block_size) {
    size_t segment = pool_.segment_size(size);
    void* ptr = nullptr;
    cudaError_t err = system_alloc(&ptr, segment);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = system_alloc(&ptr, segment);
    }
    if (err != cudaSuccess && segment > size) {
      (void)cudaGetLastError();
      segment = size;
      err = system_alloc(&ptr, segment);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw_oom(nbytes, cudaGetErrorString(err));
    }
    void* block = pool_.take_from_new_segment(key, ptr, segment, size, block_size);
    stats_.reserved = static_cast<int64_t>(pool_.reserved_bytes());
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    ++stats_.num_system_allocs;
    return block;
  }

  void release_cached_locked() {
    if (pool_.free_bytes() == 0) return;
    synchronize_before_release();
    // A graph's pool stays while the graph lives (or is being captured): its replays write to
    // the blocks its capture freed as much as to those still held.
    const auto live_graph = [this](uintptr_t key) {
      return (capture_.pool != 0 && key == capture_.pool) || pools_.count(key) != 0;
    };
    for (const auto& segment : pool_.remove_free_segments(live_graph)) system_free(segment.first);
    stats_.reserved = static_cast<int64_t>(pool_.reserved_bytes());
  }

  [[noreturn]] void throw_oom(size_t nbytes, const char* reason) {
    // Free blocks left after the retry lie in segments that still hold tensors (fragmentation).
    const size_t free = pool_.free_bytes();
    const std::string cached =
        free == 0 ? ""
                  : ", " + format_bytes(static_cast<int64_t>(free)) +
                        " of it free in cached blocks (the largest " +
                        format_bytes(static_cast<int64_t>(pool_.largest_free_bytes())) + ")";
    SKA_FAIL(OutOfMemoryError, name(), " out of memory: tried to allocate ",
             format_bytes(static_cast<int64_t>(nbytes)), "; ", format_bytes(stats_.allocated),
             " allocated, ", format_bytes(stats_.reserved), " reserved", cached, " (", reason, ")");
  }

  struct Capture {
    uintptr_t pool = 0;  // 0: no capture under way
    cudaStream_t stream = nullptr;
    std::thread::id thread;
  };

  mutable std::mutex mu_;
  MemoryStats stats_;
  BlockPool pool_;
  std::unordered_map<void*, Block> active_;
  Capture capture_;
  std::unordered_map<uintptr_t, uintptr_t> pools_;  // live graph pool -> its stream's key
};

// SKA_CUDA_ALLOCATOR: `split` (the default) cuts blocks out of shared segments and merges them
// again; `whole_blocks` caches each cudaMalloc'ed block whole (the allocator before 2026-12-02).
bool splits_device_blocks() {
  const char* v = std::getenv("SKA_CUDA_ALLOCATOR");
  const std::string mode = v && *v ? v : "split";
  SKA_CHECK(mode == "split" || mode == "whole_blocks", ValueError,
            "environment variable SKA_CUDA_ALLOCATOR=", mode,
            ": expected `split` (the default) or `whole_blocks`");
  return mode == "split";
}

class DeviceCachingAllocator final : public CachingAllocator {
 public:
  explicit DeviceCachingAllocator(int device)
      : CachingAllocator(splits_device_blocks()), device_(device) {}

 protected:
  // cudaMalloc is not a stream operation: during a graph capture it is "unsafe" for CUDA (it
  // would invalidate the capture), though the memory it returns is what the private pool needs.
  // Relaxed mode for the call allows it.
  cudaError_t system_alloc(void** ptr, size_t size) override {
    DeviceGuard guard(device_);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t err = cudaMalloc(ptr, size);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
  }
  void system_free(void* ptr) override {
    DeviceGuard guard(device_);
    (void)cudaFree(ptr);
  }
  // Cached blocks may still be read by queued kernels of their stream.
  void synchronize_before_release() override {
    DeviceGuard guard(device_);
    (void)cudaDeviceSynchronize();
  }
  cudaStream_t allocation_stream() override { return current_stream(device_); }
  std::string name() const override { return "cuda:" + std::to_string(device_); }

 private:
  int device_;
};

class PinnedCachingAllocator final : public CachingAllocator {
 public:
  PinnedCachingAllocator() : CachingAllocator(false) {}

 protected:
  // Portable: usable for copies with every device.
  cudaError_t system_alloc(void** ptr, size_t size) override {
    return cudaHostAlloc(ptr, size, cudaHostAllocPortable);
  }
  void system_free(void* ptr) override { (void)cudaFreeHost(ptr); }
  cudaStream_t allocation_stream() override { return nullptr; }  // one pool for every stream
  std::string name() const override { return "pinned host memory"; }
};

PinnedCachingAllocator& pinned_allocator() {
  static PinnedCachingAllocator* a = new PinnedCachingAllocator();  // never destroyed
  return *a;
}

}  // namespace

void record_pinned_use(const void* base, cudaStream_t stream) {
  if (cuda_is_available()) pinned_allocator().record_use(base, stream);
}

namespace {
DeviceCachingAllocator& device_allocator(int device) {
  return static_cast<DeviceCachingAllocator&>(allocator_for(Device::cuda(device)));
}
}  // namespace

void begin_capture_pool(int device, uintptr_t pool, cudaStream_t stream) {
  device_allocator(device).begin_capture_pool(pool, stream);
}
void end_capture_pool(int device) { device_allocator(device).end_capture_pool(); }
void release_capture_pool(int device, uintptr_t pool) {
  device_allocator(device).release_capture_pool(pool);
}

}  // namespace cuda

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return host_allocator();
  SKA_CHECK(device.index >= 0 && device.index < cuda_device_count(), DeviceError, "device ",
            device, " requested, but ", cuda_device_count(), " CUDA device(s) are visible");
  static std::vector<std::unique_ptr<cuda::DeviceCachingAllocator>>* allocators = [] {
    auto* v = new std::vector<std::unique_ptr<cuda::DeviceCachingAllocator>>();
    for (int d = 0; d < cuda_device_count(); ++d) {
      v->push_back(std::make_unique<cuda::DeviceCachingAllocator>(d));
    }
    return v;
  }();  // never destroyed: tensors may outlive statics
  return *(*allocators)[static_cast<size_t>(device.index)];
}

// Without a usable device, page-locking is impossible; plain host memory serves instead.
Allocator& pinned_host_allocator() {
  if (!cuda_is_available()) return host_allocator();
  return cuda::pinned_allocator();
}

}  // namespace ska
