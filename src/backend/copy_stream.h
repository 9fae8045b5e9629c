// Host-to-device uploads on a device's own copy stream, so that copying the next batch overlaps
// the compute stream's work; events order the two streams without blocking the host. Built from
// cuda/runtime/copy_stream.cpp with CUDA; without it the constructor throws DeviceError.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace ska {

class CopyStream {
 public:
  static constexpr int kSlots = 2;  // uploads that can be in flight, each with its own event

  explicit CopyStream(Device device);  // a CUDA device; creates the stream and the events
  ~CopyStream();                       // waits for the uploads still in flight
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Queues dst[i] = src[i] on the copy stream and marks `slot` done when they finish. src:
  // contiguous host tensors (pinned, or the copy is synchronous), dst: contiguous tensors of the
  // same dtypes and sizes on the device. The copies start after the work queued so far on the
  // device's current stream, which may still be using dst's memory (it came from that stream's
  // pool).
  void upload(int slot, const std::vector<Tensor>& src, const std::vector<Tensor>& dst);
  // Makes the device's current stream wait for the uploads of `slot`; the host does not block.
  void stream_wait(int slot);
  // Blocks the host until the uploads of `slot` are done (before rewriting their host sources).
  void host_wait(int slot);

  Device device() const { return device_; }

 private:
  struct Impl;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ska
