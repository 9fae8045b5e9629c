// torch.roll's kernel (cuda/kernels/roll.cu) built by the host compiler and run by tests/simt:
// plan_roll and launch_roll on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/roll.cu"
// clang-format on

#include "tests/simt/roll_host.h"

namespace ska::simt::roll {

size_t roll(const void* x, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
            const std::vector<int64_t>& shifts, size_t elem_bytes, void* out) {
  const cuda::RollPlan plan =
      cuda::plan_roll(static_cast<int>(sizes.size()), sizes.data(), strides.data(), shifts.data(),
                      elem_bytes, cuda::aligned_to(x, 16) && cuda::aligned_to(out, 16));
  cuda::launch_roll(x, out, plan, nullptr);
  return plan.esize;
}

}  // namespace ska::simt::roll
