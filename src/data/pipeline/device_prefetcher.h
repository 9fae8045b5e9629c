// Pinned, asynchronous host-to-device batches: the host loader's next batch is staged in pinned
// memory and uploaded on a copy stream while the GPU computes on the current one; the compute
// stream waits on an event when the batch is handed out. No host synchronisation and, in the
// steady state, no allocation calls (cached pinned buffers, the caching device allocator).
#pragma once

#include <array>
#include <cstdint>

#include "backend/copy_stream.h"
#include "data/pipeline/batch_source.h"

namespace ska::data {

class DevicePrefetcher : public BatchSource {
 public:
  // `loader` must outlive the prefetcher; `device` must be a CUDA device (DeviceError otherwise).
  DevicePrefetcher(DataLoader& loader, Device device);
  ~DevicePrefetcher() override;

  // Starts the loader's epoch and the upload of its first batch.
  void start_epoch(int64_t epoch, int64_t start_batch) override;
  // Hands out the batch uploaded one call ago (the current stream waits for its copy) and starts
  // uploading the following one.
  bool next(Batch& out) override;

 private:
  struct Slot {
    Tensor pinned_images, pinned_labels;  // reused while the batch shape stays the same
    Batch device;                         // the upload's destination, handed out by next()
    bool full = false;
  };
  // Pulls the loader's next batch into slot `s` and queues its upload; false at the epoch's end.
  bool stage(int s);
  // Drops batches that were uploaded but not handed out (after the current stream waited for
  // them, so their memory is not reused while the copy writes to it).
  void discard_pending();

  DataLoader& loader_;
  Device device_;
  CopyStream copies_;
  std::array<Slot, CopyStream::kSlots> slots_;
  int current_ = 0;  // the slot next() hands out
};

}  // namespace ska::data
