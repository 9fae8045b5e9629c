// Internal interface between the caching allocators and the copy routines (not for kernels).
#pragma once

#include <cuda_runtime.h>

namespace ska::cuda {

// Records that the pinned host block at `base` (a Storage's data()) is used by work queued on
// `stream`: when the block is freed, the allocator waits for that work before caching it.
void record_pinned_use(const void* base, cudaStream_t stream);

}  // namespace ska::cuda
