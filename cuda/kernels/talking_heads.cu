// CUDA kernels: CaiT's talking-heads softmax, mix(softmax(mix(scale * logits, w_pre)), w_post),
// in one pass each way. A warp owns a row (r, i) of [R, h, Nq, Nk]: each lane holds up to kMaxJ
// key columns (j = lane + 32 jj) of every head in registers, so the head mixes are per-lane
// products with the [h, h] mixes (staged in shared memory, zero-padded to H x H) and the softmax
// needs only warp reductions. Nothing but the logits (and, backward, the weights' gradient) is
// read, and nothing but the weights (the logits' gradient) and the row's log-sum-exps written:
// the unfused ops write and read the scaled and mixed logits, an f32 copy, the f32 softmax and a
// 16-bit copy of it. The mixes' gradients: each warp sums its rows' terms, a lane per (g, g')
// pair (warp sums in a fixed order), each block adds its warps' sums in warp order into one
// partial per block, and launch_column_sums adds the blocks' partials in a fixed order (no
// atomics: the same bits every run).
#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/talking_heads_geometry.h"
#include "cuda/kernels/common.cuh"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {
namespace {

constexpr int kWarps = 4;             // rows (warps) per block
constexpr int kMaxJ = 4;              // key columns per lane: up to 128 keys (J = 2: 64)
constexpr int kMaxHeads = 8;          // heads the kernels take (CaiT-S: 8)
constexpr int kBackwardBlocks = 1024;  // at most this many backward blocks (rows grid-strided)

// One step of warp_reduce_scatter at offset kHalf: each lane keeps the half of its first
// 2 kHalf values whose index has its own bit kHalf and adds its partner's sums of that half.
// (kHalf a template parameter: every index constant, so v stays in registers.)
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
  const bool upper = (lane & kHalf) != 0;
#pragma unroll
  for (int t = 0; t < kHalf; ++t) {
    const float keep = upper ? v[t + kHalf] : v[t];
    const float send = upper ? v[t] : v[t + kHalf];
    v[t] = keep + __shfl_xor_sync(0xffffffffu, send, kHalf);
  }
}

// v[t] summed over the warp's lanes, for each t < 32, the sum of v[lane] left on lane `lane`: a
// reduce-scatter in 31 shuffles (16 + 8 + 4 + 2 + 1; a warp_sum per value would take 160).
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[32], int lane) {
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return v[0];
}

// The [h, h] mixes into shared memory as H x H f32, zero outside h x h.
template <int H>
__device__ __forceinline__ void stage_mixes(const float* w_pre, const float* w_post, int h,
                                            float* pre, float* post) {
  for (int t = threadIdx.x; t < H * H; t += blockDim.x) {
    const int g = t / H, g2 = t % H;
    const bool in = g < h && g2 < h;
    pre[t] = in ? w_pre[g * h + g2] : 0.0f;
    post[t] = in ? w_post[g * h + g2] : 0.0f;
  }
}

// Row `row`'s element (g, j) offset: ((r h + g) Nq + i) Nk + j.
struct RowAt {
  int64_t base, head_stride;
  __device__ int64_t at(int g, int j) const { return base + g * head_stride + j; }
};
__device__ __forceinline__ RowAt row_at(int64_t row, int h, int nq, int nk) {
  const int64_t r = row / nq, i = row % nq;
  return {(r * h * nq + i) * nk, static_cast<int64_t>(nq) * nk};
}

// x[g][jj] = scale * logits (0 off the row or past h), m[g'][jj] = mix(x, pre).
template <typename T, int H, int J>
__device__ __forceinline__ void mixed_logits(const T* logits, const RowAt& at, int h, int nk,
                                             int lane, float scale, const float* pre,
                                             float (&x)[H][J], float (&m)[H][J]) {
#pragma unroll
  for (int jj = 0; jj < J; ++jj) {
    const int j = lane + 32 * jj;
#pragma unroll
    for (int g = 0; g < H; ++g) {
      x[g][jj] = (g < h && j < nk) ? __fmul_rn(scale, to_float(logits[at.at(g, j)])) : 0.0f;
    }
#pragma unroll
    for (int g2 = 0; g2 < H; ++g2) {
      float acc = 0.0f;
#pragma unroll
      for (int g = 0; g < H; ++g) acc = fmaf(pre[g * H + g2], x[g][jj], acc);
      m[g2][jj] = g2 < h ? acc : 0.0f;  // padded heads: exactly 0 (0 * inf would be NaN)
    }
  }
}

