// The dynamic shared memory of the kernel files that declare it (`extern __shared__ name[]`), for
// the emulated device: one block's at a time, as tests/simt's host wrappers define it, in the
// kernel file's own namespace. Included by the wrapper that tests/emu/emulation.cmake generates
// for each kernel file, after the file, with SKA_EMU_KERNEL_FILE_<NAME> defined.
#pragma once

// Defines `name`, 227 KiB of `type`, thread_local (the emulated device runs every block on its own
// thread) and registered with tests/simt once that thread runs its first launch.
#define SKA_EMU_SHARED(type, name)                                                            \
  alignas(128) thread_local type name[227 * 1024 / sizeof(type)];                             \
  const bool name##_registered =                                                              \
      (::ska::simt::register_shared_of([] { return reinterpret_cast<unsigned char*>(name); }, \
                                       sizeof name),                                          \
       true);

#if defined(SKA_EMU_KERNEL_FILE_ATTENTION_MMA) || defined(SKA_EMU_KERNEL_FILE_ATTENTION_TC)
namespace ska::cuda::attn {
namespace {
SKA_EMU_SHARED(unsigned char, smem)
}  // namespace
}  // namespace ska::cuda::attn
#elif defined(SKA_EMU_KERNEL_FILE_ATTENTION)
namespace ska::cuda {
namespace {
SKA_EMU_SHARED(float4, smem4)
}  // namespace
}  // namespace ska::cuda
#elif defined(SKA_EMU_KERNEL_FILE_CONV_LOGITS)
namespace ska::cuda {
namespace {
SKA_EMU_SHARED(unsigned char, smem)
}  // namespace
}  // namespace ska::cuda
#elif defined(SKA_EMU_KERNEL_FILE_LAYER_NORM)
namespace ska::cuda {
namespace {
SKA_EMU_SHARED(float, red)
}  // namespace
}  // namespace ska::cuda
#elif defined(SKA_EMU_KERNEL_FILE_REDUCE)
namespace ska::cuda {
namespace {
SKA_EMU_SHARED(float, col_lanes)
}  // namespace
}  // namespace ska::cuda
#elif defined(SKA_EMU_KERNEL_FILE_SOFTMAX)
namespace ska::cuda {
namespace {
SKA_EMU_SHARED(float, zs)
}  // namespace
}  // namespace ska::cuda
#endif
