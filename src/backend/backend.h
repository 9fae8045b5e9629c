// The kernel entry points of every backend, and SKA_KERNEL, which picks the one for a device.
#pragma once

#include <vector>

#include "backend/kernel_types.h"
#include "backend/profiler.h"
#include "core/tensor.h"

namespace ska {
namespace cpu {
#include "backend/kernels.inc"
}  // namespace cpu
namespace cuda {
#include "backend/kernels.inc"
}  // namespace cuda

namespace detail {
[[noreturn]] void throw_no_cuda(const char* kernel);
}  // namespace detail
}  // namespace ska

// SKA_KERNEL(device, name) is kernel `name` for `device`, callable as the function itself (and
// timed while the profiler runs, see profiler.h):
//   SKA_KERNEL(x.device(), softmax_forward)(x, mask, scale, false, y);
#ifdef SKA_WITH_CUDA
#define SKA_KERNEL(device, name)                \
  ::ska::profiler::timed(#name, (device),       \
                         (device).is_cuda() ? &::ska::cuda::name : &::ska::cpu::name)
#else
#define SKA_KERNEL(device, name)                                                         \
  ::ska::profiler::timed(#name, (device),                                                \
                         (device).is_cuda()                                              \
                             ? (::ska::detail::throw_no_cuda(#name), &::ska::cpu::name)  \
                             : &::ska::cpu::name)
#endif
