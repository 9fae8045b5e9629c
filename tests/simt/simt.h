// The CUDA kernels' own source run on the host: a block's threads as fibers, one block at a time,
// with __syncthreads, __syncwarp, warp shuffles, mma.sync, ldmatrix and cp.async given their PTX
// semantics, and WMMA's fragments (tests/simt/wmma.h). Included (with SKA_SIMT defined) before a
// kernel file (.cu) that a host compiler then builds as C++; its launches (attn::launch) run here
// instead of on a device. What it checks beyond the results the kernels compute:
//   - barriers: every live thread of a block must reach the same number of __syncthreads, and a
//     block whose threads all wait on one another is reported as a deadlock;
//   - shared memory: poisoned (0xff bytes, NaN in bf16, f16 and f32) before each block, so that a
//     read of what no thread wrote shows up in the results;
//   - cp.async: a copy lands only at the wait that covers it (wait_group, wait_all), and its
//     destination is poisoned from the copy's issue, so that a tile read before its wait and
//     barrier shows up in the results;
//   - ldmatrix and cp.async addresses: inside the dynamic shared memory, 16-byte aligned rows;
//     WMMA's: 32-byte aligned, strides multiples of 16 bytes;
//   - the order threads run between barriers: set_schedule runs them first to last, last to
//     first, shuffled or warp by warp, so that a race between threads of a block gives different
//     results by order.
// The arithmetic of mma.sync and WMMA is exact products summed in f64 and rounded once to f32, not
// the tensor cores' own order: two kernels compared bit for bit here are compared on the same
// arithmetic, and the bits a GPU gives are checked by the [cuda] tests.
#pragma once

#ifndef SKA_SIMT
#error "tests/simt/simt.h is for the host build of CUDA kernels (SKA_SIMT)"
#endif

// __shared__ arrays: one instance for all of a block's fibers, which run on one OS thread
// (thread_local: static storage, and `extern __shared__` stays a valid declaration; the host
// files define the dynamic shared memory thread_local to match). Defined before the toolkit's
// headers, which then keep it. Unlike the dynamic shared memory, a static __shared__ array is not
// poisoned between blocks: a block starts with what the last block left there.
#define __shared__ thread_local
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>  // the host compiler's view: __device__ and friends expand to nothing

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#define __launch_bounds__(...)

namespace ska::simt {

// The running thread's indices (valid inside a launch).
struct ThreadIds {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const ThreadIds& ids();
// The running thread's lane: its index in the block (x fastest, then y, then z) modulo 32.
int lane();

void syncthreads();

// Every lane's `bytes` bytes of the current warp-wide operation: each lane passes its own and gets
// the 32 lanes' values side by side (lane l's at l * bytes). Valid until the lane's next exchange
// but one. All 32 lanes of the warp must take part.
const unsigned char* exchange(const void* mine, size_t bytes);

template <typename T>
T shuffle(T v, int from) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  const unsigned char* all = exchange(&v, sizeof(T));
  T out;
  std::memcpy(&out, all + (from & 31) * sizeof(T), sizeof(T));
  return out;
}

// mma.sync.m16n8k16 with f32 accumulators: bf16 (kBf16) or f16 inputs in the PTX fragment layout.
void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16);
// ldmatrix.m8n8.x{count}[.trans].shared.b16 from the row address this lane gives.
void ldmatrix(uint32_t* regs, int count, bool trans, const void* row);

// cp.async: a copy of `bytes` (4, 8 or 16) from global to shared memory, landing at a wait.
void async_copy(void* shared, const void* global, int bytes);
void async_commit();
void async_wait(int pending);  // cp.async.wait_group pending
void async_wait_all();         // cp.async.wait_all

// Runs `body` as every thread of every block of a grid, block after block.
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);

