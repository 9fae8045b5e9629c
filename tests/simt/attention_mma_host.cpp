// The mma.sync attention kernels (cuda/kernels/attention_mma.cu) built by the host compiler and
// run by tests/simt: mma_forward and mma_backward on host memory, every launch on the host.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/attention_mma.cu"
// clang-format on

namespace ska::cuda::attn {
namespace {
// The kernels' `extern __shared__ smem[]`: one block's dynamic shared memory at a time.
alignas(128) thread_local unsigned char smem[227 * 1024];
const bool registered = (simt::register_shared(smem, sizeof smem), true);
}  // namespace

int64_t resident_blocks(const void*, int, size_t) { return simt::resident_blocks(); }

}  // namespace ska::cuda::attn
