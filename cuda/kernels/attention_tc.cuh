// Fused attention on CUDA: the operand structs shared by the scalar kernels (attention.cu) and the
// tensor-core kernels (WMMA: attention_tc.cu; mma.sync: attention_mma.cu), the shared-memory
// tiles of the latter two, and their entry points.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

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
  bool diagonal;              // AttentionMask::kDiagonal: query i and key i excluded
  bool async_loads;  // load_tile's copies asynchronous and the mma.sync kernels' ldmatrix fragment
                     // loads (set_cuda_attention_async_loads)
  // The mma.sync kernels read the bias of pairs (i, j), (i, j + 1), j even, by one 32-bit load
  // (with async_loads, where pairs_aligned holds for the bias and, for an odd nk, the element
  // after its last one is in memory).
  bool bias_pairs;
};

// Whether the launch's mask excludes pair (i, j): its logit is -inf, its gradient +0.
template <typename T>
__device__ __forceinline__ bool excluded(const Inputs<T>& in, int i, int j) {
  return in.diagonal && i == j;
}

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

// A finished row of the forward pass: its softmax sum and max give the output's factor `inv`
// and the row's log-sum-exp. A row whose every logit is -inf (or NaN) gives NaN, as softmax
// does; without keys (nk == 0) the output is zeros and lse -inf, as the CPU twin.
struct RowEnd {
  float inv, lse;
};
__device__ __forceinline__ RowEnd row_end(float sum, float max, int nk) {
  if (sum > 0.0f) return {1.0f / sum, max + logf(sum)};
  if (nk == 0) return {0.0f, -INFINITY};
  return {NAN, NAN};
}

template <typename T>
struct ForwardArgs {
  Inputs<T> in;
  T* out;
  View ov;
  float* lse;  // [groups * nq]
  int tiles;   // query tiles per leading index (set by the launcher)
  // The leading indices in all: a persistent kernel's blocks walk them (set by the launcher).
  int64_t groups;
};

template <typename T>
struct BackwardArgs {
  Inputs<T> in;
  const T* go;
  View gov;
  const float* lse;    // [groups * nq]
  const float* delta;  // [groups * nq]: D = rowsum(dO * O)
  T* gq;               // [groups, nq, d] as gqv lays it out (column stride 1)
  T* gk;               // [groups, nk, d] as gkv lays it out (column stride 1)
  T* gv;               // [groups, nk, dv] as gvv lays it out (column stride 1)
  View gqv, gkv, gvv;
  T* gb;  // [groups, nq, nk] as gbv lays it out; null: not wanted
  View gbv;
  int tiles;  // query tiles (dQ kernel) or key tiles (dK/dV kernel) per leading index
  // The leading indices in all: a persistent kernel's blocks walk them (set by the launcher).
  int64_t groups;
  // The mma.sync kernels store grad_bias of pairs (i, j), (i, j + 1), j even, by one 32-bit
  // store (as Inputs::bias_pairs, for gb).
  bool grad_bias_pairs;
};

// Whether every pair (i, j), (i, j + 1) with j even of a 16-bit [lead..., n, m] view `v` at
// `data` lies in one aligned 4-byte word: adjacent columns, and the base, the rows and every
// leading index an even number of elements from an aligned address.
inline bool pairs_aligned(const void* data, const View& v) {
  bool even = reinterpret_cast<uintptr_t>(data) % 4 == 0 && v.col == 1 && v.row % 2 == 0;
  for (int d = 0; d < v.lead.ndim; ++d) even = even && v.lead.strides[d] % 2 == 0;
  return even;
}

// The bias of pair (i, j) of one leading index (`bias` at its offset), as f32.
template <typename T>
__device__ __forceinline__ float bias_at(const T* bias, const View& bv, int i, int j) {
  return to_float(bias[i * bv.row + j * bv.col]);
}

