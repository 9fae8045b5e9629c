// Softmax and log-softmax over the last dim on CUDA: one warp per row (values in registers) up to
// 1024 columns, one block per row beyond (row cached in shared memory when it fits). f32 math.
// launch_forward and launch_backward take raw operands, so that tests/simt runs this file's own
// code on the host; the tensor entry points are left out there.
#include <climits>
#include <cstdint>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;          // warp-per-row kernels: 128 threads, 4 rows
constexpr int kMaxWarpCols = 1024;         // 32 lanes x 32 registers
constexpr int kMaxCachedCols = 11 * 1024;  // 44 KiB of f32: under the 48 KiB default limit

// The additive mask is a broadcast view: its rows are reached through the leading dims (any
// strides, 0 included) and its columns through the last stride.
struct MaskView {
  StridedIndexer rows;
  int64_t col_stride;
};

template <typename T>
struct ForwardArgs {
  const T* x;
  const T* mask;  // null: no mask
  MaskView mv;
  T* y;
  int64_t rows;
  int cols;
  float scale;
  bool log;
};

template <typename T>
struct BackwardArgs {
  const T* y;
  const T* gy;
  T* gx;
  int64_t rows;
  int cols;
  float scale;
  bool log;
};

// z = scale * x + mask for column c of a row; `m` points at the row's mask (or is null).
template <typename T>
__device__ __forceinline__ float logit(const ForwardArgs<T>& a, const T* x, const T* m, int c) {
  const float z = a.scale * to_float(x[c]);
  return m ? z + to_float(m[c * a.mv.col_stride]) : z;
}

// softmax: e^(z - max) / sum, log_softmax: z - max - log(sum).
__device__ __forceinline__ float softmax_out(float z, float mx, float inv_sum, float log_sum,
                                             bool log) {
  return log ? z - mx - log_sum : expf(z - mx) * inv_sum;
}

template <typename T, int kPerLane>
__global__ void softmax_forward_warp(ForwardArgs<T> a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.rows) return;  // warp-uniform: the shuffles below see a full warp
  const int lane = threadIdx.x & 31;
  const T* x = a.x + row * a.cols;
  const T* m = a.mask ? a.mask + a.mv.rows.offset(row) : nullptr;
  float z[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + i * 32;
    z[i] = c < a.cols ? logit(a, x, m, c) : -INFINITY;
    mx = fmaxf(mx, z[i]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + i * 32 < a.cols) sum += expf(z[i] - mx);
  }
  sum = warp_sum(sum);
  const float inv_sum = 1.0f / sum, log_sum = logf(sum);
  T* y = a.y + row * a.cols;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + i * 32;
    if (c < a.cols) y[c] = from_float<T>(softmax_out(z[i], mx, inv_sum, log_sum, a.log));
  }
}

// One block per row (grid-stride over rows). With `cached`, each thread keeps the logits of its
// own columns in shared memory, so x and the mask are read once; no barrier is needed for that
// cache because a thread only ever reads back the entries it wrote.
template <typename T>
__global__ void softmax_forward_block(ForwardArgs<T> a, bool cached) {
  extern __shared__ float zs[];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = a.x + row * a.cols;
    const T* m = a.mask ? a.mask + a.mv.rows.offset(row) : nullptr;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const float z = logit(a, x, m, c);
      if (cached) zs[c] = z;
      mx = fmaxf(mx, z);
    }
    mx = block_max(mx);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      sum += expf((cached ? zs[c] : logit(a, x, m, c)) - mx);
    }
    sum = block_sum(sum);
    const float inv_sum = 1.0f / sum, log_sum = logf(sum);
    T* y = a.y + row * a.cols;
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const float z = cached ? zs[c] : logit(a, x, m, c);
      y[c] = from_float<T>(softmax_out(z, mx, inv_sum, log_sum, a.log));
    }
  }
}

// dL/dz from y and dL/dy, times scale:
//   softmax: y * (g - sum(g * y)),  log_softmax: g - e^y * sum(g).
__device__ __forceinline__ float softmax_grad(float y, float g, float red, float scale, bool log) {
  return scale * (log ? g - expf(y) * red : y * (g - red));
}

template <typename T, int kPerLane>
__global__ void softmax_backward_warp(BackwardArgs<T> a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t base = row * a.cols;
  float y[kPerLane], g[kPerLane];
  float red = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + i * 32;
    y[i] = c < a.cols ? to_float(a.y[base + c]) : 0.0f;
    g[i] = c < a.cols ? to_float(a.gy[base + c]) : 0.0f;
    red += a.log ? g[i] : g[i] * y[i];
  }
  red = warp_sum(red);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + i * 32;
    if (c < a.cols) a.gx[base + c] = from_float<T>(softmax_grad(y[i], g[i], red, a.scale, a.log));
  }
}

template <typename T>
__global__ void softmax_backward_block(BackwardArgs<T> a) {
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.cols;
    float red = 0.0f;
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const float g = to_float(a.gy[base + c]);
      red += a.log ? g : g * to_float(a.y[base + c]);
    }
    red = block_sum(red);
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const float v =
          softmax_grad(to_float(a.y[base + c]), to_float(a.gy[base + c]), red, a.scale, a.log);
      a.gx[base + c] = from_float<T>(v);
    }
  }
}

// Smallest registers-per-lane count (a power of two) covering `cols`.
int per_lane_for(int cols) {
  int k = 1;
  while (k * 32 < cols) k *= 2;
  return k;
}