// The kernel file's dynamic shared memory (its `extern __shared__ smem[]`, at least 227 KiB),
// registered by its host build: each block poisons the launch's bytes of it, and the ldmatrix
// and cp.async addresses must lie in them.
void register_shared(unsigned char* base, size_t bytes);
// The same for a thread_local buffer named by `instance` on the thread that runs the launches
// (the emulated device's, tests/emu): registered there before its first launch.
void register_shared_of(unsigned char* (*instance)(), size_t bytes);

// Runs a launch (`work`: its run_grid) ordered on `stream`: at once on this thread, or where a
// submitter is set (the emulated device's runtime, tests/emu), as it orders it: on the device's
// thread, or recorded into the CUDA Graph being captured on the stream. Kernel launches
// (launch_kernel, attn::launch) go through it.
using Submitter = void (*)(cudaStream_t stream, std::function<void()> work);
void set_submitter(Submitter submitter);
void submit(cudaStream_t stream, std::function<void()> work);

// The order a block's threads run in between barriers: first to last (the default), last to
// first, shuffled by `seed`, or warp by warp from the last (kWarpsAhead: each warp runs until
// every lane of it waits at a barrier or has ended, through its warp-wide operations, before the
// next warp starts; so a warp that writes shared memory again after a warp-wide operation does
// it before an earlier warp has read what it wrote the first time).
enum class Schedule { kForward, kReverse, kShuffled, kWarpsAhead };
void set_schedule(Schedule s, uint64_t seed = 0);

// What resident_blocks answers (a persistent kernel's grid): default 3.
void set_resident_blocks(int64_t n);
int64_t resident_blocks();

// ldmatrix's 8 x 8 matrices since the process started (counted once a warp) and the
// shared-memory wavefronts they took: one a matrix when its 8 rows of 16 bytes fall in 8
// different groups of 4 banks, one more for each further row in a group (rows at the same address
// are read once).
struct Counts {
  int64_t ldmatrix_matrices = 0, ldmatrix_wavefronts = 0;
};
Counts counts();

}  // namespace ska::simt

#define threadIdx (::ska::simt::ids().thread)
#define blockIdx (::ska::simt::ids().block)
#define blockDim (::ska::simt::ids().block_dim)
#define gridDim (::ska::simt::ids().grid_dim)

inline void __syncthreads() { ::ska::simt::syncthreads(); }
// The warp's lanes meet: a warp-wide operation of no bytes (every lane must take part, as a full
// mask asks; what each wrote before is seen by all after).
inline void __syncwarp(unsigned = 0xffffffffu) {
  const unsigned char none = 0;
  ::ska::simt::exchange(&none, 0);
}
template <typename T>
T __shfl_sync(unsigned, T v, int from, int = 32) {
  return ::ska::simt::shuffle(v, from);
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
  return ::ska::simt::shuffle(v, ::ska::simt::lane() ^ mask);
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
  const int from = ::ska::simt::lane() + static_cast<int>(delta);
  const T theirs = ::ska::simt::shuffle(v, from & 31);
  return from < 32 ? theirs : v;  // lanes past the end keep their own value
}
// The round-to-nearest intrinsics: one IEEE operation each on the host too (x86-64 without FMA
// contraction; __fmaf_rn is std::fma).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
// CUDA's integer min and max (device functions; float arguments have fminf and fmaxf).
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

// Read-only loads and atomic adds: one thread of one block runs at a time, so a plain load and
// a read-modify-write rounded once as the device's are exact stand-ins.
template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
T atomicAdd(T* p, std::common_type_t<T> v) {  // the value's type follows the pointer's
  const T old = *p;
  *p = old + v;
  return old;
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  const __nv_bfloat16 old = *p;
  *p = __float2bfloat16(__bfloat162float(old) + __bfloat162float(v));
  return old;
}
inline __half atomicAdd(__half* p, __half v) {
  const __half old = *p;
  *p = __float2half(__half2float(old) + __half2float(v));
  return old;
}

#include "tests/simt/wmma.h"  // nvcuda::wmma, which the toolkit declares for nvcc only
