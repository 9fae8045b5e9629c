// Layer norm over the last dim on CUDA: one warp per row for the statistics, y and grad_x (f32
// two-pass mean/variance); grad_weight/grad_bias by a deterministic two-stage column reduction.
// set_cuda_layer_norm_fused_backward: rows of up to 768 columns take one backward kernel that
// keeps each row in registers and sums the parameter gradients on the way (one read of grad_y
// and x instead of three).
// add_layer_norm_forward / _backward fold a pre-norm block's residual add into the same passes.
// set_cuda_layer_norm_held_forward: rows of up to 1024 columns take forward kernels that load
// the whole row into registers first (each lane's columns in one burst of independent loads)
// and read it once; the same operations in the same order, so the same bits.
// T is x's (and the parameters') dtype, TY the output's and its gradient's: T, or bf16/f16 for
// an f32 x (computed in f32, rounded once at the store; the gradient widened as it is read).
// The add_layer_norm entry points also take a bf16/f16 x with f32 parameters (P, the parameters'
// and their gradients' dtype; T otherwise) and a 16-bit or f32 output: autocast's 16-bit stream,
// normalised in f32 as layer_norm normalises autocast's f32 copy of it; and the dropout the branch
// ends in (BranchDrop: the mask drawn as dropout_forward draws it, kept as its bits, and applied
// to the branch's gradient on the way back); the branch (TR) of x's dtype, the output's, or 16-bit
// for an f32 x and output; and a per-channel scale of the branch (CaiT's LayerScale), multiplied
// in as scaled_residual's kernels multiply it.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "backend/residual_norm_checks.h"
#include "core/random.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

constexpr int kRowWarps = 8;      // rows per block in the warp-per-row kernels (256 threads)
constexpr int kColTile = 32;      // parameter-gradient partials: columns per block (threadIdx.x)
constexpr int kRowLanes = 8;      // ... and rows walked in parallel (threadIdx.y)
constexpr int kChunkRows = 64;    // rows per partial-sum chunk
constexpr int kMaxChunks = 1024;  // gridDim.y bound for the partial sums
constexpr int kFusedMaxCols = 768;  // the fused backward: 24 columns a lane
constexpr unsigned kFullMask = 0xffffffffu;

constexpr int kHeldMaxCols = 1024;  // the held forward kernels: 32 columns a lane

std::atomic<bool> g_fused_backward{true};
std::atomic<bool> g_held_forward{false};

// a + b as the binary add kernel computes it: in f32, rounded once. __fadd_rn keeps the compiler
// from contracting it with a product before it (the layer-norm gradient) into one FMA, which
// would round differently from the unfused ops.
template <typename T, typename TR>
__device__ __forceinline__ T residual_add(T a, TR b) {
  return from_float<T>(__fadd_rn(to_float(a), to_float(b)));
}

// The pieces of a row's forward, with every rounding explicit (no contraction left to the
// compiler), so that the loop and held-row kernels, which call them in the same order, give the
// same bits: a lane's sum of squared deviations gains (x - mu)^2 as one fused multiply-add; the
// statistics from the warp's sums; an element normalised, times its weight and plus its bias
// (one fused multiply-add where there are both).
__device__ __forceinline__ float add_square_deviation(float acc, float x, float mu) {
  const float d = __fsub_rn(x, mu);
  return __fmaf_rn(d, d, acc);
}
__device__ __forceinline__ float row_mean(float lane_sum, int64_t cols) {
  return __fdiv_rn(warp_sum(lane_sum), static_cast<float>(cols));
}
__device__ __forceinline__ float row_rstd(float lane_squares, int64_t cols, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(
                             __fdiv_rn(warp_sum(lane_squares), static_cast<float>(cols)), eps)));
}
template <typename P>
__device__ __forceinline__ float normalised(float x, float mu, float rs, const P* w, const P* b,
                                            int64_t c) {
  const float xhat = __fmul_rn(__fsub_rn(x, mu), rs);
  if (w && b) return __fmaf_rn(xhat, to_float(w[c]), to_float(b[c]));
  if (w) return __fmul_rn(xhat, to_float(w[c]));
  if (b) return __fadd_rn(xhat, to_float(b[c]));
  return xhat;
}

// The rest of a row's forward once each lane has summed its elements into `s`: the mean, the
// variance around it (a second pass: no cancellation, unlike E[x^2] - E[x]^2), the statistics
// and the normalised row. xr: the row as layer norm reads it.
template <typename T, typename P, typename TY>
__device__ __forceinline__ void normalize_row(const T* xr, float s, const P* w, const P* b, TY* yr,
                                              float* mean, float* rstd, int64_t row, int64_t cols,
                                              float eps, int lane) {
  const float mu = row_mean(s, cols);
  float v = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) v = add_square_deviation(v, to_float(xr[c]), mu);
  const float rs = row_rstd(v, cols, eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  for (int64_t c = lane; c < cols; c += 32) {
    yr[c] = from_float<TY>(normalised(to_float(xr[c]), mu, rs, w, b, c));
  }
}

// normalize_row for a row held in registers: v[k] is column lane + 32k (0 past the end), `s`
// the lane's sum of its columns in that order. The same operations in the same order as
// normalize_row, so the same bits, without reading the row again.
template <typename P, typename TY, int kPerLane>
__device__ __forceinline__ void normalize_held_row(const float (&v)[kPerLane], float s, const P* w,
                                                   const P* b, TY* yr, float* mean, float* rstd,
                                                   int64_t row, int64_t cols, float eps, int lane) {
  const float mu = row_mean(s, cols);
  float var = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (lane + 32 * k < cols) var = add_square_deviation(var, v[k], mu);
  }
  const float rs = row_rstd(var, cols, eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = lane + 32 * k;
    if (c < cols) yr[c] = from_float<TY>(normalised(v[k], mu, rs, w, b, c));
  }
}