int block_threads_for(int cols) { return cols <= 4096 ? 512 : 1024; }
unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>(rows < INT_MAX ? rows : INT_MAX);
}
unsigned int warp_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  SKA_CHECK(blocks <= INT_MAX, ShapeError, "softmax: too many rows (", rows, ")");
  return static_cast<unsigned int>(blocks);
}

template <typename T>
void launch_forward(const ForwardArgs<T>& a, cudaStream_t s) {
  if (a.cols > kMaxWarpCols) {
    const bool cached = a.cols <= kMaxCachedCols;
    const size_t smem = cached ? a.cols * sizeof(float) : 0;
    launch_kernel(softmax_forward_block<T>, dim3(row_blocks(a.rows)),
                  dim3(block_threads_for(a.cols)), smem, s, a, cached);
    return;
  }
  const unsigned int blocks = warp_blocks(a.rows);
  const int threads = kWarpsPerBlock * 32;
  switch (per_lane_for(a.cols)) {
    case 1:
      launch_kernel(softmax_forward_warp<T, 1>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 2:
      launch_kernel(softmax_forward_warp<T, 2>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 4:
      launch_kernel(softmax_forward_warp<T, 4>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 8:
      launch_kernel(softmax_forward_warp<T, 8>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 16:
      launch_kernel(softmax_forward_warp<T, 16>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    default:
      launch_kernel(softmax_forward_warp<T, 32>, dim3(blocks), dim3(threads), 0, s, a);
      break;
  }
}

template <typename T>
void launch_backward(const BackwardArgs<T>& a, cudaStream_t s) {
  if (a.cols > kMaxWarpCols) {
    launch_kernel(softmax_backward_block<T>, dim3(row_blocks(a.rows)),
                  dim3(block_threads_for(a.cols)), 0, s, a);
    return;
  }
  const unsigned int blocks = warp_blocks(a.rows);
  const int threads = kWarpsPerBlock * 32;
  switch (per_lane_for(a.cols)) {
    case 1:
      launch_kernel(softmax_backward_warp<T, 1>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 2:
      launch_kernel(softmax_backward_warp<T, 2>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 4:
      launch_kernel(softmax_backward_warp<T, 4>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 8:
      launch_kernel(softmax_backward_warp<T, 8>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    case 16:
      launch_kernel(softmax_backward_warp<T, 16>, dim3(blocks), dim3(threads), 0, s, a);
      break;
    default:
      launch_kernel(softmax_backward_warp<T, 32>, dim3(blocks), dim3(threads), 0, s, a);
      break;
  }
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

MaskView mask_view(const Tensor& mask) {
  MaskView mv{};
  const int64_t nd = mask.dim();
  SKA_CHECK(nd - 1 <= kMaxDims, ShapeError, "softmax: mask has ", nd, " dims, at most ",
            kMaxDims + 1, " supported");
  mv.rows.ndim = nd > 0 ? static_cast<int>(nd - 1) : 0;
  for (int64_t d = 0; d + 1 < nd; ++d) {
    mv.rows.sizes[d] = mask.shape()[d];
    mv.rows.strides[d] = mask.strides()[d];
  }
  mv.col_stride = nd > 0 ? mask.strides()[nd - 1] : 0;
  return mv;
}

// Rows and columns of a contiguous tensor viewed as [rows, last dim]; columns must fit an int.
void rows_cols(const Tensor& t, int64_t* rows, int* cols) {
  const int64_t c = t.dim() == 0 ? 1 : t.shape().back();
  SKA_CHECK(c <= INT_MAX, ShapeError, "softmax: last dim ", c, " too large");
  *cols = static_cast<int>(c);
  *rows = c == 0 ? 0 : t.numel() / c;
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& mask, double scale, bool log, const Tensor& y) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  int64_t rows;
  int cols;
  rows_cols(x, &rows, &cols);
  if (rows == 0) return;
  SKA_CHECK(x.is_contiguous() && y.is_contiguous(), ValueError,
            "softmax_forward: x and y must be contiguous");
  SKA_CHECK(!mask.defined() || (mask.dtype() == x.dtype() && mask.shape() == x.shape()), ValueError,
            "softmax_forward: mask must be a view with x's shape and dtype");
  dispatch_floating(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    ForwardArgs<T> a{};
    a.x = static_cast<const T*>(x.data_ptr());
    a.mask = mask.defined() ? static_cast<const T*>(mask.data_ptr()) : nullptr;
    if (mask.defined()) a.mv = mask_view(mask);
    a.y = static_cast<T*>(y.data_ptr());
    a.rows = rows;
    a.cols = cols;
    a.scale = static_cast<float>(scale);
    a.log = log;
    launch_forward(a, current_stream(device));
  });
}

void softmax_backward(const Tensor& y, const Tensor& grad_y, double scale, bool log,
                      const Tensor& grad_x) {
  const int device = device_index(y);
  DeviceGuard guard(device);
  int64_t rows;
  int cols;
  rows_cols(y, &rows, &cols);
  if (rows == 0) return;
  SKA_CHECK(y.is_contiguous() && grad_y.is_contiguous() && grad_x.is_contiguous(), ValueError,
            "softmax_backward: y, grad_y and grad_x must be contiguous");
  dispatch_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    BackwardArgs<T> a{};
    a.y = static_cast<const T*>(y.data_ptr());
    a.gy = static_cast<const T*>(grad_y.data_ptr());
    a.gx = static_cast<T*>(grad_x.data_ptr());
    a.rows = rows;
    a.cols = cols;
    a.scale = static_cast<float>(scale);
    a.log = log;
    launch_backward(a, current_stream(device));
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
