// The WMMA attention kernels (cuda/kernels/attention_tc.cu) built by the host compiler and run by
// tests/simt: attn::tc_forward and attn::tc_backward on host memory, every launch on the host,
// WMMA's fragments by tests/simt/wmma.h.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/attention_tc.cu"
// clang-format on

namespace ska::cuda::attn {
namespace {
// The kernels' `extern __shared__ unsigned char smem[]`: one block's dynamic shared memory.
alignas(128) thread_local unsigned char smem[227 * 1024];
const bool registered = (simt::register_shared(smem, sizeof smem), true);
}  // namespace
}  // namespace ska::cuda::attn
