// CUDA kernels: sum / mean / max / min over chosen dims (rows of the trailing dims, or columns
// when the leading dims are reduced), argmax along a dim, top-k along the last dim. Twins of
// backend/cpu/reduce.cpp and topk.cpp; values are accumulated in f32.
//
// The row and column reductions launch on raw operands (launch_reduce_rows, launch_reduce_cols,
// with their partials' sizes from row_partial_floats and plan_columns), so that tests/simt runs
// this file's own code on the host; the tensor entry points below are left out there.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/elementwise.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;     // warp-per-row kernels: blockDim (32, 8)
constexpr int kRowThreads = 512;      // block-per-row kernels
constexpr int64_t kWarpRowMax = 1024;  // rows up to this length go one warp each
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;  // the row kernels' grids: beyond, they stride
constexpr unsigned kFullMask = 0xffffffffu;

template <ReduceOp OP>
__device__ __forceinline__ float identity() {
  if constexpr (OP == ReduceOp::kMax) return -INFINITY;
  if constexpr (OP == ReduceOp::kMin) return INFINITY;
  return 0.0f;
}

// NaN propagates through max / min, as in the CPU twin.
template <ReduceOp OP>
__device__ __forceinline__ float combine(float a, float b) {
  if constexpr (OP == ReduceOp::kMax || OP == ReduceOp::kMin) {
    if (a != a) return a;
    if (b != b) return b;
    if constexpr (OP == ReduceOp::kMax) return a > b ? a : b;
    return a < b ? a : b;
  }
  return a + b;
}

template <ReduceOp OP>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) v = combine<OP>(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// The value written for a reduced row: the mean divides by the number of reduced elements.
template <ReduceOp OP, typename Out>
__device__ __forceinline__ Out finish(float acc, bool final_pass, float count) {
  if (final_pass && OP == ReduceOp::kMean) acc /= count;
  return from_float<Out>(acc);
}

// One warp per row of `len` contiguous elements.
template <ReduceOp OP, typename In, typename Out>
__global__ void reduce_rows_warp(const In* __restrict__ x, Out* __restrict__ out, int64_t rows,
                                 int64_t len, bool final_pass, float count) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const In* p = x + row * len;
    float acc = identity<OP>();
    for (int64_t j = threadIdx.x; j < len; j += 32) acc = combine<OP>(acc, to_float(p[j]));
    acc = warp_reduce<OP>(acc);
    if (threadIdx.x == 0) out[row] = finish<OP, Out>(acc, final_pass, count);
  }
}

// One block per (row, chunk): rows of `len` contiguous elements split into `chunks` pieces, each
// reduced into out[row * chunks + chunk] (unfinished partials when chunks > 1).
template <ReduceOp OP, typename In, typename Out>
__global__ void reduce_rows_block(const In* __restrict__ x, Out* __restrict__ out, int64_t rows,
                                  int64_t len, int64_t chunks, bool final_pass, float count) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t chunk_len = (len + chunks - 1) / chunks;
  for (int64_t b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const int64_t row = b / chunks, chunk = b % chunks;
    const In* p = x + row * len;
    const int64_t end = std::min(len, (chunk + 1) * chunk_len);
    float acc = identity<OP>();
    for (int64_t j = chunk * chunk_len + threadIdx.x; j < end; j += blockDim.x) {
      acc = combine<OP>(acc, to_float(p[j]));
    }
    acc = warp_reduce<OP>(acc);
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      float v = lane < warps ? partial[lane] : identity<OP>();
      v = warp_reduce<OP>(v);
      if (lane == 0) out[b] = finish<OP, Out>(v, final_pass, count);
    }
    __syncthreads();  // partial[] is reused by the next row
  }
}