template <typename T, int H, int J>
__global__ void __launch_bounds__(kWarps * 32)
    talking_heads_forward_kernel(const T* __restrict__ logits, int64_t rows, int h, int nq, int nk,
                                 float scale, const float* __restrict__ w_pre,
                                 const float* __restrict__ w_post, T* __restrict__ out,
                                 float* __restrict__ lse) {
  __shared__ float pre[H * H], post[H * H];
  stage_mixes<H>(w_pre, w_post, h, pre, post);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp: one row each
  const RowAt at = row_at(row, h, nq, nk);
  float x[H][J], p[H][J];
  mixed_logits<T, H, J>(logits, at, h, nk, lane, scale, pre, x, p);
  const int64_t r = row / nq, i = row % nq;
#pragma unroll
  for (int g2 = 0; g2 < H; ++g2) {
    if (g2 >= h) break;
    float mx = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      if (lane + 32 * jj < nk) mx = fmaxf(mx, p[g2][jj]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      if (lane + 32 * jj < nk) s += expf(p[g2][jj] - mx);
    }
    const float l = mx + logf(warp_sum(s));
    if (lane == 0) lse[(r * h + g2) * nq + i] = l;
#pragma unroll
    for (int jj = 0; jj < J; ++jj) p[g2][jj] = lane + 32 * jj < nk ? expf(p[g2][jj] - l) : 0.0f;
  }
#pragma unroll
  for (int jj = 0; jj < J; ++jj) {
    const int j = lane + 32 * jj;
    if (j >= nk) break;
#pragma unroll
    for (int g3 = 0; g3 < H; ++g3) {
      if (g3 >= h) break;
      float acc = 0.0f;
#pragma unroll
      for (int g2 = 0; g2 < H; ++g2) acc = fmaf(post[g2 * H + g3], p[g2][jj], acc);
      out[at.at(g3, j)] = from_float<T>(acc);
    }
  }
}

// Lane `lane` owns the mix-gradient pairs k = lane + 32 q (q < kPairSlots) of the H x H.
template <int H>
constexpr int pair_slots() {
  return (H * H + 31) / 32;
}

// The row's term sum_j a[g][j] b[g'][j] of each pair k = (g, g') (k = g H + g'), summed over the
// warp and added to its owner's slot (lane k % 32, slot k / 32), 32 pairs at a time.
template <int H, int J>
__device__ __forceinline__ void add_pair_terms(const float (&a)[H][J], const float (&b)[H][J],
                                               int lane, float (&acc)[pair_slots<H>()]) {
#pragma unroll
  for (int q = 0; q < pair_slots<H>(); ++q) {
    float v[32];
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      const int k = 32 * q + t;
      v[t] = 0.0f;
      if (k < H * H) {
#pragma unroll
        for (int jj = 0; jj < J; ++jj) v[t] = fmaf(a[k / H][jj], b[k % H][jj], v[t]);
      }
    }
    acc[q] += warp_reduce_scatter(v, lane);
  }
}

// part: two planes [gridDim.x, h * h], w_pre's terms then w_post's, each block's sums of its
// warps' terms (in warp order); null when no mix gradient is wanted.
template <typename T, int H, int J>
__global__ void __launch_bounds__(kWarps * 32)
    talking_heads_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ logits,
                                  int64_t rows, int h, int nq, int nk, float scale,
                                  const float* __restrict__ w_pre, const float* __restrict__ w_post,
                                  const float* __restrict__ lse, T* __restrict__ grad_logits,
                                  float* __restrict__ part) {
  __shared__ float pre[H * H], post[H * H];
  stage_mixes<H>(w_pre, w_post, h, pre, post);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  float acc_pre[pair_slots<H>()] = {}, acc_post[pair_slots<H>()] = {};
  for (int64_t row = warp; row < rows; row += warps) {
    const RowAt at = row_at(row, h, nq, nk);
    const int64_t r = row / nq, i = row % nq;
    float x[H][J], p[H][J], go[H][J], d[H][J];
    mixed_logits<T, H, J>(logits, at, h, nk, lane, scale, pre, x, p);
#pragma unroll
    for (int g2 = 0; g2 < H; ++g2) {
      const float l = g2 < h ? lse[(r * h + g2) * nq + i] : 0.0f;
#pragma unroll
      for (int jj = 0; jj < J; ++jj) {
        const int j = lane + 32 * jj;
        const bool in = g2 < h && j < nk;
        p[g2][jj] = in ? expf(p[g2][jj] - l) : 0.0f;
        go[g2][jj] = in ? to_float(grad_out[at.at(g2, j)]) : 0.0f;
      }
    }
    if (part != nullptr) add_pair_terms<H, J>(p, go, lane, acc_post);
      // d = dP = mix of the weights' gradient by post^T; then, in place, dM = P (dP - delta).
#pragma unroll
    for (int g2 = 0; g2 < H; ++g2) {
      float delta = 0.0f;
#pragma unroll
      for (int jj = 0; jj < J; ++jj) {
        float acc = 0.0f;
#pragma unroll
        for (int g3 = 0; g3 < H; ++g3) acc = fmaf(post[g2 * H + g3], go[g3][jj], acc);
        d[g2][jj] = acc;
        delta = fmaf(acc, p[g2][jj], delta);
      }
      delta = warp_sum(delta);
#pragma unroll
      for (int jj = 0; jj < J; ++jj) d[g2][jj] = p[g2][jj] * (d[g2][jj] - delta);
    }
    if (part != nullptr) add_pair_terms<H, J>(x, d, lane, acc_pre);
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const int j = lane + 32 * jj;
      if (j >= nk) break;
#pragma unroll
      for (int g = 0; g < H; ++g) {
        if (g >= h) break;
        float acc = 0.0f;
#pragma unroll
        for (int g2 = 0; g2 < H; ++g2) acc = fmaf(pre[g * H + g2], d[g2][jj], acc);
        grad_logits[at.at(g, j)] = from_float<T>(__fmul_rn(scale, acc));
      }
    }
  }
  if (part == nullptr) return;  // the same for the whole block
  __shared__ float sums[kWarps][2][H * H];
  const int in_block = threadIdx.x >> 5;
