// CopyStream (backend/copy_stream.h): a non-blocking copy stream per object, one "ready" event to
// order uploads after the compute stream's queued work, and one "done" event per slot. Events are
// created once, so an upload makes no allocation or synchronisation calls.
#include "backend/copy_stream.h"

#include <array>
#include <cstdint>

#include "core/error.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska {

struct CopyStream::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;  // owned by the runtime (create_stream), never destroyed
  cudaEvent_t ready = nullptr;
  std::array<cudaEvent_t, kSlots> done{};
};

namespace {

int checked_slot(int slot) {
  SKA_CHECK(slot >= 0 && slot < CopyStream::kSlots, ValueError, "CopyStream: slot ", slot,
            " is outside [0, ", CopyStream::kSlots, ")");
  return slot;
}

}  // namespace

CopyStream::CopyStream(Device device) : device_(device), impl_(std::make_unique<Impl>()) {
  SKA_CHECK(device.is_cuda(), DeviceError, "CopyStream uploads to a CUDA device, got ", device);
  impl_->device = device.index;
  impl_->stream = cuda::create_stream(device.index);
  cuda::DeviceGuard guard(device.index);
  SKA_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming));
  for (cudaEvent_t& ev : impl_->done) {
    SKA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
}

CopyStream::~CopyStream() {
  if (!impl_) return;
  // The host buffers of uploads still in flight may be freed right after this; destructors do
  // not throw, so errors are dropped here (the next checked call reports a sticky one).
  (void)cudaStreamSynchronize(impl_->stream);
  (void)cudaEventDestroy(impl_->ready);
  for (cudaEvent_t ev : impl_->done) (void)cudaEventDestroy(ev);
}

void CopyStream::upload(int slot, const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  checked_slot(slot);
  SKA_CHECK(src.size() == dst.size(), ValueError, "CopyStream::upload: ", src.size(),
            " sources for ", dst.size(), " destinations");
  cuda::DeviceGuard guard(impl_->device);
  SKA_CUDA_CHECK(cudaEventRecord(impl_->ready, cuda::current_stream(impl_->device)));
  SKA_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, impl_->ready, 0));
  for (size_t i = 0; i < src.size(); ++i) {
    const Tensor& s = src[i];
    const Tensor& d = dst[i];
    SKA_CHECK(s.device().is_cpu() && d.device() == device_ && s.dtype() == d.dtype() &&
                  s.numel() == d.numel() && s.is_contiguous() && d.is_contiguous(),
              ValueError, "CopyStream::upload: ", s.str(), " -> ", d.str(),
              ": expected a contiguous host tensor and a contiguous ", device_,
              " tensor of the same dtype and size");
    const size_t nbytes = static_cast<size_t>(s.numel()) * s.element_size();
    if (nbytes == 0) continue;
    SKA_CUDA_CHECK(
        cudaMemcpyAsync(d.data_ptr(), s.data_ptr(), nbytes, cudaMemcpyHostToDevice, impl_->stream));
  }
  SKA_CUDA_CHECK(cudaEventRecord(impl_->done[static_cast<size_t>(slot)], impl_->stream));
}

void CopyStream::stream_wait(int slot) {
  checked_slot(slot);
  cuda::DeviceGuard guard(impl_->device);
  SKA_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(impl_->device),
                                     impl_->done[static_cast<size_t>(slot)], 0));
}

void CopyStream::host_wait(int slot) {
  checked_slot(slot);
  SKA_CUDA_CHECK(cudaEventSynchronize(impl_->done[static_cast<size_t>(slot)]));
}

}  // namespace ska