// How many pieces reduce_rows splits each of `rows` rows of `len` into on a GPU of `sms`
// multiprocessors: few long rows go over several blocks, then their partials are reduced.
int64_t row_chunks(int64_t rows, int64_t len, int64_t sms) {
  if (len <= kWarpRowMax || rows >= 2 * sms || len < 16 * kRowThreads) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(len / (8 * kRowThreads), 4 * sms / rows));
}

// The f32 partials launch_reduce_rows needs (0: none).
int64_t row_partial_floats(int64_t rows, int64_t len, int64_t sms) {
  const int64_t chunks = row_chunks(rows, len, sms);
  return chunks > 1 ? rows * chunks : 0;
}

// Reduces `rows` contiguous rows of `len` elements of x into out (contiguous, `rows` elements),
// with partials of row_partial_floats(rows, len, sms) floats, on grids of at most `max_blocks`
// blocks (the kernels stride over the rest; tests/simt asks for small grids to walk that).
template <ReduceOp OP, typename T, typename Out>
void launch_reduce_rows(const T* x, Out* out, int64_t rows, int64_t len, int64_t sms,
                        float* partials, cudaStream_t stream, int64_t max_blocks = kMaxRowBlocks) {
  const float count = static_cast<float>(len);
  const dim3 warp_block(32, kWarpsPerBlock);
  const auto warp_grid = [max_blocks](int64_t r) {
    return dim3(static_cast<unsigned>(
        std::min<int64_t>((r + kWarpsPerBlock - 1) / kWarpsPerBlock, max_blocks)));
  };
  if (len <= kWarpRowMax) {
    launch_kernel(reduce_rows_warp<OP, T, Out>, warp_grid(rows), warp_block, 0, stream, x, out,
                  rows, len, true, count);
    return;
  }
  const int64_t chunks = row_chunks(rows, len, sms);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(rows * chunks, max_blocks)));
  if (chunks == 1) {
    launch_kernel(reduce_rows_block<OP, T, Out>, grid, dim3(kRowThreads), 0, stream, x, out, rows,
                  len, int64_t{1}, true, count);
    return;
  }
  launch_kernel(reduce_rows_block<OP, T, float>, grid, dim3(kRowThreads), 0, stream, x, partials,
                rows, len, chunks, false, count);
  launch_kernel(reduce_rows_warp<OP, float, Out>, warp_grid(rows), warp_block, 0, stream,
                static_cast<const float*>(partials), out, rows, chunks, true, count);
}

// Column reductions of a contiguous [rows, cols] x (the reduced dims lead: a bias gradient sums
// [B * N, C] over its rows), with no transposed copy of x. A block of kColThreads threads takes a
// tile of columns and a chunk of rows: thread (tx, ty) loads kVec neighbouring columns at once
// (16 bytes where the columns and x allow it) from rows ty, ty + lanes, ... of the chunk, so a
// warp reads whole rows' segments and many loads are in flight per SM; the `lanes` row lanes are
// then combined pairwise in a fixed tree (lane y takes lane y + s for s = lanes / 2, ..., 1).
// out is [chunks, cols]: f32 partials when chunks > 1, combined by a second pass of the same
// kernel over them. The same bits on every run on a GPU of the same size.
constexpr int kColThreads = 256;      // first pass
constexpr int kColSumThreads = 1024;  // second pass, over the partials
constexpr int kColBlocksPerSm = 4;
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxColChunks = 1024;

// How one pass of reduce_cols_kernel runs over [rows, cols].
struct ColumnPass {
  int vec = 1;           // columns a thread loads at once: 16 bytes' worth, or 1
  int col_threads = 32;  // blockDim.x, a power of two: the tile has col_threads * vec columns
  int lanes = 8;         // blockDim.y (row lanes), a power of two
  int64_t tiles = 1, chunks = 1, chunk_rows = 0;

  size_t shared_bytes() const {
    return static_cast<size_t>(col_threads) * lanes * vec * sizeof(float);
  }
};

