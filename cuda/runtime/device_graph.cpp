// DeviceGraph on CUDA: stream capture into a cudaGraph_t, instantiated once and launched per
// replay, with the caching allocator's private pool for the allocations made while capturing.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <exception>

#include "backend/device_runtime.h"
#include "cuda/runtime/caching_allocator.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska {

struct DeviceGraph::State {
  int device = 0;
  cudaStream_t stream = nullptr;
  uintptr_t pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

namespace {

// Pool ids are odd, so never equal to a stream's (aligned) address, the key of its own cache.
uintptr_t next_pool_id() {
  static std::atomic<uintptr_t> next{1};
  return next.fetch_add(2);
}

}  // namespace

DeviceGraph::DeviceGraph(Device device, const std::function<void()>& fn)
    : state_(std::make_unique<State>()) {
  SKA_CHECK(device.is_cuda(), DeviceError, "a CUDA Graph needs a CUDA device, got ", device);
  State& s = *state_;
  s.device = device.index;
  cuda::DeviceGuard guard(s.device);
  s.stream = cuda::current_stream(s.device);
  s.pool = next_pool_id();
  SKA_CUDA_CHECK(cudaStreamSynchronize(s.stream));  // earlier work is not part of the graph
  cuda::begin_capture_pool(s.device, s.pool, s.stream);
  // Thread-local: other threads (data loading, communication) may keep calling CUDA meanwhile.
  const cudaError_t begun = cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal);
  if (begun != cudaSuccess) {
    cuda::end_capture_pool(s.device);
    cuda::release_capture_pool(s.device, s.pool);
    SKA_CUDA_CHECK(begun);
  }
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  const cudaError_t ended = cudaStreamEndCapture(s.stream, &s.graph);
  cuda::end_capture_pool(s.device);
  if (failure || ended != cudaSuccess) {
    (void)cudaGetLastError();  // an invalidated capture leaves its error behind
    if (s.graph != nullptr) (void)cudaGraphDestroy(s.graph);
    s.graph = nullptr;
    cuda::release_capture_pool(s.device, s.pool);
    if (failure) std::rethrow_exception(failure);
    SKA_FAIL(DeviceError, "capturing a CUDA Graph on ", device, " failed: ",
             cudaGetErrorString(ended),
             " (the captured work did something a capture does not allow: a host "
             "synchronisation, a copy from pageable memory, work on another stream)");
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&s.exec, s.graph, 0);
  if (instantiated != cudaSuccess) {
    (void)cudaGraphDestroy(s.graph);
    cuda::release_capture_pool(s.device, s.pool);
    SKA_CUDA_CHECK(instantiated);
  }
}

DeviceGraph::~DeviceGraph() {
  if (!state_) return;
  State& s = *state_;
  cuda::DeviceGuard guard(s.device);
  (void)cudaStreamSynchronize(s.stream);  // the last replay has finished with the pool
  if (s.exec != nullptr) (void)cudaGraphExecDestroy(s.exec);
  if (s.graph != nullptr) (void)cudaGraphDestroy(s.graph);
  cuda::release_capture_pool(s.device, s.pool);
}

void DeviceGraph::replay() {
  cuda::DeviceGuard guard(state_->device);
  SKA_CUDA_CHECK(cudaGraphLaunch(state_->exec, state_->stream));
}

}  // namespace ska
