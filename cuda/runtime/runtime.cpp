// Per-device CUDA runtime state: device discovery, the lazily created compute streams, this
// thread's stream overrides, library handles and device properties.
//
// Streams: each device has one non-blocking compute stream, created on first use and never
// destroyed (kernels may be queued until exit). A StreamGuard overrides it for the calling thread
// only (thread_local), so threads can drive different streams without locks.
// Handles: one cuBLASLt handle per device (cublasLtMatmul takes the stream per call, so one handle
// is safely shared by threads); cuDNN handles carry a stream, so each thread gets its own per
// device, taken from a per-device pool and returned to it when the thread exits.
#include "cuda/runtime/runtime.h"

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/cublaslt.h"

namespace ska {

namespace {

// Number of visible devices, queried once; 0 when there is no driver or no device.
int visible_device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver / no device: not an error for the caller
      return 0;
    }
    return n;
  }();
  return count;
}

}  // namespace

bool cuda_is_available() { return visible_device_count() > 0; }
int cuda_device_count() { return visible_device_count(); }

namespace cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::once_flag lt_once;
  cublasLtHandle_t lt = nullptr;
  std::once_flag props_once;
  int sm_count = 0;
  int capability = 0;
  std::mutex mu;  // guards the two vectors below
  std::vector<cudaStream_t> extra_streams;
  std::vector<cudnnHandle_t> free_cudnn;
};

void check_device(int device) {
  SKA_CHECK(device >= 0 && device < visible_device_count() && device < kMaxDevices, DeviceError,
            "cuda:", device, " requested, but ", visible_device_count(),
            " CUDA device(s) are visible");
}

// Never destroyed: streams and handles must outlive every static that might still use them.
DeviceState& state(int device) {
  check_device(device);
  static std::array<DeviceState, kMaxDevices>* states = new std::array<DeviceState, kMaxDevices>();
  return (*states)[static_cast<size_t>(device)];
}

// This thread's stream overrides; nullptr = none (the compute stream).
thread_local std::array<cudaStream_t, kMaxDevices> t_stream_override{};

// This thread's cuDNN handles, returned to their device's pool when the thread exits.
struct ThreadCudnnHandles {
  std::array<cudnnHandle_t, kMaxDevices> handles{};
  ~ThreadCudnnHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (!handles[static_cast<size_t>(d)]) continue;
      DeviceState& s = state(d);
      std::lock_guard<std::mutex> lock(s.mu);
      s.free_cudnn.push_back(handles[static_cast<size_t>(d)]);
    }
  }
};
thread_local ThreadCudnnHandles t_cudnn;

}  // namespace

cudaStream_t current_stream(int device) {
  check_device(device);
  const cudaStream_t over = t_stream_override[static_cast<size_t>(device)];
  if (over) return over;
  DeviceState& s = state(device);
  std::call_once(s.stream_once, [&] {
    DeviceGuard guard(device);
    SKA_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  });
  return s.stream;
}

cudaStream_t create_stream(int device) {
  DeviceState& s = state(device);
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  SKA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::lock_guard<std::mutex> lock(s.mu);
  s.extra_streams.push_back(stream);
  return stream;
}

// A null `stream` selects the legacy default stream (CUDA's meaning of stream 0).
StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device) {
  check_device(device);
  previous_ = t_stream_override[static_cast<size_t>(device)];
  t_stream_override[static_cast<size_t>(device)] = stream ? stream : cudaStreamLegacy;
}

StreamGuard::~StreamGuard() { t_stream_override[static_cast<size_t>(device_)] = previous_; }

DeviceGuard::DeviceGuard(int device) : previous_(-1) {
  int current = 0;
  SKA_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    SKA_CUDA_CHECK(cudaSetDevice(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // destructors must not throw
}

cublasLtHandle_t cublaslt_handle(int device) {
  DeviceState& s = state(device);
  std::call_once(s.lt_once, [&] {
    DeviceGuard guard(device);
    SKA_CUBLAS_CHECK(cublaslt().create(&s.lt));
  });
  return s.lt;
}

cudnnHandle_t cudnn_handle(int device) {
  DeviceState& s = state(device);
  cudnnHandle_t& h = t_cudnn.handles[static_cast<size_t>(device)];
  if (!h) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.free_cudnn.empty()) {
        h = s.free_cudnn.back();
        s.free_cudnn.pop_back();
      }
    }
    if (!h) {
      DeviceGuard guard(device);
      SKA_CUDNN_CHECK(cudnnCreate(&h));
    }
  }
  SKA_CUDNN_CHECK(cudnnSetStream(h, current_stream(device)));
  return h;
}

Tensor workspace(int device, size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::cuda(device));
}

namespace {
void query_properties(int device, DeviceState& s) {
  std::call_once(s.props_once, [&] {
    int major = 0, minor = 0;
    SKA_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_count, cudaDevAttrMultiProcessorCount, device));
    SKA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SKA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    s.capability = major * 10 + minor;
  });
}
}  // namespace

int sm_count(int device) {
  DeviceState& s = state(device);
  query_properties(device, s);
  return s.sm_count;
}

int compute_capability(int device) {
  DeviceState& s = state(device);
  query_properties(device, s);
  return s.capability;
}

float time_ms(int device, const std::function<void()>& f, int reps) {
  const cudaStream_t stream = current_stream(device);
  cudaEvent_t start = nullptr, stop = nullptr;
  SKA_CUDA_CHECK(cudaEventCreate(&start));
  SKA_CUDA_CHECK(cudaEventCreate(&stop));
  SKA_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int r = 0; r < reps; ++r) f();
  SKA_CUDA_CHECK(cudaEventRecord(stop, stream));
  SKA_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SKA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  SKA_CUDA_CHECK(cudaEventDestroy(start));
  SKA_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / static_cast<float>(reps);
}

}  // namespace cuda
}  // namespace ska