// A pass of `threads` threads a block over [rows, cols] of elem_bytes elements, at most
// `max_chunks` chunks of rows; `aligned`: x lies at a 16-byte boundary.
ColumnPass column_pass(int64_t rows, int64_t cols, int elem_bytes, bool aligned, int threads,
                       int64_t max_chunks) {
  ColumnPass p;
  const int wide = 16 / elem_bytes;
  p.vec = aligned && cols % wide == 0 ? wide : 1;
  const int64_t vectors = cols / p.vec + (cols % p.vec != 0);
  p.col_threads = 1;
  while (p.col_threads < 32 && p.col_threads < vectors) p.col_threads *= 2;
  p.lanes = threads / p.col_threads;
  const int64_t tile_cols = static_cast<int64_t>(p.col_threads) * p.vec;
  p.tiles = (cols + tile_cols - 1) / tile_cols;
  p.chunks = std::max<int64_t>(1, std::min(max_chunks, rows));
  p.chunk_rows = (rows + p.chunks - 1) / p.chunks;
  p.chunks = (rows + p.chunk_rows - 1) / p.chunk_rows;
  return p;
}

// A column reduction: its first pass over x and, when that leaves partials, the second over them.
struct ColumnPlan {
  ColumnPass first, second;
  int64_t partial_floats = 0;  // [first.chunks, cols] when first.chunks > 1, else 0
};

// The plan for [rows, cols] of elem_bytes elements at x_aligned (16-byte boundary) on a GPU of
// `sms` multiprocessors: enough chunks of rows for kColBlocksPerSm blocks an SM, of at least
// kMinChunkRows rows (partials at a 16-byte boundary are assumed, as workspaces are).
ColumnPlan plan_columns(int64_t rows, int64_t cols, int elem_bytes, bool x_aligned, int64_t sms) {
  ColumnPlan plan;
  plan.first = column_pass(rows, cols, elem_bytes, x_aligned, kColThreads, 1);
  const int64_t wanted =
      std::max<int64_t>(1, (kColBlocksPerSm * sms + plan.first.tiles - 1) / plan.first.tiles);
  const int64_t most = std::max<int64_t>(1, std::min(kMaxColChunks, rows / kMinChunkRows));
  plan.first = column_pass(rows, cols, elem_bytes, x_aligned, kColThreads, std::min(wanted, most));
  if (plan.first.chunks > 1) {
    plan.partial_floats = plan.first.chunks * cols;
    plan.second = column_pass(plan.first.chunks, cols, sizeof(float), true, kColSumThreads, 1);
  }
  return plan;
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <ReduceOp OP, typename In, typename Out, int kVec>
__global__ void __launch_bounds__(kColSumThreads, 1)
    reduce_cols_kernel(const In* __restrict__ x, Out* __restrict__ out, int64_t rows, int64_t cols,
                       int64_t chunk_rows, bool final_pass, float count) {
  extern __shared__ float col_lanes[];  // [lanes][blockDim.x * kVec]
  const int tx = threadIdx.x, ty = threadIdx.y, lanes = blockDim.y;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + tx) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = std::min(rows, r0 + chunk_rows);
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = identity<OP>();
  if (c0 < cols) {  // with kVec > 1, cols is a multiple of kVec: the whole pack is inside
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += lanes) {
      const Pack<In, kVec> p = *reinterpret_cast<const Pack<In, kVec>*>(x + r * cols + c0);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = combine<OP>(acc[i], to_float(p.v[i]));
    }
  }
  const int width = blockDim.x * kVec;
  float* mine = col_lanes + ty * width + tx * kVec;
#pragma unroll
  for (int i = 0; i < kVec; ++i) mine[i] = acc[i];
  for (int s = lanes / 2; s > 0; s /= 2) {
    __syncthreads();
    if (ty < s) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) mine[i] = acc[i] = combine<OP>(acc[i], mine[s * width + i]);
    }
  }
  if (ty == 0 && c0 < cols) {
    Out* o = out + static_cast<int64_t>(blockIdx.y) * cols + c0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = finish<OP, Out>(acc[i], final_pass, count);
  }
}

