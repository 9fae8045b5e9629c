// Copies between the host and CUDA devices, and device synchronisation (backend/device_runtime.h).
//
// Semantics of copy_between_devices (contiguous src and dst of one dtype and size):
//  - host -> device: queued on the device's current stream. From pinned memory it is asynchronous
//    (the pinned block is kept out of reuse until the copy is done); from pageable memory the
//    stream is synchronised, so the copy has completed when the call returns.
//  - device -> host: queued on the device's current stream, which is then synchronised, so the
//    host can read the result on return (pinned or not).
//  - device -> device: queued on the destination's current stream, ordered after the work queued
//    so far on the source's current stream; the source stream waits for the copy in turn, so the
//    source memory is not reused by its stream while the copy reads it. Asynchronous.
#include <cstring>

#include "backend/device_runtime.h"
#include "core/error.h"
#include "cuda/runtime/caching_allocator.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska {

namespace {

// Orders `waiter` after the work queued so far on `signaller` (both streams of `device`'s
// context or any device: events work across devices).
void stream_wait(cudaStream_t waiter, cudaStream_t signaller, int signaller_device) {
  cuda::DeviceGuard guard(signaller_device);
  cudaEvent_t ev = nullptr;
  SKA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  SKA_CUDA_CHECK(cudaEventRecord(ev, signaller));
  const cudaError_t err = cudaStreamWaitEvent(waiter, ev, 0);
  (void)cudaEventDestroy(ev);  // safe: destruction is deferred until the event completes
  SKA_CUDA_CHECK(err);
}

}  // namespace

void copy_between_devices(const Tensor& src, const Tensor& dst) {
  SKA_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), ValueError,
            "copy_between_devices: ", src.str(), " -> ", dst.str(),
            ": dtypes and sizes must match");
  SKA_CHECK(src.is_contiguous() && dst.is_contiguous(), ValueError,
            "copy_between_devices: ", src.str(), " -> ", dst.str(), ": both must be contiguous");
  const size_t nbytes = static_cast<size_t>(src.numel()) * src.element_size();
  if (nbytes == 0) return;
  const Device sd = src.device(), dd = dst.device();
  const void* sp = src.data_ptr();
  void* dp = dst.data_ptr();

  if (sd.is_cpu() && dd.is_cpu()) {
    std::memcpy(dp, sp, nbytes);
    return;
  }
  if (sd.is_cpu()) {  // host -> device
    cuda::DeviceGuard guard(dd.index);
    const cudaStream_t stream = cuda::current_stream(dd.index);
    SKA_CUDA_CHECK(cudaMemcpyAsync(dp, sp, nbytes, cudaMemcpyHostToDevice, stream));
    if (src.storage()->pinned()) {
      cuda::record_pinned_use(src.storage()->data(), stream);
    } else {
      SKA_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    return;
  }
  if (dd.is_cpu()) {  // device -> host
    cuda::DeviceGuard guard(sd.index);
    const cudaStream_t stream = cuda::current_stream(sd.index);
    SKA_CUDA_CHECK(cudaMemcpyAsync(dp, sp, nbytes, cudaMemcpyDeviceToHost, stream));
    SKA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // device -> device
  const cudaStream_t dst_stream = cuda::current_stream(dd.index);
  if (sd.index == dd.index) {
    cuda::DeviceGuard guard(dd.index);
    SKA_CUDA_CHECK(cudaMemcpyAsync(dp, sp, nbytes, cudaMemcpyDeviceToDevice, dst_stream));
    return;
  }
  const cudaStream_t src_stream = cuda::current_stream(sd.index);
  stream_wait(dst_stream, src_stream, sd.index);
  {
    cuda::DeviceGuard guard(dd.index);
    SKA_CUDA_CHECK(cudaMemcpyPeerAsync(dp, dd.index, sp, sd.index, nbytes, dst_stream));
  }
  stream_wait(src_stream, dst_stream, dd.index);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  cuda::DeviceGuard guard(device.index);
  SKA_CUDA_CHECK(cudaDeviceSynchronize());
}

bool capturing(Device device) {
  if (device.is_cpu()) return false;
  cuda::DeviceGuard guard(device.index);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SKA_CUDA_CHECK(cudaStreamIsCapturing(cuda::current_stream(device.index), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace ska