#pragma unroll
  for (int q = 0; q < pair_slots<H>(); ++q) {
    const int k = lane + 32 * q;
    if (k < H * H) {
      sums[in_block][0][k] = acc_pre[q];
      sums[in_block][1][k] = acc_post[q];
    }
  }
  __syncthreads();
  const int hh = h * h;
  for (int t = threadIdx.x; t < 2 * hh; t += blockDim.x) {
    const int which = t / hh, k = t % hh / h * H + t % h;
    float s = sums[0][which][k];
    for (int w = 1; w < kWarps; ++w) s += sums[w][which][k];
    part[(static_cast<int64_t>(which) * gridDim.x + blockIdx.x) * hh + t % hh] = s;
  }
}

// Calls f(std::integral_constant<int, H>{}, std::integral_constant<int, J>{}) for the heads
// padded to 2, 4 or 8 and the key columns per lane: 2 up to 64 keys (CaiT's patch attention),
// else 4.
template <typename F>
void dispatch_shape(int64_t heads, int64_t keys, F&& f) {
  const auto by_keys = [&](auto h) {
    if (keys <= 64) return f(h, std::integral_constant<int, 2>{});
    return f(h, std::integral_constant<int, kMaxJ>{});
  };
  if (heads <= 2) return by_keys(std::integral_constant<int, 2>{});
  if (heads <= 4) return by_keys(std::integral_constant<int, 4>{});
  return by_keys(std::integral_constant<int, 8>{});
}

// The backward pass's blocks (rows grid-strided beyond kBackwardBlocks of them).
int64_t backward_blocks(const TalkingHeadsGeometry& geo) {
  return std::min<int64_t>((geo.rows() + kWarps - 1) / kWarps, kBackwardBlocks);
}

// The floats of the backward pass's mix-gradient partials: two h x h per block.
int64_t backward_partial_floats(const TalkingHeadsGeometry& geo) {
  return backward_blocks(geo) * 2 * geo.heads * geo.heads;
}

void check_supported(const char* kernel, const TalkingHeadsGeometry& geo) {
  SKA_CHECK(geo.heads >= 1 && geo.heads <= kMaxHeads && geo.keys <= 32 * kMaxJ, ShapeError, kernel,
            ": the CUDA kernels take up to ", kMaxHeads, " heads and ", 32 * kMaxJ, " keys, got ",
            geo.heads, " heads and ", geo.keys, " keys");
  SKA_CHECK(geo.queries <= INT32_MAX && geo.rows() / kWarps < INT32_MAX, ShapeError, kernel, ": ",
            geo.rows(), " rows: too many");
}

// talking_heads_softmax_forward's launch once its operands are checked (rows and keys).
template <typename T>
void launch_forward(const TalkingHeadsGeometry& geo, const T* logits, float scale,
                    const float* w_pre, const float* w_post, T* out, float* lse,
                    cudaStream_t stream) {
  const auto blocks = static_cast<unsigned int>((geo.rows() + kWarps - 1) / kWarps);
  dispatch_shape(geo.heads, geo.keys, [&](auto heads, auto columns) {
    constexpr int H = decltype(heads)::value, J = decltype(columns)::value;
    launch_kernel(talking_heads_forward_kernel<T, H, J>, blocks, kWarps * 32, 0, stream, logits,
                  geo.rows(), static_cast<int>(geo.heads), static_cast<int>(geo.queries),
                  static_cast<int>(geo.keys), scale, w_pre, w_post, out, lse);
  });
}