// One pass over [rows, cols] of x into out [pass.chunks, cols].
template <ReduceOp OP, typename In, typename Out>
void launch_column_pass(const ColumnPass& pass, const In* x, Out* out, int64_t rows, int64_t cols,
                        bool final_pass, float count, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(pass.tiles), static_cast<unsigned>(pass.chunks));
  const dim3 block(static_cast<unsigned>(pass.col_threads), static_cast<unsigned>(pass.lanes));
  constexpr int kWide = 16 / static_cast<int>(sizeof(In));
  const auto run = [&](auto kernel) {
    launch_kernel(kernel, grid, block, pass.shared_bytes(), stream, x, out, rows, cols,
                  pass.chunk_rows, final_pass, count);
  };
  if (pass.vec == kWide) {
    run(reduce_cols_kernel<OP, In, Out, kWide>);
  } else {
    run(reduce_cols_kernel<OP, In, Out, 1>);
  }
}

// Reduces the `rows` rows of a contiguous [rows, cols] x into out [cols] by `plan`
// (plan_columns), with partials of plan.partial_floats floats.
template <ReduceOp OP, typename T, typename Out>
void launch_reduce_cols(const T* x, Out* out, int64_t rows, int64_t cols, const ColumnPlan& plan,
                        float* partials, cudaStream_t stream) {
  const float count = static_cast<float>(rows);
  if (plan.first.chunks == 1) {
    launch_column_pass<OP>(plan.first, x, out, rows, cols, true, count, stream);
    return;
  }
  launch_column_pass<OP>(plan.first, x, partials, rows, cols, false, count, stream);
  launch_column_pass<OP>(plan.second, static_cast<const float*>(partials), out, plan.first.chunks,
                         cols, true, count, stream);
}

// Calls f(std::integral_constant<ReduceOp, op>{}).
template <typename F>
void visit_reduce_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum: return f(std::integral_constant<ReduceOp, ReduceOp::kSum>{});
    case ReduceOp::kMean: return f(std::integral_constant<ReduceOp, ReduceOp::kMean>{});
    case ReduceOp::kMax: return f(std::integral_constant<ReduceOp, ReduceOp::kMax>{});
    case ReduceOp::kMin: return f(std::integral_constant<ReduceOp, ReduceOp::kMin>{});
  }
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// x viewed with the reduced dims moved last, packed contiguous: [kept..., reduced...].
Tensor reduced_dims_last(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<char> is_reduced(static_cast<size_t>(x.dim()), 0);
  for (int64_t d : dims) is_reduced[static_cast<size_t>(d)] = 1;
  Shape shape, strides;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (is_reduced[static_cast<size_t>(d)] == pass) {
        shape.push_back(x.shape()[static_cast<size_t>(d)]);
        strides.push_back(x.strides()[static_cast<size_t>(d)]);
      }
    }
  }
  Tensor view = Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
  if (view.is_contiguous()) return view;
  Tensor packed = Tensor::empty(shape, x.dtype(), x.device());
  copy(view, packed);
  return packed;
}

// Better candidate for "first maximum": larger value, or equal value at a lower index.
// Index -1 marks "no candidate".
__device__ __forceinline__ bool better(float v, int64_t i, float best_v, int64_t best_i) {
  return i >= 0 && (best_i < 0 || v > best_v || (v == best_v && i < best_i));
}