template <typename T, typename TY>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, TY* y, float* mean,
                                          float* rstd, int64_t rows, int64_t cols, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * cols;
  float s = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) s += to_float(xr[c]);
  normalize_row(xr, s, w, b, y + row * cols, mean, rstd, row, cols, eps, lane);
}

// layer_norm_forward_kernel with the row held in registers (rows of at most 32 x kPerLane
// columns): every load issued before the first sum waits for one.
template <typename T, typename TY, int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    layer_norm_forward_held_kernel(const T* x, const T* w, const T* b, TY* y, float* mean,
                                   float* rstd, int64_t rows, int64_t cols, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * cols;
  float v[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = lane + 32 * k;
    v[k] = c < cols ? to_float(xr[c]) : 0.0f;
  }
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (lane + 32 * k < cols) s += v[k];
  }
  normalize_held_row(v, s, w, b, y + row * cols, mean, rstd, row, cols, eps, lane);
}

// The branch's dropout in add_layer_norm's forward kernels. The lanes take columns c = lane + 32k
// (the norm's order); the draws go by groups of 128 columns: lane l draws the counter of columns
// 4l..4l+3 of the group (draw_group) and keeps its 4 bits as a nibble, lanes 2m and 2m + 1 store
// byte m of the group's 16 bytes of the mask, and the lane holding column c reads its bit from
// lane (c % 128) / 4 by a shuffle (kept_in_group). Every lane of the warp calls both.
__device__ __forceinline__ uint32_t draw_group(const BranchDrop& drop, uint64_t offset,
                                               int64_t base, int64_t c0, int64_t cols, int lane) {
  const int64_t first = c0 + 4 * lane;  // this lane's draw: columns first..first + 3
  uint32_t nibble = 0;
  if (first < cols) {
    const PhiloxOut r =
        philox4x32_10(drop.seed, offset + static_cast<uint64_t>((base + first) / 4));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      nibble |= static_cast<uint32_t>(philox_uniform(r.w[k]) < drop.keep) << k;
    }
  }
  const uint32_t high = __shfl_down_sync(kFullMask, nibble, 1);
  if ((lane & 1) == 0 && first < cols) {
    drop.bits[(base + first) / 8] = static_cast<uint8_t>(nibble | (high << 4));
  }
  return nibble;
}
// Whether column c0 + 32j + lane of the group whose nibbles draw_group returned is kept.
__device__ __forceinline__ bool kept_in_group(uint32_t nibble, int j, int lane) {
  return (__shfl_sync(kFullMask, nibble, 8 * j + lane / 4) >> (lane & 3)) & 1u;
}
// The counter offset of a launch's draws (a CUDA Graph's base added on the device).
__device__ __forceinline__ uint64_t draw_offset(const BranchDrop& drop) {
  return drop.offset + (drop.offset_base != nullptr ? static_cast<uint64_t>(*drop.offset_base) : 0);
}
// sum = x + branch * ys[c] for one element (the branch's value as its kernel wrote it; ys: the
// branch's per-channel scale, null for none), as scaled_residual_forward_kernel computes it: the
// product rounded to T, then the sum. Without a scale, residual_add's sum.
template <typename T>
__device__ __forceinline__ T scaled_sum(T x, float branch, const T* ys, int64_t c) {
  if (ys) branch = to_float(from_float<T>(__fmul_rn(branch, to_float(ys[c]))));
  return from_float<T>(__fadd_rn(to_float(x), branch));
}
// sum = x + dropout(y) * ys[c] for one element, as dropout's output (rounded to TR, its scale
// `scale` already rounded to TR) and then scaled_sum compute it.
template <typename T, typename TR>
__device__ __forceinline__ T dropped_sum(T x, TR y, bool kept, float scale, const T* ys,
                                         int64_t c) {
  return scaled_sum(x, to_float(from_float<TR>(__fmul_rn(to_float(y), kept ? scale : 0.0f))), ys,
                    c);
}

// layer_norm_forward_kernel on sum = x + y, which it writes as it reads it: the same sums in the
// same order, so the same bits as the add kernel followed by the layer norm. Each lane reads back
// only the elements it wrote itself.
// With a dropout (drop.bits set; rows of a multiple of 8 elements), y is first dropped as
// dropout_forward_kernel drops it (rounded to TR): the bits of dropout followed by add. With a
// branch scale ys (null: none), y (dropped) times ys[c] as scaled_residual's kernel forms it.
template <typename T, typename TR, typename P, typename TY>
__global__ void add_layer_norm_forward_kernel(const T* x, const TR* y, BranchDrop drop,
                                              const T* ys, const P* w, const P* b, T* sum, TY* out,
                                              float* mean, float* rstd, int64_t rows, int64_t cols,
                                              float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const int64_t base = row * cols;
  T* sr = sum + base;
  float s = 0.0f;
  if (drop.bits == nullptr) {
    for (int64_t c = lane; c < cols; c += 32) {
      const T v = scaled_sum(x[base + c], to_float(y[base + c]), ys, c);
      sr[c] = v;
      s += to_float(v);
    }
  } else {
    const uint64_t offset = draw_offset(drop);
    const float scale = to_float(from_float<TR>(drop.scale));  // as dropout's output holds it
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {               // warp-uniform, as the shuffles need
      const uint32_t nibble = draw_group(drop, offset, base, c0, cols, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t c = c0 + 32 * j + lane;
        const bool kept = kept_in_group(nibble, j, lane);
        if (c < cols) {
          const T v = dropped_sum(x[base + c], y[base + c], kept, scale, ys, c);
          sr[c] = v;
          s += to_float(v);
        }
      }
    }
  }
  normalize_row(static_cast<const T*>(sr), s, w, b, out + base, mean, rstd, row, cols, eps, lane);
}

