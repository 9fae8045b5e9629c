// Fused attention on CUDA: the operand structs shared by the scalar kernels (attention.cu) and the
// tensor-core kernels (attention_tc.cu), and the entry points of the latter.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace ska::cuda::attn {

// A [L..., n, cols] operand: element (g, i, c), g the row-major index over the leading dims L,
// lies at lead.offset(g) + i * row + c * col.
struct View {
  StridedIndexer lead;
  int64_t row;
  int64_t col;
};

template <typename T>
struct Inputs {
  const T* q;
  const T* k;
  const T* v;
  const T* bias;  // null: no bias
  View qv, kv, vv, bv;
  int nq, nk, d, dv;
  float scale;
  const float* scale_factor;  // null, or one f32 on the device that multiplies scale
  const float* bias_factor;   // null, or one f32 on the device that multiplies the bias
};

// The logits' scale of a launch: scale times the device-side factor when there is one (read
// once per thread at the start of a kernel).
template <typename T>
__device__ __forceinline__ float effective_scale(const Inputs<T>& in) {
  return in.scale_factor ? in.scale * *in.scale_factor : in.scale;
}
// The bias's multiplier of a launch (1 without a factor).
template <typename T>
__device__ __forceinline__ float bias_scale(const Inputs<T>& in) {
  return in.bias_factor ? *in.bias_factor : 1.0f;
}

template <typename T>
struct ForwardArgs {
  Inputs<T> in;
  T* out;
  View ov;
  float* lse;  // [groups * nq]
  int tiles;   // query tiles per leading index (set by the launcher)
};

template <typename T>
struct BackwardArgs {
  Inputs<T> in;
  const T* go;
  View gov;
  const float* lse;    // [groups * nq]
  const float* delta;  // [groups * nq]: D = rowsum(dO * O)
  T* gq;               // contiguous [groups, nq, d]
  T* gk;               // contiguous [groups, nk, d]
  T* gv;               // contiguous [groups, nk, dv]
  T* gb;               // contiguous [groups, nq, nk]; null: not wanted
  int tiles;           // query tiles (dQ kernel) or key tiles (dK/dV kernel) per leading index
};

// The bias of pair (i, j) of one leading index (`bias` at its offset), as f32.
template <typename T>
__device__ __forceinline__ float bias_at(const T* bias, const View& bv, int i, int j) {
  return to_float(bias[i * bv.row + j * bv.col]);
}

// Blocks for `groups` leading indices of `tiles` tiles each, checked against the grid limit.
inline unsigned int grid_of(const char* kernel, int64_t groups, int64_t tiles) {
  const int64_t blocks = groups * tiles;
  SKA_CHECK(blocks <= INT_MAX, ShapeError, kernel, ": ", groups, " leading indices of ", tiles,
            " tiles: too many blocks");
  return static_cast<unsigned int>(blocks);
}

// Launches `kernel` with `bytes` of dynamic shared memory, opting in to more than the default
// 48 KiB where needed (sm_80..sm_90 allow at least 99 KiB), and checks the launch.
template <typename Args>
void launch(void (*kernel)(Args), unsigned int grid, int warps, size_t bytes, cudaStream_t stream,
            const Args& args) {
  constexpr size_t kDefaultSmemBytes = 48 * 1024;
  if (bytes > kDefaultSmemBytes) {
    SKA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
  kernel<<<grid, warps * 32, bytes, stream>>>(args);
  SKA_CUDA_CHECK_LAUNCH();
}

// Whether the tensor-core kernels take a problem: bf16 or f16, d and dv multiples of 16 up to
// 128, a device of compute capability 8.0 or newer, and the process-wide switch on
// (set_cuda_attention_tensor_cores). Otherwise the scalar kernels run.
bool tc_supported(DType dtype, int d, int dv, int device);

// The forward pass (out and lse) of `groups` leading indices on the tensor cores; T is
// __nv_bfloat16 or __half, the problem one that tc_supported accepts.
template <typename T>
void tc_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream);
// dK, dV (a kernel) and dQ, grad_bias (another) on the tensor cores, from a.delta already
// computed on `stream`. Writes every element of the gradients, as the scalar kernels.
template <typename T>
void tc_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream);

}  // namespace ska::cuda::attn