__device__ __forceinline__ void warp_best(float& v, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, o);
    const int64_t oi = __shfl_xor_sync(kFullMask, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// One warp per output element. The CPU twin scans with `>`, so NaNs are never chosen, except that
// a NaN first element wins (nothing compares greater than it): reproduced here.
template <typename T>
__global__ void argmax_kernel(const T* __restrict__ x, StridedIndexer base, int64_t outs,
                              int64_t len, int64_t step, int64_t* __restrict__ out) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y; o < outs;
       o += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* p = x + base.offset(o);
    float best = 0.0f;
    int64_t best_i = -1;
    for (int64_t k = threadIdx.x; k < len; k += 32) {
      const float v = to_float(p[k * step]);
      if (v == v && (best_i < 0 || v > best)) {
        best = v;
        best_i = k;
      }
    }
    warp_best(best, best_i);
    if (threadIdx.x == 0) {
      const bool first_nan = len > 0 && !(to_float(p[0]) == to_float(p[0]));
      out[o] = (first_nan || best_i < 0) ? 0 : best_i;
    }
  }
}

// One block per row; k rounds, each picking the best element after the previous pick in the order
// (value descending, index ascending). O(k * len) per row: meant for small k.
template <typename T>
__global__ void topk_kernel(const T* __restrict__ x, int64_t rows, int64_t len, int64_t k,
                            T* __restrict__ values, int64_t* __restrict__ indices) {
  __shared__ float part_v[32];
  __shared__ int64_t part_i[32];
  __shared__ float pick_v;
  __shared__ int64_t pick_i;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * len;
    float prev_v = 0.0f;
    int64_t prev_i = -1;  // -1: nothing picked yet
    for (int64_t j = 0; j < k; ++j) {
      float best = 0.0f;
      int64_t best_i = -1;
      for (int64_t e = threadIdx.x; e < len; e += blockDim.x) {
        const float v = to_float(row[e]);
        const bool after_prev = prev_i < 0 || v < prev_v || (v == prev_v && e > prev_i);
        if (after_prev && better(v, e, best, best_i)) {
          best = v;
          best_i = e;
        }
      }
      warp_best(best, best_i);
      if (lane == 0) {
        part_v[warp] = best;
        part_i[warp] = best_i;
      }
      __syncthreads();
      if (warp == 0) {
        float v = lane < warps ? part_v[lane] : 0.0f;
        int64_t i = lane < warps ? part_i[lane] : -1;
        warp_best(v, i);
        if (lane == 0) {
          pick_v = v;
          pick_i = i;
          values[r * k + j] = i >= 0 ? row[i] : from_float<T>(NAN);  // -1 only with NaN inputs
          indices[r * k + j] = i >= 0 ? i : 0;
        }
      }
      __syncthreads();
      prev_v = pick_v;
      prev_i = pick_i;
      if (prev_i < 0) prev_i = len;  // nothing left to pick
      __syncthreads();  // pick_* is rewritten in the next round
    }
  }
}

constexpr int kDotThreads = 256;
constexpr int64_t kDotChunk = 16 * kDotThreads;  // elements per block
constexpr int64_t kDotMaxBlocks = 1024;

// Two views seen as `rows` rows of `inner` contiguous elements, row r at r * stride_a in a and
// r * stride_b in b.
struct DotRows {
  int64_t rows = 0, inner = 0, stride_a = 0, stride_b = 0;
};

// The rows of a and b when their dims, ordered by a's strides, merge into at most [rows, inner]
// with contiguous inner elements in both (the order of a sum's terms is free): a contiguous pair,
// or q and its gradient as views into a packed [B, N, 3, h, d] projection. Else nothing.
std::optional<DotRows> dot_rows(const Tensor& a, const Tensor& b) {
  struct Dim {
    int64_t size, sa, sb;
  };
  std::vector<Dim> dims;
  for (int64_t d = 0; d < a.dim(); ++d) {
    const size_t i = static_cast<size_t>(d);
    if (a.shape()[i] != 1) dims.push_back({a.shape()[i], a.strides()[i], b.strides()[i]});
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& x, const Dim& y) { return x.sa > y.sa; });
  std::vector<Dim> merged;
  for (const Dim& d : dims) {
    if (!merged.empty() && merged.back().sa == d.sa * d.size && merged.back().sb == d.sb * d.size) {
      merged.back() = {merged.back().size * d.size, d.sa, d.sb};
    } else {
      merged.push_back(d);
    }
  }
  if (merged.empty()) return DotRows{1, 1, 1, 1};
  if (merged.size() > 2 || merged.back().sa != 1 || merged.back().sb != 1) return std::nullopt;
  DotRows r;
  r.inner = merged.back().size;
  r.rows = merged.size() == 2 ? merged[0].size : 1;
  r.stride_a = merged.size() == 2 ? merged[0].sa : r.inner;
  r.stride_b = merged.size() == 2 ? merged[0].sb : r.inner;
  return r;
}