// add_layer_norm_forward_kernel with the row held in registers (rows of at most 32 x kPerLane
// columns, kPerLane a multiple of 4): x and y loaded in one burst, the sum written and normalised
// from registers. The same operations in the same order: the same bits.
template <typename T, typename TR, typename P, typename TY, int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    add_layer_norm_forward_held_kernel(const T* x, const TR* y, BranchDrop drop, const T* ys,
                                       const P* w, const P* b, T* sum, TY* out, float* mean,
                                       float* rstd, int64_t rows, int64_t cols, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const int64_t base = row * cols;
  T xv[kPerLane];
  TR yv[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = lane + 32 * k;
    if (c < cols) {
      xv[k] = x[base + c];
      yv[k] = y[base + c];
    }
  }
  bool kept[kPerLane] = {};
  float scale = 1.0f;
  if (drop.bits != nullptr) {
    const uint64_t offset = draw_offset(drop);
    scale = to_float(from_float<TR>(drop.scale));
#pragma unroll
    for (int g = 0; g < kPerLane / 4; ++g) {
      const uint32_t nibble = draw_group(drop, offset, base, 128 * g, cols, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j) kept[4 * g + j] = kept_in_group(nibble, j, lane);
    }
  }
  float v[kPerLane];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = lane + 32 * k;
    v[k] = 0.0f;
    if (c < cols) {
      const T t = drop.bits != nullptr ? dropped_sum(xv[k], yv[k], kept[k], scale, ys, c)
                                       : scaled_sum(xv[k], to_float(yv[k]), ys, c);
      sum[base + c] = t;
      v[k] = to_float(t);
      s += v[k];
    }
  }
  normalize_held_row(v, s, w, b, out + base, mean, rstd, row, cols, eps, lane);
}

// Where add_layer_norm_backward writes the residual branch's gradient: `out` (null: not
// wanted), of TB (`low`: a 16-bit branch of an f32 stream; the kernels' template parameter) or
// of T, through the branch's scale where `scale` is set ([cols] of T; the kernels' kScaled) and
// through its dropout where `bits` is set. `y`: the branch itself (of the branch's dtype), where
// the fused kernel sums the scale's gradient (its part_s).
struct BranchGrad {
  void* out = nullptr;
  bool low = false;
  const void* scale = nullptr;
  const uint8_t* bits = nullptr;
  float drop_scale = 1.0f;  // dropout's, as the host passes it (rounded to the branch's dtype here)
  const void* y = nullptr;
};

// Element i of the branch as the sum read it: y, through its dropout's mask where there is one
// (rounded to the branch's dtype as dropout_forward writes it).
template <typename T, typename TB>
__device__ __forceinline__ float dropped_branch(const BranchGrad& br, int64_t i) {
  float v = br.low ? to_float(static_cast<const TB*>(br.y)[i])
                   : to_float(static_cast<const T*>(br.y)[i]);
  if (br.bits == nullptr) return v;
  const float scale =
      br.low ? to_float(from_float<TB>(br.drop_scale)) : to_float(from_float<T>(br.drop_scale));
  v = __fmul_rn(v, (br.bits[i >> 3] >> (i & 7)) & 1 ? scale : 0.0f);
  return br.low ? to_float(from_float<TB>(v)) : to_float(from_float<T>(v));
}

// Stores one element (flat index i, column c) of grad_x: the layer-norm gradient g rounded to T,
// plus the residual gradient where there is one (add_layer_norm_backward); and the branch's
// gradient where wanted, as scaled_residual_backward_kernel forms gy: that sum times the scale
// (rounded to T), cast to the branch's dtype (add's gradient), then dropout's backward (its bits).
// kScaled: br.scale is set (a template parameter, so that the kernels without a scale keep their
// registers). Returns the grad_x element stored, widened.
template <typename T, typename TB, bool kScaled>
__device__ __forceinline__ float store_grad_x(float g, const T* res, T* gx, const BranchGrad& br,
                                              int64_t i, int64_t c) {
  T out = from_float<T>(g);
  if (res) out = residual_add(out, res[i]);
  gx[i] = out;
  if (br.out == nullptr) return to_float(out);
  float v = to_float(out);
  if constexpr (kScaled) {
    v = to_float(from_float<T>(__fmul_rn(v, to_float(static_cast<const T*>(br.scale)[c]))));
  }
  if (br.low) v = to_float(from_float<TB>(v));
  if (br.bits != nullptr) {  // dropout_backward_kernel's product, its scale rounded as there
    const float scale =
        br.low ? to_float(from_float<TB>(br.drop_scale)) : to_float(from_float<T>(br.drop_scale));
    v = __fmul_rn(v, (br.bits[i >> 3] >> (i & 7)) & 1 ? scale : 0.0f);
  }
  if (br.low) {
    static_cast<TB*>(br.out)[i] = from_float<TB>(v);
  } else {
    static_cast<T*>(br.out)[i] = from_float<T>(v);
  }
  return to_float(out);
}

// grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) with gw = grad_y * weight.
template <typename T, typename P, typename TY, typename TB, bool kScaled>
__global__ void layer_norm_grad_x_kernel(const TY* gy, const T* x, const P* w, const float* mean,
                                         const float* rstd, const T* res, T* gx, BranchGrad branch,
                                         int64_t rows, int64_t cols) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t base = row * cols;
  const float mu = mean[row], rs = rstd[row];
  float sum_gw = 0.0f, sum_gwx = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float gw = to_float(gy[base + c]) * (w ? to_float(w[c]) : 1.0f);
    sum_gw += gw;
    sum_gwx += gw * (to_float(x[base + c]) - mu) * rs;
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean_gw = warp_sum(sum_gw) * inv_cols, mean_gwx = warp_sum(sum_gwx) * inv_cols;
  for (int64_t c = lane; c < cols; c += 32) {
    const float gw = to_float(gy[base + c]) * (w ? to_float(w[c]) : 1.0f);
    const float xhat = (to_float(x[base + c]) - mu) * rs;
    store_grad_x<T, TB, kScaled>(rs * (gw - mean_gw - xhat * mean_gwx), res, gx, branch, base + c,
                                 c);
  }
}

// Stage 1: block (column tile, row chunk) sums grad_y * xhat and grad_y over its chunk's rows,
// then writes one partial per column: part_w / part_b [chunks, cols]. Fixed order everywhere,
// so the result is bitwise reproducible (no atomics).
template <typename T, typename TY>
__global__ void layer_norm_param_partials(const TY* gy, const T* x, const float* mean,
                                          const float* rstd, int64_t rows, int64_t cols,
                                          int64_t chunk_rows, float* part_w, float* part_b) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float aw = 0.0f, ab = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const float g = to_float(gy[r * cols + c]);
      aw += g * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
      ab += g;
    }
  }
  store_column_partials<kColTile, kRowLanes>(aw, ab, c, cols, part_w, part_b);
}

// The whole backward in one pass (rows of at most 32 x kPerLane columns): block b takes rows
// [b * chunk_rows, (b + 1) * chunk_rows), each warp every kRowWarps-th of them. A warp holds its
// row's grad_y and x - mean in registers, forms grad_x as layer_norm_grad_x_kernel does (the
// same operations in the same order, so the same bits), and adds grad_y * xhat and grad_y into
// per-lane column sums; at the end the block adds its warps' sums in warp order into one
// partial per column (part_w / part_b [blocks, cols]), which sum_column_partials reduces.
// grad_y and x are read once, where the two-kernel path reads them three times.
// With part_s (kScaled, grad_x written), also the partial sums of the branch scale's gradient,
// grad_x * dropped y per column (each product rounded to T), as scaled_residual_backward_kernel
// sums them: the same rows per block (chunk_rows) and per warp (its lanes of rows), each warp's
// running sum in its row of `red` in row order, the warps added in order from warp 0's sum; so
// the same bits as that kernel's gys.
template <typename T, typename P, typename TY, typename TB, bool kScaled, int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    layer_norm_backward_fused_kernel(const TY* gy, const T* x, const P* w, const float* mean,
                                     const float* rstd, const T* res, T* gx, BranchGrad branch,
                                     int64_t rows, int64_t cols, int64_t chunk_rows, float* part_w,
                                     float* part_b, float* part_s) {
  extern __shared__ float red[];  // [kRowWarps][cols]
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float wv[kPerLane], acc_w[kPerLane], acc_b[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t c = lane + 32 * k;
    wv[k] = w && c < cols ? to_float(w[c]) : 1.0f;
    acc_w[k] = acc_b[k] = 0.0f;
    if (kScaled && part_s != nullptr && c < cols) red[warp * cols + c] = 0.0f;
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = r0 + warp; row < r1; row += kRowWarps) {
    const int64_t base = row * cols;
    const float mu = mean[row], rs = rstd[row];
    float g[kPerLane], xd[kPerLane];
    float sum_gw = 0.0f, sum_gwx = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t c = lane + 32 * k;
      g[k] = xd[k] = 0.0f;
      if (c < cols) {
        g[k] = to_float(gy[base + c]);
        xd[k] = to_float(x[base + c]) - mu;
        const float gw = g[k] * wv[k];
        sum_gw += gw;
        sum_gwx += gw * xd[k] * rs;
        acc_w[k] += g[k] * xd[k] * rs;
        acc_b[k] += g[k];
      }
    }
    const float mean_gw = warp_sum(sum_gw) * inv_cols, mean_gwx = warp_sum(sum_gwx) * inv_cols;
    if (gx != nullptr) {
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t c = lane + 32 * k;
        if (c < cols) {
          const float xhat = xd[k] * rs;
          const float stored = store_grad_x<T, TB, kScaled>(
              rs * (g[k] * wv[k] - mean_gw - xhat * mean_gwx), res, gx, branch, base + c, c);
          if constexpr (kScaled) {
            if (part_s != nullptr) {  // this lane's own slot: no other thread touches it
              float& acc = red[warp * cols + c];
              acc = __fadd_rn(acc, to_float(from_float<T>(
                                       __fmul_rn(stored, dropped_branch<T, TB>(branch, base + c)))));
            }
          }
        }
      }
    }
  }
  if (kScaled && part_s != nullptr) {  // the scale's partials, from the sums already in `red`
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float s = red[c];
      for (int i = 1; i < kRowWarps; ++i) s += red[i * cols + c];
      part_s[static_cast<int64_t>(blockIdx.x) * cols + c] = s;
    }
    __syncthreads();
  }
  for (int which = 0; which < 2; ++which) {  // grad_weight's partials, then grad_bias's
    float* part = which == 0 ? part_w : part_b;
    if (part == nullptr) continue;  // the same for the whole block
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t c = lane + 32 * k;
      if (c < cols) red[warp * cols + c] = which == 0 ? acc_w[k] : acc_b[k];
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float s = 0.0f;
      for (int i = 0; i < kRowWarps; ++i) s += red[i * cols + c];
      part[static_cast<int64_t>(blockIdx.x) * cols + c] = s;
    }
    __syncthreads();
  }
}

