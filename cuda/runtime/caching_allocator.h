// Internal interface between the caching allocators and the copy routines (not for kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ska::cuda {

// Records that the pinned host block at `base` (a Storage's data()) is used by work queued on
// `stream`: when the block is freed, the allocator waits for that work before caching it.
void record_pinned_use(const void* base, cudaStream_t stream);

// CUDA Graph capture (device_graph.cpp): between begin and end, the calling thread's allocations
// on `stream` of `device` come from the private pool `pool` (an odd number, unlike any stream's address); the
// pool's blocks are kept from other work until release_capture_pool, after the graph's last
// replay has finished.
void begin_capture_pool(int device, uintptr_t pool, cudaStream_t stream);
void end_capture_pool(int device);
void release_capture_pool(int device, uintptr_t pool);

}  // namespace ska::cuda