// grad_bias of leading index g (gb at its offset), or null when not wanted.
template <typename T>
__device__ __forceinline__ T* grad_bias_of(const BackwardArgs<T>& a, int64_t g) {
  return a.gb ? a.gb + a.gbv.lead.offset(g) : nullptr;
}

// Stores grad_bias of pair (i, j) (gb from grad_bias_of): bscale * dz (dz = +0 at the pairs the
// mask excludes, as the CPU twin).
template <typename T>
__device__ __forceinline__ void store_grad_bias(T* gb, const BackwardArgs<T>& a, int i, int j,
                                                float bscale, float dz) {
  gb[i * a.gbv.row + j * a.gbv.col] = from_float<T>(bscale * dz);
}

// Calls f(std::integral_constant<int, kHead>{}) with kHead the widest head dim the kernels are
// instantiated for that covers both d and dv: 32, 64 or 128.
template <typename F>
void dispatch_head_dim(int d, int dv, F&& f) {
  const int widest = d > dv ? d : dv;
  if (widest <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (widest <= 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    f(std::integral_constant<int, 128>{});
  }
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
constexpr size_t kDefaultSmemBytes = 48 * 1024;
// Lets `kernel` take `bytes` of dynamic shared memory (an opt-in above the default).
inline void allow_smem(const void* kernel, size_t bytes) {
  if (bytes > kDefaultSmemBytes) {
    SKA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
}
template <typename Args>
void launch(void (*kernel)(Args), dim3 grid, int warps, size_t bytes, cudaStream_t stream,
            const Args& args) {
#if defined(SKA_SIMT)  // the kernel's own code run on the host (tests/simt, tests/emu)
  simt::submit(stream,
               [=] { simt::run_grid(grid, dim3(warps * 32), bytes, [&] { kernel(args); }); });
#else
  allow_smem(reinterpret_cast<const void*>(kernel), bytes);
  kernel<<<grid, warps * 32, bytes, stream>>>(args);
  SKA_CUDA_CHECK_LAUNCH();
#endif
}

// Blocks of `kernel` (`warps` warps, `bytes` of dynamic shared memory) resident on the current
// device at once: the occupancy calculator's blocks per SM times the SMs, at least one (cached
// per kernel, size and device). The grid of a persistent kernel.
int64_t resident_blocks(const void* kernel, int warps, size_t bytes);

// --- Shared-memory tiles of the tensor-core kernels (WMMA and mma.sync) ---

// Row strides of the shared tiles, in elements. Rows are padded by 16 bytes: WMMA needs strides
// that are multiples of 16 bytes, and the padding spreads a fragment's rows over the banks.
__host__ __device__ constexpr int ld16(int cols) { return cols + 8; }  // bf16 / f16 tiles
__host__ __device__ constexpr int ld32(int cols) { return cols + 4; }  // f32 tiles

// Carves dynamic shared memory into 128-byte aligned pieces (WMMA pointers need 32 bytes); the
// host sizes a launch and the kernel finds its tiles with the same calls.
struct Carver {
  int bytes = 0;
  __host__ __device__ int take(int n) {
    const int at = (bytes + 127) & ~127;
    bytes = at + n;
    return at;
  }
};

// Copies 16 bytes from global to shared memory: on sm_80 and newer asynchronously (cp.async,
// bypassing registers and L1), so that a thread's copies are all in flight at once; then
// wait_copies() waits for them. Before sm_80, a load and a store.
__device__ __forceinline__ void copy16(void* smem, const void* gmem) {
#if defined(SKA_SIMT)
  simt::async_copy(smem, gmem, 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
// Copies 4 bytes (an f32) from global to shared memory the same way: cp.async.ca (its smallest
// size) on sm_80 and newer, a load and a store before.
__device__ __forceinline__ void copy4(void* smem, const void* gmem) {
#if defined(SKA_SIMT)
  simt::async_copy(smem, gmem, 4);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(gmem) : "memory");
#else
  *static_cast<uint32_t*>(smem) = *static_cast<const uint32_t*>(gmem);
#endif
}
__device__ __forceinline__ void wait_copies() {
#if defined(SKA_SIMT)
  simt::async_wait_all();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// Closes the thread's copies issued since the last commit into a group, which
// wait_copies_pending counts (sm_80 and newer; before, the copies are done on return).
__device__ __forceinline__ void commit_copies() {
#if defined(SKA_SIMT)
  simt::async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most kPending of the thread's latest committed groups are still in flight: with
// 1, a tile staged before the one just committed has landed (double buffering).
template <int kPending>
__device__ __forceinline__ void wait_copies_pending() {
#if defined(SKA_SIMT)
  simt::async_wait(kPending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Rows [row0, row0 + rows) of one leading index's operand (`base` at its offset, `v` its view),
// `cols` columns (a multiple of 16), as dense rows of a shared tile with row stride ld; zero past
// row n. The whole block loads: 16-byte vectors where the rows are dense and 16-byte aligned,
// element by element otherwise (any strides). With `async` (Inputs::async_loads, the default)
// the vectors are asynchronous copies, all issued before the thread waits for them: a thread's
// share of a 64 x 64 tile is four 16-byte vectors, and the load-then-store loop (`async` false,
// kept to compare) pays the global memory latency once per vector. With `wait` (the default)
// the thread's part of the tile is written on return, and the caller's barrier publishes the
// tile; without, its copies may still be in flight, and the next load_tile that waits waits for
// them too (tiles loaded together, one latency).
template <typename T>
__device__ void load_tile(T* tile, int ld, const T* base, const View& v, int row0, int rows, int n,
                          int cols, bool async, bool wait = true) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectors =
      v.col == 1 && v.row % kVec == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  if (vectors) {
    const int per_row = cols / kVec;
    for (int e = threadIdx.x; e < rows * per_row; e += blockDim.x) {
      const int r = e / per_row, c = e % per_row * kVec, i = row0 + r;
      T* to = tile + r * ld + c;
      if (i >= n) {
        *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
      } else if (async) {
        copy16(to, base + i * v.row + c);
      } else {
        *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(base + i * v.row + c);
      }
    }
  } else {
    const T zero = from_float<T>(0.0f);
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int r = e / cols, c = e % cols, i = row0 + r;
      tile[r * ld + c] = i < n ? base[i * v.row + c * v.col] : zero;
    }
  }
  if (wait) wait_copies();  // this tile's copies and those of earlier calls without `wait`
}

// The scalar kernels of attention.cu (f32 FMAs; any floating T, any head dims up to 128): what
// f32 problems and those the tensor-core kernels do not take run on. The forward pass (out and
// lse) of `groups` leading indices.
template <typename T>
void scalar_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream);
// delta[r] = D = rowsum(dO * O) of the `rows` = groups * nq rows of out (view ov) and dO (view
// gov), dv columns each: one warp a row, or with `fast` (elementwise_fast_paths) 16-byte vectors
// where both operands' rows are dense and 16-byte aligned. Every backward pass needs it first.
template <typename T>
void launch_delta(const T* out, const View& ov, const T* go, const View& gov, float* delta,
                  int64_t rows, int nq, int dv, bool fast, cudaStream_t stream);
// dK, dV (a kernel) and dQ, grad_bias (another) by the scalar kernels, from a.delta already
// computed on `stream`. Writes every element of the gradients.
template <typename T>
void scalar_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream);

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

// Whether the tensor-core kernels fill their tiles by cp.async and read fragments by ldmatrix
// (set_cuda_attention_async_loads, train.attention_loads): the attention kernels and CSKA's
// convolutional logits (conv_logits.cu) read it at each launch.
bool async_loads_enabled();

// The mma.sync kernels of attention_mma.cu: the problems tc_supported accepts, with the softmax
// on the accumulators in registers. Taken instead of tc_forward / tc_backward while
// set_cuda_attention_mma is on (mma_enabled).
bool mma_enabled();
template <typename T>
void mma_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream);
template <typename T>
void mma_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream);

}  // namespace ska::cuda::attn