unsigned int row_warp_blocks(int64_t rows) {
  const int64_t blocks = (rows + kRowWarps - 1) / kRowWarps;
  SKA_CHECK(blocks <= INT_MAX, ShapeError, "layer_norm: too many rows (", rows, ")");
  return static_cast<unsigned int>(blocks);
}

// Launches a warp-per-row kernel over `rows` rows (kRowWarps a block) on the device's current
// stream with `args` (a tuple of its parameters), and checks the launch.
template <typename... Params, typename... Args>
void launch_rows(void (*kernel)(Params...), int64_t rows, int device,
                 const std::tuple<Args...>& args) {
#if defined(SKA_SIMT_KERNELS_ONLY)  // the kernels alone, run on the host (tests/simt)
  (void)device;
  const cudaStream_t stream = nullptr;
#else
  const cudaStream_t stream = current_stream(device);
#endif
  std::apply(
      [&](const auto&... a) {
        launch_kernel(kernel, dim3(row_warp_blocks(rows)), dim3(kRowWarps * 32), 0, stream, a...);
      },
      args);
}

// Calls f(std::integral_constant<int, K>) with the first K of kPerLane... (ascending) whose 32
// lanes hold a row of `cols` columns (32 K >= cols) and returns true; false where none does.
template <int... kPerLane, typename F>
bool with_columns_per_lane(int64_t cols, F&& f) {
  bool done = false;
  const auto try_one = [&](auto per_lane) {
    if (!done && cols <= 32 * decltype(per_lane)::value) {
      f(per_lane);
      done = true;
    }
  };
  (try_one(std::integral_constant<int, kPerLane>{}), ...);
  return done;
}

// With set_cuda_layer_norm_held_forward on and rows of at most kHeldMaxCols columns, calls
// f(std::integral_constant<int, kPerLane>) with the columns a lane holds (a multiple of 4, as the
// dropout's groups of 128 columns need) and returns true; otherwise false.
template <typename F>
bool with_held_row(int64_t cols, F&& f) {
  return g_held_forward.load() && with_columns_per_lane<8, 16, 24, kHeldMaxCols / 32>(cols, f);
}

// The fused backward's row chunks (its blocks) for `rows` rows, and the f32 partial sums
// launch_fused_backward needs: three [chunks, cols] planes (grad_weight's, grad_bias's and the
// branch scale's).
int64_t fused_chunks(int64_t rows) {
  return std::min<int64_t>((rows + kChunkRows - 1) / kChunkRows, kMaxChunks);
}
int64_t fused_partial_floats(int64_t rows, int64_t cols) { return 3 * fused_chunks(rows) * cols; }

// The fused backward (rows of at most kFusedMaxCols columns, rows > 0): grad_x where wanted (plus
// grad_sum, and the branch's gradient through `branch`), and grad_weight, grad_bias and the
// branch scale's gradient (each null where not wanted) through their block partials in
// `partials` (fused_partial_floats of them where any is wanted).
template <typename T, typename P, typename TY, typename TB, bool kScaled>
void launch_fused_backward(const TY* grad_y, const T* grad_sum, const T* x, const P* weight,
                           const float* mean, const float* rstd, T* grad_x,
                           const BranchGrad& branch, P* grad_weight, P* grad_bias, T* grad_scale,
                           float* partials, int64_t rows, int64_t cols, cudaStream_t s) {
  const int64_t chunks = fused_chunks(rows);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const bool params = grad_weight != nullptr || grad_bias != nullptr;
  float* part_w = grad_weight != nullptr ? partials : nullptr;
  float* part_b = grad_bias != nullptr ? partials + chunks * cols : nullptr;
  float* part_s = grad_scale != nullptr ? partials + 2 * chunks * cols : nullptr;
  const size_t smem = static_cast<size_t>(kRowWarps) * cols * sizeof(float);
  const auto run = [&](auto per_lane) {
    constexpr int kPerLane = decltype(per_lane)::value;
    launch_kernel(layer_norm_backward_fused_kernel<T, P, TY, TB, kScaled, kPerLane>,
                  static_cast<unsigned int>(chunks), kRowWarps * 32, smem, s, grad_y, x, weight,
                  mean, rstd, grad_sum, grad_x, branch, rows, cols, chunk_rows, part_w, part_b,
                  part_s);
  };
  with_columns_per_lane<4, 8, 16, kFusedMaxCols / 32>(cols, run);
  if (params) {
    launch_column_sums<P>(part_w, part_b, chunks, cols, grad_weight, grad_bias, s);
  }
  if (grad_scale != nullptr) {  // as scaled_residual_backward reduces its gys partials
    launch_column_sums<T>(nullptr, part_s, chunks, cols, nullptr, grad_scale, s);
  }
}

// The tensor-level entry points and their launches (tests/simt runs the forward kernels through
// launch_rows and the fused backward through launch_fused_backward on raw host operands).
#if defined(SKA_SIMT_KERNELS_ONLY)
}  // namespace
#else
void check_param(const Tensor& p, DType dtype, int64_t cols, const char* what) {
  if (!p.defined()) return;
  SKA_CHECK(p.dtype() == dtype, DTypeError, "layer_norm: ", what, " dtype ", p.dtype(),
            " differs from ", dtype);
  SKA_CHECK(p.numel() == cols && p.is_contiguous(), ShapeError, "layer_norm: ", what,
            " must be contiguous with ", cols, " elements");
}

void check_stats(const Tensor& mean, const Tensor& rstd, int64_t rows) {
  SKA_CHECK(mean.dtype() == DType::kF32 && rstd.dtype() == DType::kF32, DTypeError,
            "layer_norm: mean and rstd must be f32");
  SKA_CHECK(mean.numel() == rows && rstd.numel() == rows, ShapeError,
            "layer_norm: mean and rstd need ", rows, " elements");
}

