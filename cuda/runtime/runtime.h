// Per-device CUDA runtime state: the current stream, library handles bound to it, and scoped
// device / stream selection. Every kernel launches on current_stream(device).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>

#include "core/tensor.h"

namespace ska::cuda {

// The stream work for `device` is queued on by this thread: the device's compute stream (created
// on first use, non-blocking) unless a StreamGuard selected another.
cudaStream_t current_stream(int device);
// A new non-blocking stream on `device` (e.g. for communication); owned by the runtime.
cudaStream_t create_stream(int device);

// Selects `stream` as the current stream of `device` for this thread within a scope.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// Makes `device` current (cudaSetDevice) within a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// Library handles of `device`, bound to current_stream(device) when returned.
cublasLtHandle_t cublaslt_handle(int device);
cudnnHandle_t cudnn_handle(int device);

// Scratch memory from the caching allocator, freed (to the cache) with the returned tensor.
Tensor workspace(int device, size_t bytes);

// Mean milliseconds of `reps` back-to-back runs of f on `device`'s current stream, by events
// around them (it synchronises: never inside a graph capture). For timed kernel choices.
float time_ms(int device, const std::function<void()>& f, int reps);

// Properties used to choose kernels.
int sm_count(int device);
int compute_capability(int device);  // 90 for sm_90

}  // namespace ska::cuda
