// The device side of the kernel profiler: timing events from a pool, NVTX ranges, the capture
// range of an outside profiler, and the device's name (for the peak `benchmark` reports
// utilisation against).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <vector>

#include "backend/device_runtime.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska {

namespace {

struct TimingEvent {
  cudaEvent_t event;
  int device;
};

// Released events, reused by the next recordings (creating one costs more than recording it).
std::mutex pool_mutex;
std::vector<TimingEvent*> pool;

TimingEvent* acquire(int device) {
  {
    const std::lock_guard<std::mutex> lock(pool_mutex);
    for (size_t i = 0; i < pool.size(); ++i) {
      if (pool[i]->device == device) {
        TimingEvent* e = pool[i];
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(i));
        return e;
      }
    }
  }
  auto* e = new TimingEvent{nullptr, device};
  cuda::DeviceGuard guard(device);
  SKA_CUDA_CHECK(cudaEventCreate(&e->event));
  return e;
}

void release(TimingEvent* e) {
  const std::lock_guard<std::mutex> lock(pool_mutex);
  pool.push_back(e);
}

}  // namespace

void* record_device_event(Device device) {
  SKA_CHECK(device.is_cuda(), DeviceError, "record_device_event needs a CUDA device, got ",
            device);
  TimingEvent* e = acquire(device.index);
  cuda::DeviceGuard guard(device.index);
  SKA_CUDA_CHECK(cudaEventRecord(e->event, cuda::current_stream(device.index)));
  return e;
}

double device_event_ms(void* start, void* stop) {
  auto* a = static_cast<TimingEvent*>(start);
  auto* b = static_cast<TimingEvent*>(stop);
  float ms = 0.0f;
  SKA_CUDA_CHECK(cudaEventSynchronize(b->event));
  SKA_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event, b->event));
  release(a);
  release(b);
  return static_cast<double>(ms);
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  SKA_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

int cuda_compute_capability(int index) { return cuda::compute_capability(index); }

void push_profile_range(const char* name) { nvtxRangePushA(name); }
void pop_profile_range() { nvtxRangePop(); }

void start_device_profiler_capture() { SKA_CUDA_CHECK(cudaProfilerStart()); }
void stop_device_profiler_capture() { SKA_CUDA_CHECK(cudaProfilerStop()); }

}  // namespace ska