// grad_weight / grad_bias through the two-stage reduction, scratch from the workspace.
template <typename T, typename P, typename TY>
void launch_param_grads(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                        const Tensor& rstd, const Tensor& grad_weight, const Tensor& grad_bias,
                        int64_t rows, int64_t cols, int device, cudaStream_t s) {
  const int64_t chunks = std::min<int64_t>((rows + kChunkRows - 1) / kChunkRows, kMaxChunks);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const Tensor ws = workspace(device, 2 * chunks * cols * sizeof(float));
  float* part_w = static_cast<float*>(ws.data_ptr());
  float* part_b = part_w + chunks * cols;
  const int64_t col_tiles = (cols + kColTile - 1) / kColTile;
  SKA_CHECK(col_tiles <= INT_MAX, ShapeError, "layer_norm: too many columns (", cols, ")");
  const dim3 grid(static_cast<unsigned int>(col_tiles), static_cast<unsigned int>(chunks));
  launch_kernel(layer_norm_param_partials<T, TY>, grid, dim3(kColTile, kRowLanes), 0, s,
                static_cast<const TY*>(grad_y.data_ptr()), static_cast<const T*>(x.data_ptr()),
                static_cast<const float*>(mean.data_ptr()),
                static_cast<const float*>(rstd.data_ptr()), rows, cols, chunk_rows,
                grad_weight.defined() ? part_w : nullptr, grad_bias.defined() ? part_b : nullptr);

  launch_column_sums<P>(part_w, part_b, chunks, cols, mutable_or_null<P>(grad_weight),
                        mutable_or_null<P>(grad_bias), s);
}

// Calls f(T{}, TY{}) for x's dtype T and y's (or grad_y's) dtype TY: the same, or an f32 x with a
// bf16/f16 output.
template <typename F>
void dispatch_output(DType x_dtype, DType y_dtype, const char* kernel, F&& f) {
  if (x_dtype == y_dtype) return dispatch_floating(x_dtype, kernel, [&](auto t) { f(t, t); });
  SKA_CHECK(x_dtype == DType::kF32 && (y_dtype == DType::kBF16 || y_dtype == DType::kF16),
            DTypeError, kernel, ": a ", dtype_name(x_dtype), " input with a ", dtype_name(y_dtype),
            " output (gradient); expected the same, or f32 with bf16/f16");
  if (y_dtype == DType::kBF16) return f(float{}, __nv_bfloat16{});
  f(float{}, __half{});
}

// Calls f(T{}, P{}, TY{}): dispatch_output's pairs with P = T, or, for parameters of another
// dtype (add_layer_norm's entry points), a bf16/f16 x with f32 parameters and a TY of x's dtype or
// f32.
template <typename F>
void dispatch_norm(DType x_dtype, DType param_dtype, DType y_dtype, const char* kernel, F&& f) {
  if (param_dtype == x_dtype) {
    return dispatch_output(x_dtype, y_dtype, kernel,
                           [&](auto t, auto ty) { f(t, decltype(t){}, ty); });
  }
  SKA_CHECK(param_dtype == DType::kF32 && (x_dtype == DType::kBF16 || x_dtype == DType::kF16) &&
                (y_dtype == x_dtype || y_dtype == DType::kF32),
            DTypeError, kernel, ": a ", dtype_name(x_dtype), " input with ",
            dtype_name(param_dtype), " parameters and a ", dtype_name(y_dtype),
            " output (gradient); expected the input's dtype throughout, or a bf16/f16 input with "
            "f32 parameters and an output of the input's dtype or f32");
  const auto with_x = [&](auto t) {
    using T = decltype(t);
    if (y_dtype == x_dtype) return f(t, float{}, t);
    f(t, float{}, float{});
  };
  if (x_dtype == DType::kBF16) return with_x(__nv_bfloat16{});
  with_x(__half{});
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  SKA_CHECK(x.is_contiguous() && y.is_contiguous(), ValueError,
            "layer_norm_forward: x and y must be contiguous");
  check_param(weight, x.dtype(), cols, "weight");
  check_param(bias, x.dtype(), cols, "bias");
  check_stats(mean, rstd, rows);
  dispatch_output(x.dtype(), y.dtype(), "layer_norm_forward", [&](auto tag, auto out_tag) {
    using T = decltype(tag);
    using TY = decltype(out_tag);
    const auto args = std::make_tuple(
        static_cast<const T*>(x.data_ptr()), data_or_null<T>(weight), data_or_null<T>(bias),
        static_cast<TY*>(y.data_ptr()), static_cast<float*>(mean.data_ptr()),
        static_cast<float*>(rstd.data_ptr()), rows, cols, static_cast<float>(eps));
    const bool held = with_held_row(cols, [&](auto per_lane) {
      launch_rows(layer_norm_forward_held_kernel<T, TY, decltype(per_lane)::value>, rows, device,
                  args);
    });
    if (!held) launch_rows(layer_norm_forward_kernel<T, TY>, rows, device, args);
  });
}

