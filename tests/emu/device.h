// The emulated device of SKA_CUDA_EMULATION builds (tests/emu/emulation.cmake): what its CUDA
// runtime (cuda_runtime.cpp), cuBLASLt (cublaslt.cpp) and cuDNN (cudnn.cpp) share.
//
// The device is one thread that runs every piece of work in the order it is submitted, and the
// submitter waits for it: every stream is synchronous, so the host never sees work unfinished. A
// stream under CUDA Graph capture records its work instead, and a launch of the graph runs it
// again in order. Kernels run on that thread through tests/simt (their blocks as fibers, their
// shared memory thread_local); library calls compute there on host memory.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace ska::emu {

// Runs `work` ordered on `stream` (nullptr or the legacy and per-thread handles: the default
// stream): on the device thread, waiting for it and rethrowing what it threw; or, while the stream
// is captured, records it into the graph. Errors of capture (work on a stream whose capture was
// invalidated) are returned.
cudaError_t submit(cudaStream_t stream, std::function<void()> work);

}  // namespace ska::emu
