// Host-side runtime services that only a device backend provides: copies between the host and a
// device, and synchronisation. Built from cuda/runtime/ with CUDA; without it they throw.
#pragma once

#include "core/tensor.h"

namespace ska {

// dst = src for contiguous tensors of one dtype on different devices (host<->device or
// device<->device). Asynchronous on the current stream when the host side is pinned.
void copy_between_devices(const Tensor& src, const Tensor& dst);
// Waits for all work queued on `device` (no-op for the CPU).
void synchronize(Device device);

}  // namespace ska
