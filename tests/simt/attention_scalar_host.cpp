// The scalar attention kernels (cuda/kernels/attention.cu) built by the host compiler and run by
// tests/simt: attn::scalar_forward, attn::launch_delta and attn::scalar_backward on host memory,
// every launch on the host.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/attention.cu"
// clang-format on

namespace ska::cuda {
namespace {
// The kernels' `extern __shared__ float4 smem4[]`: one block's dynamic shared memory at a time.
alignas(128) thread_local float4 smem4[227 * 1024 / sizeof(float4)];
const bool registered =
    (simt::register_shared(reinterpret_cast<unsigned char*>(smem4), sizeof smem4), true);
}  // namespace
}  // namespace ska::cuda
