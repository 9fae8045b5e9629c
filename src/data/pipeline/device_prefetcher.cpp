// DevicePrefetcher: a two-slot ring of pinned staging buffers and device batches on a CopyStream.
#include "data/pipeline/device_prefetcher.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ska::data {

namespace {

// `host` in `pinned`, reallocating the pinned buffer only when the shape changes.
void stage_pinned(const Tensor& host, Tensor& pinned) {
  const Tensor src = host.contiguous();
  if (!pinned.defined() || pinned.shape() != src.shape() || pinned.dtype() != src.dtype()) {
    pinned = Tensor::empty_pinned(src.shape(), src.dtype());
  }
  std::memcpy(pinned.data_ptr(), src.data_ptr(),
              static_cast<size_t>(src.numel()) * src.element_size());
}

}  // namespace

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device)
    : loader_(loader), device_(device), copies_(device) {}

DevicePrefetcher::~DevicePrefetcher() {
  try {
    discard_pending();
  } catch (const Error&) {
    // A destructor must not throw; a sticky CUDA error resurfaces at the next checked call.
  }
}

void DevicePrefetcher::discard_pending() {
  for (int s = 0; s < CopyStream::kSlots; ++s) {
    Slot& slot = slots_[static_cast<size_t>(s)];
    if (!slot.full) continue;
    copies_.stream_wait(s);
    slot.device = Batch();
    slot.full = false;
  }
}

void DevicePrefetcher::start_epoch(int64_t epoch, int64_t start_batch) {
  discard_pending();
  loader_.start_epoch(epoch, start_batch);
  current_ = 0;
  stage(current_);
}

bool DevicePrefetcher::stage(int s) {
  Batch host;
  if (!loader_.next(host)) return false;
  Slot& slot = slots_[static_cast<size_t>(s)];
  copies_.host_wait(s);  // the slot's previous upload (two batches ago) still reads its buffers
  stage_pinned(host.images, slot.pinned_images);
  stage_pinned(host.labels, slot.pinned_labels);
  // Allocated on the current (compute) stream, whose queued work the upload waits for.
  slot.device.images =
      Tensor::empty(slot.pinned_images.shape(), slot.pinned_images.dtype(), device_);
  slot.device.labels =
      Tensor::empty(slot.pinned_labels.shape(), slot.pinned_labels.dtype(), device_);
  slot.device.index = host.index;
  copies_.upload(s, {slot.pinned_images, slot.pinned_labels},
                 {slot.device.images, slot.device.labels});
  slot.full = true;
  return true;
}

bool DevicePrefetcher::next(Batch& out) {
  Slot& slot = slots_[static_cast<size_t>(current_)];
  if (!slot.full) return false;
  copies_.stream_wait(current_);
  out = std::move(slot.device);
  slot.device = Batch();
  slot.full = false;
  current_ = (current_ + 1) % CopyStream::kSlots;
  stage(current_);
  return true;
}

}  // namespace ska::data