namespace {

// layer_norm_backward and add_layer_norm_backward (grad_sum, y_scale and grad_branch undefined
// and drop inactive in the first): one body, so that the two write grad_x with the same kernels.
void backward(const char* kernel, const Tensor& grad_y, const Tensor& grad_sum, const Tensor& x,
              const Tensor& weight, DType param_dtype, const Tensor& mean, const Tensor& rstd,
              const DropoutDraw& drop, const Tensor& y, const Tensor& y_scale,
              const Tensor& grad_x, const Tensor& grad_branch, const Tensor& grad_weight,
              const Tensor& grad_bias, const Tensor& grad_scale) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  SKA_CHECK(x.is_contiguous() && grad_y.is_contiguous(), ValueError, kernel,
            ": x and grad_y must be contiguous");
  check_param(weight, param_dtype, cols, "weight");
  check_param(grad_weight, param_dtype, cols, "grad_weight");
  check_param(grad_bias, param_dtype, cols, "grad_bias");
  check_stats(mean, rstd, rows);
  if (grad_x.defined()) {
    SKA_CHECK(grad_x.is_contiguous() && grad_x.dtype() == x.dtype(), ValueError, kernel,
              ": grad_x must be contiguous, of x's dtype");
  }
  if (grad_sum.defined()) {
    SKA_CHECK(grad_x.defined() && grad_sum.is_contiguous() && grad_sum.numel() == x.numel(),
              ValueError, kernel, ": grad_sum needs grad_x and x's size, contiguous");
  }
  SKA_CHECK(!grad_sum.defined() || grad_sum.dtype() == x.dtype(), DTypeError, kernel,
            ": grad_sum must have x's dtype ", dtype_name(x.dtype()));
  check_add_layer_norm_grads(kernel, x, grad_y, grad_x, grad_branch);
  check_add_layer_norm_scale_grad(kernel, x, grad_y, y, y_scale, grad_x, grad_scale);
  BranchGrad branch;
  if (grad_branch.defined() || grad_scale.defined()) {
    check_add_layer_norm_scale(kernel, y_scale, x, param_dtype);
    if (drop.active()) check_add_layer_norm_drop(kernel, drop, x, grad_x);
    branch.out = grad_branch.defined() ? grad_branch.data_ptr() : nullptr;
    branch.low = (grad_branch.defined() ? grad_branch.dtype() : y.dtype()) != x.dtype();
    branch.scale = y_scale.defined() ? y_scale.data_ptr() : nullptr;
    branch.y = grad_scale.defined() ? y.data_ptr() : nullptr;
    if (drop.active()) {
      branch.bits = static_cast<const uint8_t*>(drop.bits.data_ptr());
      branch.drop_scale = static_cast<float>(drop.scale);
    }
  }
  const DType branch_dtype = grad_branch.defined() ? grad_branch.dtype()
                             : y.defined()         ? y.dtype()
                                                   : x.dtype();
  dispatch_norm(x.dtype(), param_dtype, grad_y.dtype(), kernel, [&](auto t, auto p, auto ty) {
    using T = decltype(t);
    using P = decltype(p);
    using TY = decltype(ty);
    const cudaStream_t s = current_stream(device);
    if (rows == 0) {  // empty batch: the parameter gradients are zero
      if (grad_weight.defined())
        SKA_CUDA_CHECK(cudaMemsetAsync(grad_weight.data_ptr(), 0, cols * sizeof(P), s));
      if (grad_bias.defined())
        SKA_CUDA_CHECK(cudaMemsetAsync(grad_bias.data_ptr(), 0, cols * sizeof(P), s));
      if (grad_scale.defined())
        SKA_CUDA_CHECK(cudaMemsetAsync(grad_scale.data_ptr(), 0, cols * sizeof(T), s));
      return;
    }
    // TB: the 16-bit dtype of a branch (its gradient) `low` reads and writes: the output's where
    // it is 16-bit (the autocast block: a bf16 branch into a bf16 norm output), else the
    // branch's (an f32 norm output); unused without a low branch (check_add_layer_norm_grads).
    const auto with_branch_dtype = [&](auto tb) {
      using TB = decltype(tb);
      const auto launch = [&](auto scaled) {
        constexpr bool kScaled = decltype(scaled)::value;
        if (g_fused_backward.load() && cols <= kFusedMaxCols) {
          const Tensor scale_grad = kScaled ? grad_scale : Tensor();
          const bool sums = grad_weight.defined() || grad_bias.defined() || scale_grad.defined();
          const Tensor ws =
              sums ? workspace(device, fused_partial_floats(rows, cols) * sizeof(float)) : Tensor();
          launch_fused_backward<T, P, TY, TB, kScaled>(
              static_cast<const TY*>(grad_y.data_ptr()), data_or_null<T>(grad_sum),
              static_cast<const T*>(x.data_ptr()), data_or_null<P>(weight),
              static_cast<const float*>(mean.data_ptr()),
              static_cast<const float*>(rstd.data_ptr()), mutable_or_null<T>(grad_x), branch,
              mutable_or_null<P>(grad_weight), mutable_or_null<P>(grad_bias),
              mutable_or_null<T>(scale_grad), sums ? static_cast<float*>(ws.data_ptr()) : nullptr,
              rows, cols, s);
          return;
        }
        if (grad_x.defined()) {
          launch_kernel(layer_norm_grad_x_kernel<T, P, TY, TB, kScaled>,
                        dim3(row_warp_blocks(rows)), dim3(kRowWarps * 32), 0, s,
                        static_cast<const TY*>(grad_y.data_ptr()),
                        static_cast<const T*>(x.data_ptr()), data_or_null<P>(weight),
                        static_cast<const float*>(mean.data_ptr()),
                        static_cast<const float*>(rstd.data_ptr()), data_or_null<T>(grad_sum),
                        static_cast<T*>(grad_x.data_ptr()), branch, rows, cols);
        }
      };
      // A scale of the branch comes with parameters of x's dtype (check_add_layer_norm_scale).
      if constexpr (std::is_same_v<P, T>) {
        if (branch.scale != nullptr) return launch(std::true_type{});
      }
      launch(std::false_type{});
    };
    if constexpr (std::is_same_v<TY, __nv_bfloat16> || std::is_same_v<TY, __half>) {
      with_branch_dtype(TY{});
    } else if (branch.low && branch_dtype == DType::kF16) {
      with_branch_dtype(__half{});
    } else {
      with_branch_dtype(__nv_bfloat16{});
    }
    if (g_fused_backward.load() && cols <= kFusedMaxCols) return;
    if (grad_scale.defined()) {  // the split path: scaled_residual's kernel on grad_x
      scaled_residual_backward(grad_x, Tensor(), Tensor(), y, y_scale, Tensor(), drop, Tensor(),
                               Tensor(), Tensor(), grad_scale);
    }
    if (grad_weight.defined() || grad_bias.defined()) {
      launch_param_grads<T, P, TY>(grad_y, x, mean, rstd, grad_weight, grad_bias, rows, cols,
                                   device, s);
    }
  });
}

}  // namespace

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias) {
  backward("layer_norm_backward", grad_y, Tensor(), x, weight, x.dtype(), mean, rstd, DropoutDraw(),
           Tensor(), Tensor(), grad_x, Tensor(), grad_weight, grad_bias, Tensor());
}

