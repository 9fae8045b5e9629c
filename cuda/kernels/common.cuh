// Helpers shared by the CUDA kernels: dtype dispatch (f32, bf16, f16; f32 math), launch sizes,
// strided indexing of views up to 8 dims, and block/warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/kernel_types.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {

// Element <-> float conversion for the compute types.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(double v) { return static_cast<float>(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ double from_float<double>(float v) { return v; }

// Calls f(T{}) with T the CUDA element type of a floating compute dtype.
template <typename F>
void dispatch_floating(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    case DType::kF16: f(__half{}); return;
    default:
      SKA_FAIL(DTypeError, "cuda kernel '", kernel, "' supports f32, bf16 and f16, got ",
               dtype_name(dt));
  }
}

// The data of an optional tensor, or null when it is undefined.
template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <typename T>
T* mutable_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Adds the row lanes' sums of a block of kCols x kLanes threads in lane order: on return thread
// (tx, 0) holds its a and b plus those of threads (tx, 1), ..., (tx, kLanes - 1), added in that
// order; the other threads keep their own. Every thread of the block must call it.
template <int kCols, int kLanes>
__device__ __forceinline__ void add_row_lanes(float& a, float& b) {
  __shared__ float sa[kLanes][kCols + 1];
  __shared__ float sb[kLanes][kCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  sa[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0) {
    for (int i = 1; i < kLanes; ++i) {
      a += sa[i][tx];
      b += sb[i][tx];
    }
  }
}

// Two column sums of a block of rows, deterministic (no atomics): thread (tx, ty) of a block of
// kCols x kLanes threads holds its sums a and b of column c (over rows ty, ty + kLanes, ...); the
// block adds its row lanes in order and writes one partial per column for its chunk of rows
// (blockIdx.y) into part_a / part_b [chunks, cols] (either null: not wanted). Every thread of the
// block must call it.
template <int kCols, int kLanes>
__device__ __forceinline__ void store_column_partials(float a, float b, int64_t c, int64_t cols,
                                                      float* part_a, float* part_b) {
  add_row_lanes<kCols, kLanes>(a, b);
  if (threadIdx.y == 0 && c < cols) {
    const int64_t at = static_cast<int64_t>(blockIdx.y) * cols + c;
    if (part_a) part_a[at] = a;
    if (part_b) part_b[at] = b;
  }
}

// The second stage: each column's partials [chunks, cols] added in a fixed order, rounded to P
// (out_a / out_b null: not wanted). A block of kSumCols x kSumLanes threads per 32 columns: lane
// y of column c adds chunks y, y + kSumLanes, ... in order, then the lanes' sums are added in lane
// order (add_row_lanes). Of up to 1024 chunks that is 32 loads a thread, where one thread a column
// walked them all (latency-bound, on a block or two). Launched by launch_column_sums.
constexpr int kSumCols = 32, kSumLanes = 32;
template <typename P>
__global__ void __launch_bounds__(kSumCols* kSumLanes)
    sum_column_partials(const float* part_a, const float* part_b, int64_t chunks, int64_t cols,
                        P* out_a, P* out_b) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  float a = 0.0f, b = 0.0f;
  if (c < cols) {
    for (int64_t k = threadIdx.y; k < chunks; k += kSumLanes) {
      if (out_a) a += part_a[k * cols + c];
      if (out_b) b += part_b[k * cols + c];
    }
  }
  add_row_lanes<kSumCols, kSumLanes>(a, b);
  if (threadIdx.y == 0 && c < cols) {
    if (out_a) out_a[c] = from_float<P>(a);
    if (out_b) out_b[c] = from_float<P>(b);
  }
}

// A dropout drawn inside a fused kernel (add_layer_norm's and scaled_residual's branch dropout):
// element i of the flat tensor is kept where the uniform of Philox counter offset (+ *offset_base
// where set: a captured step's counter) + i / 4, word i % 4, is below keep (dropout_forward's
// draws), and bit i % 8 of bits[i / 8] records it. bits null: no dropout.
struct BranchDrop {
  uint8_t* bits = nullptr;
  const int64_t* offset_base = nullptr;
  uint64_t seed = 0, offset = 0;
  float keep = 1.0f, scale = 1.0f;  // scale as the host passes it; rounded to the branch's dtype
};

// The kernels' form of a dropout draw (no dropout where it is not active).
inline BranchDrop kernel_drop(const DropoutDraw& d) {
  BranchDrop drop;
  if (!d.active()) return drop;
  drop.bits = static_cast<uint8_t*>(d.bits.data_ptr());
  drop.offset_base = data_or_null<int64_t>(d.offset_base);
  drop.seed = d.seed;
  drop.offset = d.offset;
  drop.keep = static_cast<float>(d.keep_prob);
  drop.scale = static_cast<float>(d.scale);
  return drop;
}

// Device index of a CUDA tensor, checked.
inline int device_index(const Tensor& t) {
  SKA_CHECK(t.device().is_cuda(), DeviceError, "cuda kernel called with a tensor on ", t.device());
  return t.device().index;
}

constexpr int kMaxDims = 8;

// Maps a linear index of a view's logical shape to the element offset in its storage.
struct StridedIndexer {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];

  __host__ __device__ __forceinline__ int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

// The indexer of a tensor view; throws ShapeError beyond kMaxDims dims.
StridedIndexer make_indexer(const Tensor& t);

// Whether the elementwise kernels' fast paths are on (set_cuda_elementwise_fast_paths,
// `train.elementwise`): other kernels with a vectorised form take it only then.
bool elementwise_fast_paths();

// Grid size for n elements at `threads` per block, capped for grid-stride loops.
inline unsigned int grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

#if defined(__CUDACC__) || defined(SKA_SIMT)
// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) and checks the launch; in the
// host build of tests/simt (SKA_SIMT) runs it there (simt::submit: at once, or as the emulated
// device of tests/emu orders it).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args... args) {
#if defined(SKA_SIMT)
  simt::submit(stream,
               [=] { simt::run_grid(grid, block, shared_bytes, [&] { kernel(args...); }); });
#else
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  SKA_CUDA_CHECK_LAUNCH();
#endif
}

// out_a / out_b [cols] = the sums over the chunks of part_a / part_b [chunks, cols] (either pair
// null: not wanted), by sum_column_partials on `stream`.
template <typename P>
void launch_column_sums(const float* part_a, const float* part_b, int64_t chunks, int64_t cols,
                        P* out_a, P* out_b, cudaStream_t stream) {
  const int64_t tiles = (cols + kSumCols - 1) / kSumCols;
  SKA_CHECK(tiles <= INT32_MAX, ShapeError, "column sums: too many columns (", cols, ")");
  launch_kernel(sum_column_partials<P>, dim3(static_cast<unsigned int>(tiles)),
                dim3(kSumCols, kSumLanes), 0, stream, part_a, part_b, chunks, cols, out_a, out_b);
}
#endif

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace ska::cuda
