// Host-side runtime services that only a device backend provides: copies between the host and a
// device, and synchronisation. Built from cuda/runtime/ with CUDA; without it they throw.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ska {

// dst = src for contiguous tensors of one dtype on different devices (host<->device or
// device<->device). Asynchronous on the current stream when the host side is pinned.
void copy_between_devices(const Tensor& src, const Tensor& dst);
// Waits for all work queued on `device` (no-op for the CPU).
void synchronize(Device device);

// For the kernel profiler (profiler.h). An event recorded on the current stream of the CUDA
// `device`; the milliseconds between two of them, waiting for the later one (both are released).
// Without CUDA these throw DeviceError.
void* record_device_event(Device device);
double device_event_ms(void* start, void* stop);
// The name the driver gives CUDA device `index` ("NVIDIA H100 80GB HBM3"); DeviceError without
// CUDA.
std::string cuda_device_name(int index);
// An NVTX range around a span of host code, as Nsight shows it; no-ops without CUDA.
void push_profile_range(const char* name);
void pop_profile_range();

}  // namespace ska