// talking_heads_softmax_backward's launches once its operands are checked (rows and keys):
// grad_pre and grad_post (either null: not wanted) through `part` (backward_partial_floats of
// them; null when neither is wanted).
template <typename T>
void launch_backward(const TalkingHeadsGeometry& geo, const T* grad_out, const T* logits,
                     float scale, const float* w_pre, const float* w_post, const float* lse,
                     T* grad_logits, float* grad_pre, float* grad_post, float* part,
                     cudaStream_t stream) {
  const int64_t blocks = backward_blocks(geo), hh = geo.heads * geo.heads;
  const bool sums = grad_pre != nullptr || grad_post != nullptr;
  dispatch_shape(geo.heads, geo.keys, [&](auto heads, auto columns) {
    constexpr int H = decltype(heads)::value, J = decltype(columns)::value;
    launch_kernel(talking_heads_backward_kernel<T, H, J>, static_cast<unsigned int>(blocks),
                  kWarps * 32, 0, stream, grad_out, logits, geo.rows(), static_cast<int>(geo.heads),
                  static_cast<int>(geo.queries), static_cast<int>(geo.keys), scale, w_pre, w_post,
                  lse, grad_logits, sums ? part : nullptr);
  });
  if (sums) {
    launch_column_sums<float>(part, part + blocks * hh, blocks, hh, grad_pre, grad_post, stream);
  }
}

// Calls f(T{}) for the logits' dtype.
template <typename F>
void dispatch_logits(DType dtype, const char* kernel, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF16:
      return f(__half{});
    default:
      SKA_FAIL(DTypeError, kernel, ": logits must be f32, bf16 or f16 on CUDA, got ",
               dtype_name(dtype));
  }
}

}  // namespace

// The tensor-level entry points (tests/simt runs launch_forward and launch_backward on raw host
// operands).
#if !defined(SKA_SIMT_KERNELS_ONLY)
void talking_heads_softmax_forward(const Tensor& logits, double scale, const Tensor& w_pre,
                                   const Tensor& w_post, const Tensor& out, const Tensor& lse) {
  const char* kKernel = "talking_heads_softmax_forward";
  const TalkingHeadsGeometry geo = talking_heads_geometry(kKernel, logits, w_pre, w_post, out, lse);
  check_supported(kKernel, geo);
  if (geo.rows() == 0 || geo.keys == 0) return;
  const int device = device_index(logits);
  DeviceGuard guard(device);
  dispatch_logits(logits.dtype(), kKernel, [&](auto t) {
    using T = decltype(t);
    launch_forward<T>(geo, static_cast<const T*>(logits.data_ptr()), static_cast<float>(scale),
                      static_cast<const float*>(w_pre.data_ptr()),
                      static_cast<const float*>(w_post.data_ptr()), static_cast<T*>(out.data_ptr()),
                      static_cast<float*>(lse.data_ptr()), current_stream(device));
  });
}

void talking_heads_softmax_backward(const Tensor& grad_out, const Tensor& logits, double scale,
                                    const Tensor& w_pre, const Tensor& w_post, const Tensor& lse,
                                    const Tensor& grad_logits, const Tensor& grad_pre,
                                    const Tensor& grad_post) {
  const char* kKernel = "talking_heads_softmax_backward";
  const TalkingHeadsGeometry geo = talking_heads_backward_geometry(
      kKernel, grad_out, logits, w_pre, w_post, lse, grad_logits, grad_pre, grad_post);
  check_supported(kKernel, geo);
  const int device = device_index(logits);
  DeviceGuard guard(device);
  const cudaStream_t s = current_stream(device);
  if (geo.rows() == 0 || geo.keys == 0) {  // no terms: the mixes' gradients are zero
    for (const Tensor* t : {&grad_pre, &grad_post}) {
      if (t->defined() && t->numel() > 0)
        SKA_CUDA_CHECK(cudaMemsetAsync(t->data_ptr(), 0, t->numel() * t->element_size(), s));
    }
    return;
  }
  const bool sums = grad_pre.defined() || grad_post.defined();
  const Tensor ws =
      sums ? workspace(device, backward_partial_floats(geo) * sizeof(float)) : Tensor();
  dispatch_logits(logits.dtype(), kKernel, [&](auto t) {
    using T = decltype(t);
    launch_backward<T>(
        geo, static_cast<const T*>(grad_out.data_ptr()), static_cast<const T*>(logits.data_ptr()),
        static_cast<float>(scale), static_cast<const float*>(w_pre.data_ptr()),
        static_cast<const float*>(w_post.data_ptr()), static_cast<const float*>(lse.data_ptr()),
        static_cast<T*>(grad_logits.data_ptr()), mutable_or_null<float>(grad_pre),
        mutable_or_null<float>(grad_post), sums ? static_cast<float*>(ws.data_ptr()) : nullptr, s);
  });
}
#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