void add_layer_norm_forward(const Tensor& x, const Tensor& y, const DropoutDraw& drop,
                            const Tensor& y_scale, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& sum, const Tensor& normed, const Tensor& mean,
                            const Tensor& rstd) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  SKA_CHECK(x.is_contiguous() && y.is_contiguous() && sum.is_contiguous() &&
                normed.is_contiguous() && y.numel() == x.numel() && sum.numel() == x.numel() &&
                normed.numel() == x.numel() && sum.dtype() == x.dtype(),
            ValueError,
            "add_layer_norm_forward: x, y, sum and normed must be contiguous, of one size, the "
            "sum of x's dtype");
  const DType param_dtype = norm_param_dtype(x, weight, bias);
  check_param(weight, param_dtype, cols, "weight");
  check_param(bias, param_dtype, cols, "bias");
  check_stats(mean, rstd, rows);
  SKA_CHECK(param_dtype == x.dtype() || y.dtype() == x.dtype(), DTypeError,
            "add_layer_norm_forward: a ", dtype_name(x.dtype()), " x with ",
            dtype_name(param_dtype), " parameters needs y of its dtype, got ",
            dtype_name(y.dtype()));
  const char* kernel = "add_layer_norm_forward";
  check_add_layer_norm_scale(kernel, y_scale, x, param_dtype);
  if (drop.active()) check_add_layer_norm_drop(kernel, drop, x, y);
  const BranchDrop branch_drop = kernel_drop(drop);
  dispatch_norm(x.dtype(), param_dtype, normed.dtype(), kernel, [&](auto t, auto p, auto ty) {
    using T = decltype(t);
    using P = decltype(p);
    using TY = decltype(ty);
    const auto run = [&](auto residual_tag) {
      using TR = decltype(residual_tag);
      const auto args = std::make_tuple(
          static_cast<const T*>(x.data_ptr()), static_cast<const TR*>(y.data_ptr()), branch_drop,
          data_or_null<T>(y_scale), data_or_null<P>(weight), data_or_null<P>(bias), static_cast<T*>(sum.data_ptr()),
          static_cast<TY*>(normed.data_ptr()), static_cast<float*>(mean.data_ptr()),
          static_cast<float*>(rstd.data_ptr()), rows, cols, static_cast<float>(eps));
      const bool held = with_held_row(cols, [&](auto per_lane) {
        launch_rows(add_layer_norm_forward_held_kernel<T, TR, P, TY, decltype(per_lane)::value>,
                    rows, device, args);
      });
      if (!held) launch_rows(add_layer_norm_forward_kernel<T, TR, P, TY>, rows, device, args);
    };
    if (y.dtype() == x.dtype()) return run(T{});
    if (y.dtype() == normed.dtype()) return run(TY{});
    // A 16-bit branch of an f32 stream normalised into f32.
    if constexpr (std::is_same_v<T, float> && std::is_same_v<TY, float>) {
      if (y.dtype() == DType::kBF16) return run(__nv_bfloat16{});
      if (y.dtype() == DType::kF16) return run(__half{});
    }
    SKA_FAIL(DTypeError, "add_layer_norm_forward: y of dtype ", dtype_name(y.dtype()), " for x ",
             dtype_name(x.dtype()), " and output ", dtype_name(normed.dtype()),
             "; expected x's dtype, the output's, or bf16/f16 for an f32 x and output");
  });
}

void add_layer_norm_backward(const Tensor& grad_y, const Tensor& grad_sum, const Tensor& x,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const DropoutDraw& drop, const Tensor& y, const Tensor& y_scale,
                             const Tensor& grad_x, const Tensor& grad_branch,
                             const Tensor& grad_weight, const Tensor& grad_bias,
                             const Tensor& grad_scale) {
  SKA_CHECK(!grad_x.defined() || grad_sum.defined(), ValueError,
            "add_layer_norm_backward: grad_sum is required with grad_x");
  const DType param_dtype = weight.defined()        ? weight.dtype()
                            : grad_weight.defined() ? grad_weight.dtype()
                            : grad_bias.defined()   ? grad_bias.dtype()
                                                    : x.dtype();
  backward("add_layer_norm_backward", grad_y, grad_sum, x, weight, param_dtype, mean, rstd, drop,
           y, y_scale, grad_x, grad_branch, grad_weight, grad_bias, grad_scale);
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda

namespace ska {

bool set_cuda_layer_norm_held_forward(bool enabled) {
  return cuda::g_held_forward.exchange(enabled);
}

bool set_cuda_layer_norm_fused_backward(bool enabled) {
  return cuda::g_fused_backward.exchange(enabled);
}

}  // namespace ska