// Block i sums a * b over elements [i * chunk, (i + 1) * chunk) of the rows, its threads striding
// through them, and writes one partial.
template <typename T>
__global__ void __launch_bounds__(kDotThreads)
    dot_partials_kernel(const T* __restrict__ a, const T* __restrict__ b, DotRows r, int64_t chunk,
                        float* __restrict__ partial) {
  const int64_t n = r.rows * r.inner;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  float acc = 0.0f;
  int64_t i = begin + threadIdx.x;
  int64_t row = i / r.inner, col = i % r.inner;
  for (; i < end; i += kDotThreads) {
    acc += to_float(a[row * r.stride_a + col]) * to_float(b[row * r.stride_b + col]);
    col += kDotThreads;
    if (col >= r.inner) {  // a division only where a row ends
      row += col / r.inner;
      col %= r.inner;
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block adds the partials, each thread a fixed stride of them, then the block.
__global__ void __launch_bounds__(kDotThreads)
    dot_final_kernel(const float* __restrict__ partial, int64_t count, float* __restrict__ out) {
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kDotThreads) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  const bool widened =
      out.dtype() == DType::kF32 && (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16);
  SKA_CHECK(out.dtype() == x.dtype() || widened, DTypeError,
            "cuda reduce: output must be of the input's dtype or f32 for a 16-bit input, got ",
            out.str(), " for ", x.str());
  SKA_CHECK(out.is_contiguous(), ValueError, "cuda reduce: output must be contiguous, got ",
            out.str());
  const int64_t rows = out.numel();
  if (rows == 0) return;
  const int64_t len = x.numel() / rows;
  dispatch_floating(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const int device = device_index(out);
    DeviceGuard guard(device);
    const cudaStream_t stream = current_stream(device);
    const int64_t sms = sm_count(device);
    const bool columns = len > 0 && x.is_contiguous() && reduces_leading_dims(x.shape(), dims);
    const Tensor packed = columns ? x : reduced_dims_last(x, dims);
    const T* xp = static_cast<const T*>(packed.data_ptr());
    // Columns: the leading `len` elements of the shape are the reduced rows.
    const bool aligned = reinterpret_cast<uintptr_t>(xp) % 16 == 0;
    const ColumnPlan plan =
        columns ? plan_columns(len, rows, sizeof(T), aligned, sms) : ColumnPlan{};
    const int64_t floats = columns ? plan.partial_floats : row_partial_floats(rows, len, sms);
    const Tensor partials = floats > 0 ? workspace(device, floats * sizeof(float)) : Tensor();
    float* pp = mutable_or_null<float>(partials);
    const auto run = [&](auto* yp) {
      visit_reduce_op(op, [&](auto op_c) {
        constexpr ReduceOp kOp = decltype(op_c)::value;
        if (columns) {
          launch_reduce_cols<kOp>(xp, yp, len, rows, plan, pp, stream);
        } else {
          launch_reduce_rows<kOp>(xp, yp, rows, len, sms, pp, stream);
        }
      });
    };
    if (widened) {
      run(static_cast<float*>(out.data_ptr()));
    } else {
      run(static_cast<T*>(out.data_ptr()));
    }
  });
}

void dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && out.numel() == 1 &&
                out.dtype() == DType::kF32,
            ValueError, "cuda dot: expected operands of one shape and dtype and a one-element f32",
            " output, got ", a.str(), ", ", b.str(), ", ", out.str());
  const int device = device_index(out);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  std::optional<DotRows> rows = dot_rows(a, b);
  const Tensor ac = rows ? a : a.contiguous(), bc = rows ? b : b.contiguous();
  if (!rows) rows = DotRows{1, a.numel(), a.numel(), a.numel()};
  const int64_t n = rows->rows * rows->inner;
  if (n == 0) {
    SKA_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, sizeof(float), stream));
    return;
  }
  // The split depends on n alone: the same sums in the same order on every call.
  const int64_t blocks = std::min((n + kDotChunk - 1) / kDotChunk, kDotMaxBlocks);
  const int64_t chunk = (n + blocks - 1) / blocks;
  const Tensor partial = workspace(device, static_cast<size_t>(blocks) * sizeof(float));
  dispatch_floating(a.dtype(), "dot", [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(dot_partials_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kDotThreads), 0,
                  stream, static_cast<const T*>(ac.data_ptr()),
                  static_cast<const T*>(bc.data_ptr()), *rows, chunk,
                  static_cast<float*>(partial.data_ptr()));
  });
  launch_kernel(dot_final_kernel, dim3(1), dim3(kDotThreads), 0, stream,
                static_cast<const float*>(partial.data_ptr()), blocks,
                static_cast<float*>(out.data_ptr()));
}

void argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  SKA_CHECK(out.dtype() == DType::kI64 && out.is_contiguous(), ValueError,
            "cuda argmax: output must be contiguous i64, got ", out.str());
  const int64_t outs = out.numel();
  if (outs == 0) return;
  const int64_t len = x.shape()[static_cast<size_t>(dim)];
  const int64_t step = x.strides()[static_cast<size_t>(dim)];
  // Output element o -> offset of its first element in x: out's shape with x's strides.
  Tensor base_view = Tensor::make_view(x.storage(), out.shape(), x.strides(), x.offset(), x.dtype());
  const StridedIndexer base = make_indexer(base_view);
  dispatch_floating(x.dtype(), "argmax", [&](auto tag) {
    using T = decltype(tag);
    DeviceGuard guard(device_index(out));
    const unsigned grid = static_cast<unsigned>(
        std::min<int64_t>((outs + kWarpsPerBlock - 1) / kWarpsPerBlock, 1 << 20));
    launch_kernel(argmax_kernel<T>, dim3(grid), dim3(32, kWarpsPerBlock), 0,
                  current_stream(device_index(out)), static_cast<const T*>(x.data_ptr()), base,
                  outs, len, step, out.data<int64_t>());
  });
}

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  SKA_CHECK(x.is_contiguous(), ValueError, "cuda topk: input must be contiguous, got ", x.str());
  SKA_CHECK(indices.dtype() == DType::kI64 && values.dtype() == x.dtype(), DTypeError,
            "cuda topk: values must have the input's dtype and indices must be i64");
  const int64_t len = x.shape().empty() ? 1 : x.shape().back();
  const int64_t rows = len == 0 ? 0 : x.numel() / len;
  SKA_CHECK(k >= 0 && k <= len, ValueError, "cuda topk: k = ", k, " for rows of ", len);
  if (rows == 0 || k == 0) return;
  dispatch_floating(x.dtype(), "topk", [&](auto tag) {
    using T = decltype(tag);
    DeviceGuard guard(device_index(x));
    const int threads = len >= 256 ? 256 : 32 * static_cast<int>((len + 31) / 32);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, 1 << 20));
    launch_kernel(topk_kernel<T>, dim3(grid), dim3(threads), 0, current_stream(device_index(x)),
                  static_cast<const T*>(x.data_ptr()), rows, len, k,
                  static_cast<T*>(values.data_ptr()), indices.data<int64_t>());
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
