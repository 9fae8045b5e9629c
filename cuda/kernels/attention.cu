// Fused attention on CUDA, out = softmax(scale * q k^T + bias) v, flash-attention style: the
// Nq x Nk weights only ever exist a tile at a time, in registers and shared memory.
//
// Design (scalar f32 FMAs). bf16 and f16 problems with head dims that are multiples of 16 go to
// the tensor-core kernels of attention_tc.cu instead (unless set_cuda_attention_tensor_cores
// switched them off); these kernels serve f32 and the other head dims, and are the reference the
// tensor-core path is tested against. A block has 1 to 4 warps; each warp
// owns kRowsPerWarp = 8 rows of one side, and its 32 lanes walk 32-wide tiles of the other side:
//   forward, dQ: rows are queries, lanes keys; a block per (leading index, 8 x warps queries)
//                walks every key tile;
//   dK, dV:      rows are keys, lanes queries; a block per (leading index, 8 x warps keys)
//                walks every query tile.
// Each step is two small products on f32 tiles staged in shared memory (dot_rows, accumulate):
// the warp's 8 x 32 logits as dot products over the head dim, then 8 x (head dim) accumulators
// (lane c owns columns c, c + 32, ...) += the 8 x 32 weights, passed through a per-warp shared
// buffer, times the 32-row tile. The forward keeps an f32 running max and sum per row (online
// softmax) and writes lse; the backward recomputes P = exp(z - lse), first computes
// D = rowsum(dO * O), then dK and dV in one kernel and dQ and grad_bias in another, each
// recomputing the logits. There are no atomics: each gradient element is summed by one thread
// in a fixed order, so the results are the same bits on every run.
// Limits: d, dv <= kMaxHeadDim = 128 (4 accumulator columns per lane; ValueError beyond, the op
// layer falls back to the unfused path). Shared memory per block: up to 31 KiB for head dims up
// to 32, 47 KiB up to 64, 79 KiB up to 128 (opted in with cudaFuncSetAttribute above 48 KiB;
// sm_80..sm_90 allow at least 99 KiB).
// The mma.sync kernels of attention_mma.cu (set_cuda_attention_mma) keep the softmax on the
// accumulators in registers; beyond them: ldmatrix, tf32 for f32, cp.async double buffering,
// a swizzled tile layout instead of padded rows.
// tests/simt runs these kernels' own code on the CPU (scalar_forward, launch_delta and
// scalar_backward on host memory: tests/simt/test_attention_scalar.cpp).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "cuda/kernels/attention_tc.cuh"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

using attn::BackwardArgs;
using attn::bias_at;
using attn::ForwardArgs;
using attn::grid_of;
using attn::Inputs;
using attn::launch;
using attn::View;

constexpr int64_t kMaxHeadDim = 128;  // d and dv: at most 4 accumulator columns per lane
constexpr int kLaneTile = 32;         // the tile the lanes walk: keys (queries for dK/dV)
constexpr int kRowsPerWarp = 8;       // the rows a warp owns: queries (keys for dK/dV)
constexpr int kMaxWarps = 4;          // a block owns 8 to 32 rows
constexpr int kDeltaWarps = 8;        // D = rowsum(dO * O): one warp per row, 8 rows per block

// Shared tiles hold rows of kC * 32 f32 values (zero past the head dim, so that the float4 dot
// products and the lane-owned columns read zeros there) kC * 32 + 4 floats apart: rows stay
// 16-byte aligned, and an odd number of 16-byte units apart, so 8 lanes reading 8 rows as float4
// hit distinct banks.
template <int kC>
constexpr int tile_stride() {
  return kC * 32 + 4;
}

__device__ __forceinline__ int round_up4(int n) { return (n + 3) & ~3; }
// The lane-tile rows worth reading from `start` on: up to n, rounded up to 4, at most 32.
__device__ __forceinline__ int tile_rows4(int n, int start) {
  return min(kLaneTile, round_up4(n - start));
}

// Rows [row0, row0 + rows) of one leading index's operand (`base` at its offset, `v` its view) as
// f32 rows of a shared tile; zero past row n and past column `cols`. The whole block loads.
template <int kC, typename T>
__device__ void load_rows(float* tile, const T* base, const View& v, int row0, int rows, int n,
                          int cols) {
  constexpr int kWidth = kC * 32;
  for (int e = threadIdx.x; e < rows * kWidth; e += blockDim.x) {
    const int r = e / kWidth, c = e % kWidth, i = row0 + r;
    tile[r * tile_stride<kC>() + c] =
        i < n && c < cols ? to_float(base[i * v.row + c * v.col]) : 0.0f;
  }
}

// acc[r] += <rows[r], lane_row> over the first n4 columns (a multiple of 4): `rows` are the warp's
// 8 rows of a tile (the same address for every lane: a broadcast), `lane_row` the lane's own row.
template <int kC>
__device__ __forceinline__ void dot_rows(const float* rows, const float* lane_row, int n4,
                                         float (&acc)[kRowsPerWarp]) {
  for (int c = 0; c < n4; c += 4) {
    const float4 b = *reinterpret_cast<const float4*>(lane_row + c);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float4 a = *reinterpret_cast<const float4*>(rows + r * tile_stride<kC>() + c);
      acc[r] = fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc[r]))));
    }
  }
}

// acc[r][i] += sum over t < n4 of w[r][t] * tile[t][lane + 32 i]: the warp's 8 x 32 weights (a
// shared buffer, rows 32 floats apart) times the first n4 rows of a 32-row tile (n4 a multiple
// of 4). Fixed summation order: deterministic.
template <int kC>
__device__ __forceinline__ void accumulate(const float* w, const float* tile, int n4,
                                           float (&acc)[kRowsPerWarp][kC]) {
  const int lane = threadIdx.x & 31;
  for (int t = 0; t < n4; t += 4) {
    float x[4][kC];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int i = 0; i < kC; ++i) x[u][i] = tile[(t + u) * tile_stride<kC>() + lane + 32 * i];
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float4 p = *reinterpret_cast<const float4*>(w + r * kLaneTile + t);
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        acc[r][i] = fmaf(p.w, x[3][i],
                         fmaf(p.z, x[2][i], fmaf(p.y, x[1][i], fmaf(p.x, x[0][i], acc[r][i]))));
      }
    }
  }
}

// Dynamic shared memory of each kernel, in bytes, for `rows` = 8 x warps rows per block. The
// kernels carve it (as floats) in the order listed.
template <int kC>
size_t forward_smem_bytes(int rows) {  // q rows, k and v tiles, weights
  return sizeof(float) *
         (rows * tile_stride<kC>() + 2 * kLaneTile * tile_stride<kC>() + rows * kLaneTile);
}
template <int kC>
size_t grad_q_smem_bytes(int rows) {  // q and dO rows, k and v tiles, dZ
  return sizeof(float) *
         (2 * rows * tile_stride<kC>() + 2 * kLaneTile * tile_stride<kC>() + rows * kLaneTile);
}
template <int kC>
size_t grad_kv_smem_bytes(int rows) {  // k and v rows, q and dO tiles, P, dZ, bias tile, lse, D
  return sizeof(float) * (2 * rows * tile_stride<kC>() + 2 * kLaneTile * tile_stride<kC>() +
                          2 * rows * kLaneTile + kLaneTile * (rows + 1) + 2 * kLaneTile);
}

// --- Forward: a block per (leading index g, tile of queries); online softmax over key tiles ---
template <typename T, int kC>
__global__ void __launch_bounds__(kMaxWarps * 32) attention_forward_kernel(ForwardArgs<T> a) {
  constexpr int kStride = tile_stride<kC>();
  extern __shared__ float4 smem4[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kRowsPerWarp;  // 8 x warps queries from i0 on
  const int64_t g = blockIdx.x / a.tiles;
  const int i0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = i0 + warp * kRowsPerWarp;       // the warp's first query
  float* q_s = reinterpret_cast<float*>(smem4);  // [rows][kStride]
  float* k_s = q_s + rows * kStride;             // [32][kStride]
  float* v_s = k_s + kLaneTile * kStride;        // [32][kStride]
  float* w_s = v_s + kLaneTile * kStride;        // [rows][32]: the weights
  w_s += warp * kRowsPerWarp * kLaneTile;        // this warp's [8][32]

  const T* kg = in.k + in.kv.lead.offset(g);
  const T* vg = in.v + in.vv.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  load_rows<kC>(q_s, in.q + in.qv.lead.offset(g), in.qv, i0, rows, in.nq, in.d);
  const bool active = w0 < in.nq;  // warp-uniform
  const float* q_w = q_s + warp * kRowsPerWarp * kStride;
  const int d4 = round_up4(in.d);

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;  // this lane's share of the row's sum, relative to m[r]
#pragma unroll
    for (int i = 0; i < kC; ++i) o[r][i] = 0.0f;
  }
  for (int j0 = 0; j0 < in.nk; j0 += kLaneTile) {
    __syncthreads();  // every warp is done with the previous tiles (and q_s is loaded)
    load_rows<kC>(k_s, kg, in.kv, j0, kLaneTile, in.nk, in.d);
    load_rows<kC>(v_s, vg, in.vv, j0, kLaneTile, in.nk, in.dv);
    __syncthreads();
    if (!active) continue;
    float s[kRowsPerWarp] = {};
    dot_rows<kC>(q_w, k_s + lane * kStride, d4, s);
    const int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = w0 + r;
      float z = -INFINITY;
      if (j < in.nk && !attn::excluded(in, i, j)) {
        z = scale * s[r];
        if (bg != nullptr && i < in.nq) z += bscale * bias_at(bg, in.bv, i, j);
      }
      const float m_new = fmaxf(m[r], warp_max(z));
      // While every z of the row so far is -inf, measure from 0: the weights stay 0, not NaN.
      const float ref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m[r] - ref);
      const float p = expf(z - ref);
      l[r] = l[r] * alpha + p;
#pragma unroll
      for (int c = 0; c < kC; ++c) o[r][c] *= alpha;
      m[r] = m_new;
      w_s[r * kLaneTile + lane] = p;
    }
    __syncwarp();
    accumulate<kC>(w_s, v_s, tile_rows4(in.nk, j0), o);
  }
  if (!active) return;
  T* og = a.out + a.ov.lead.offset(g);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = w0 + r;
    if (i >= in.nq) break;  // warp-uniform
    const auto [inv, lse] = attn::row_end(warp_sum(l[r]), m[r], in.nk);
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int col = lane + 32 * c;
      if (col < in.dv) og[i * a.ov.row + col * a.ov.col] = from_float<T>(o[r][c] * inv);
    }
    if (lane == 0) a.lse[g * in.nq + i] = lse;
  }
}

// --- Backward ---

// delta[g * nq + i] = sum over c of dO[g, i, c] * out[g, i, c] for the rows g * nq + i < rows:
// one warp per row.
template <typename T>
__global__ void attention_delta_kernel(const T* out, View ov, const T* go, View gov, float* delta,
                                       int64_t rows, int nq, int dv) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t g = row / nq;
  const int i = static_cast<int>(row % nq), lane = threadIdx.x % 32;
  const T* o = out + ov.lead.offset(g) + i * ov.row;
  const T* dout = go + gov.lead.offset(g) + i * gov.row;
  float s = 0.0f;
  for (int c = lane; c < dv; c += 32) s += to_float(dout[c * gov.col]) * to_float(o[c * ov.col]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// attention_delta_kernel with 16-byte loads: `lanes` (a power of two, dv / (16 / sizeof(T)))
// lanes a row, each multiplying one vector of dO and of O, then summing across its row's lanes;
// 32 / lanes rows a warp. Every row of both operands starts 16-byte aligned (the host checks).
template <typename T>
__global__ void attention_delta_vector_kernel(const T* out, View ov, const T* go, View gov,
                                              float* delta, int64_t rows, int nq, int lanes) {
  constexpr int kVec = 16 / sizeof(T);
  const int lane = threadIdx.x % 32, part = lane % lanes;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / 32;
  const int64_t row = warp * (32 / lanes) + lane / lanes;
  float s = 0.0f;
  if (row < rows) {
    const int64_t g = row / nq;
    const int i = static_cast<int>(row % nq);
    const uint4 o =
        *reinterpret_cast<const uint4*>(out + ov.lead.offset(g) + i * ov.row + part * kVec);
    const uint4 d =
        *reinterpret_cast<const uint4*>(go + gov.lead.offset(g) + i * gov.row + part * kVec);
    const T* ov_elems = reinterpret_cast<const T*>(&o);
    const T* dv_elems = reinterpret_cast<const T*>(&d);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += to_float(dv_elems[k]) * to_float(ov_elems[k]);
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) {  // within the row's lanes
    s += __shfl_xor_sync(0xffffffffu, s, offset);
  }
  if (row < rows && part == 0) delta[row] = s;
}

// The lanes a row takes in attention_delta_vector_kernel for operands `a` and `b` of views av and
// bv with dv columns, or 0 where it cannot take them: 16-byte vectors need dense, aligned rows,
// and `fast` (elementwise_fast_paths).
template <typename T>
int delta_vector_lanes(const T* a, const View& av, const T* b, const View& bv, int dv, bool fast) {
  constexpr int kVec = 16 / sizeof(T);
  if (!fast || dv <= 0 || dv % kVec != 0) return 0;
  const int lanes = dv / kVec;
  if (lanes > 32 || (lanes & (lanes - 1)) != 0) return 0;
  const auto dense = [](const T* p, const View& v) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || v.col != 1 || v.row % kVec != 0) return false;
    for (int d = 0; d < v.lead.ndim; ++d) {
      if (v.lead.sizes[d] > 1 && v.lead.strides[d] % kVec != 0) return false;
    }
    return true;
  };
  return dense(a, av) && dense(b, bv) ? lanes : 0;
}

// dQ and grad_bias: a block per (leading index g, tile of queries), walking the key tiles.
//   dZ[i, j] = P[i, j] * (dO[i] . v[j] - D[i]),  dQ[i] = scale * sum over j of dZ[i, j] k[j].
template <typename T, int kC>
__global__ void __launch_bounds__(kMaxWarps * 32) attention_grad_q_kernel(BackwardArgs<T> a) {
  constexpr int kStride = tile_stride<kC>();
  extern __shared__ float4 smem4[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kRowsPerWarp;  // 8 x warps queries from i0 on
  const int64_t g = blockIdx.x / a.tiles;
  const int i0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = i0 + warp * kRowsPerWarp;       // the warp's first query
  float* q_s = reinterpret_cast<float*>(smem4);  // [rows][kStride]
  float* go_s = q_s + rows * kStride;            // [rows][kStride]
  float* k_s = go_s + rows * kStride;            // [32][kStride]
  float* v_s = k_s + kLaneTile * kStride;        // [32][kStride]
  float* w_s = v_s + kLaneTile * kStride;        // [rows][32]: the weights
  w_s += warp * kRowsPerWarp * kLaneTile;        // this warp's [8][32]

  const T* kg = in.k + in.kv.lead.offset(g);
  const T* vg = in.v + in.vv.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  T* gbg = attn::grad_bias_of(a, g);
  load_rows<kC>(q_s, in.q + in.qv.lead.offset(g), in.qv, i0, rows, in.nq, in.d);
  load_rows<kC>(go_s, a.go + a.gov.lead.offset(g), a.gov, i0, rows, in.nq, in.dv);
  const bool active = w0 < in.nq;
  const float* q_w = q_s + warp * kRowsPerWarp * kStride;
  const float* go_w = go_s + warp * kRowsPerWarp * kStride;
  const int d4 = round_up4(in.d), dv4 = round_up4(in.dv);

  float lse[kRowsPerWarp], delta[kRowsPerWarp], acc[kRowsPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = w0 + r;
    lse[r] = i < in.nq ? a.lse[g * in.nq + i] : 0.0f;
    delta[r] = i < in.nq ? a.delta[g * in.nq + i] : 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[r][c] = 0.0f;
  }
  for (int j0 = 0; j0 < in.nk; j0 += kLaneTile) {
    __syncthreads();
    load_rows<kC>(k_s, kg, in.kv, j0, kLaneTile, in.nk, in.d);
    load_rows<kC>(v_s, vg, in.vv, j0, kLaneTile, in.nk, in.dv);
    __syncthreads();
    if (!active) continue;
    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    dot_rows<kC>(q_w, k_s + lane * kStride, d4, s);
    dot_rows<kC>(go_w, v_s + lane * kStride, dv4, dp);
    const int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int i = w0 + r;
      float dz = 0.0f;
      if (i < in.nq && j < in.nk) {
        if (!attn::excluded(in, i, j)) {
          float z = scale * s[r];
          if (bg != nullptr) z += bscale * bias_at(bg, in.bv, i, j);
          dz = expf(z - lse[r]) * (dp[r] - delta[r]);
        }
        if (gbg != nullptr) attn::store_grad_bias(gbg, a, i, j, bscale, dz);
      }
      w_s[r * kLaneTile + lane] = dz;
    }
    __syncwarp();
    accumulate<kC>(w_s, k_s, tile_rows4(in.nk, j0), acc);
  }
  if (!active) return;
  T* gq = a.gq + a.gqv.lead.offset(g);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = w0 + r;
    if (i >= in.nq) break;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int col = lane + 32 * c;
      if (col < in.d) gq[i * a.gqv.row + col] = from_float<T>(scale * acc[r][c]);
    }
  }
}

// dK and dV: a block per (leading index g, tile of keys), walking the query tiles.
//   dV[j] = sum over i of P[i, j] dO[i],  dK[j] = scale * sum over i of dZ[i, j] q[i].
template <typename T, int kC>
__global__ void __launch_bounds__(kMaxWarps * 32) attention_grad_kv_kernel(BackwardArgs<T> a) {
  constexpr int kStride = tile_stride<kC>();
  extern __shared__ float4 smem4[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kRowsPerWarp;  // 8 x warps keys from j0 on
  const int64_t g = blockIdx.x / a.tiles;
  const int j0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = j0 + warp * kRowsPerWarp;       // the warp's first key
  float* k_s = reinterpret_cast<float*>(smem4);  // [rows][kStride]
  float* v_s = k_s + rows * kStride;             // [rows][kStride]
  float* q_s = v_s + rows * kStride;             // [32][kStride]
  float* go_s = q_s + kLaneTile * kStride;       // [32][kStride]
  float* p_s = go_s + kLaneTile * kStride;       // [rows][32]
  float* dz_s = p_s + rows * kLaneTile;          // [rows][32]
  float* b_s = dz_s + rows * kLaneTile;          // [32][rows + 1]: odd stride, no bank conflicts
  float* lse_s = b_s + kLaneTile * (rows + 1);   // [32]
  float* delta_s = lse_s + kLaneTile;            // [32]
  float* p_w = p_s + warp * kRowsPerWarp * kLaneTile;
  float* dz_w = dz_s + warp * kRowsPerWarp * kLaneTile;

  const T* qg = in.q + in.qv.lead.offset(g);
  const T* gog = a.go + a.gov.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  load_rows<kC>(k_s, in.k + in.kv.lead.offset(g), in.kv, j0, rows, in.nk, in.d);
  load_rows<kC>(v_s, in.v + in.vv.lead.offset(g), in.vv, j0, rows, in.nk, in.dv);
  const bool active = w0 < in.nk;
  const float* k_w = k_s + warp * kRowsPerWarp * kStride;
  const float* v_w = v_s + warp * kRowsPerWarp * kStride;
  const int d4 = round_up4(in.d), dv4 = round_up4(in.dv);

  float acc_k[kRowsPerWarp][kC], acc_v[kRowsPerWarp][kC];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < kC; ++c) acc_k[r][c] = acc_v[r][c] = 0.0f;
  }
  for (int i0 = 0; i0 < in.nq; i0 += kLaneTile) {
    __syncthreads();
    load_rows<kC>(q_s, qg, in.qv, i0, kLaneTile, in.nq, in.d);
    load_rows<kC>(go_s, gog, a.gov, i0, kLaneTile, in.nq, in.dv);
    if (threadIdx.x < kLaneTile) {
      const int i = i0 + threadIdx.x;
      lse_s[threadIdx.x] = i < in.nq ? a.lse[g * in.nq + i] : 0.0f;
      delta_s[threadIdx.x] = i < in.nq ? a.delta[g * in.nq + i] : 0.0f;
    }
    if (bg != nullptr) {  // read along the keys: coalesced for a row-major bias
      for (int e = threadIdx.x; e < kLaneTile * rows; e += blockDim.x) {
        const int ti = e / rows, tj = e % rows, i = i0 + ti, j = j0 + tj;
        b_s[ti * (rows + 1) + tj] =
            i < in.nq && j < in.nk ? bscale * bias_at(bg, in.bv, i, j) : 0.0f;
      }
    }
    __syncthreads();
    if (!active) continue;
    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    dot_rows<kC>(k_w, q_s + lane * kStride, d4, s);
    dot_rows<kC>(v_w, go_s + lane * kStride, dv4, dp);
    const int i = i0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int j = w0 + r;
      float p = 0.0f, dz = 0.0f;
      if (i < in.nq && j < in.nk && !attn::excluded(in, i, j)) {
        float z = scale * s[r];
        if (bg != nullptr) z += b_s[lane * (rows + 1) + warp * kRowsPerWarp + r];
        p = expf(z - lse_s[lane]);
        dz = p * (dp[r] - delta_s[lane]);
      }
      p_w[r * kLaneTile + lane] = p;
      dz_w[r * kLaneTile + lane] = dz;
    }
    __syncwarp();
    const int n4 = tile_rows4(in.nq, i0);
    accumulate<kC>(p_w, go_s, n4, acc_v);
    accumulate<kC>(dz_w, q_s, n4, acc_k);
  }
  if (!active) return;
  T* gk = a.gk + a.gkv.lead.offset(g);
  T* gv = a.gv + a.gvv.lead.offset(g);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int j = w0 + r;
    if (j >= in.nk) break;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int col = lane + 32 * c;
      if (col < in.d) gk[j * a.gkv.row + col] = from_float<T>(scale * acc_k[r][c]);
      if (col < in.dv) gv[j * a.gvv.row + col] = from_float<T>(acc_v[r][c]);
    }
  }
}

// --- Host side: launches on raw operands (what tests/simt runs) ---

// Calls f(std::integral_constant<int, kC>{}) with kC the accumulator columns per lane that cover
// both head dims: 1 (up to 32), 2 (up to 64) or 4 (up to 128).
template <typename F>
void dispatch_columns(int d, int dv, F&& f) {
  attn::dispatch_head_dim(
      d, dv, [&](auto head) { f(std::integral_constant<int, decltype(head)::value / 32>{}); });
}

// Warps per block for n rows on the warps' side: as many as have rows, at most kMaxWarps.
int warps_for(int n) { return std::clamp((n + kRowsPerWarp - 1) / kRowsPerWarp, 1, kMaxWarps); }

}  // namespace

namespace attn {

template <typename T>
void scalar_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  if (groups == 0 || a.in.nq == 0) return;
  const int warps = warps_for(a.in.nq);
  a.tiles = (a.in.nq + warps * kRowsPerWarp - 1) / (warps * kRowsPerWarp);
  a.groups = groups;
  const unsigned int grid = grid_of("attention_forward", groups, a.tiles);
  dispatch_columns(a.in.d, a.in.dv, [&](auto columns) {
    constexpr int kC = decltype(columns)::value;
    launch(attention_forward_kernel<T, kC>, grid, warps,
           forward_smem_bytes<kC>(warps * kRowsPerWarp), stream, a);
  });
}

template <typename T>
void launch_delta(const T* out, const View& ov, const T* go, const View& gov, float* delta,
                  int64_t rows, int nq, int dv, bool fast, cudaStream_t stream) {
  if (rows == 0) return;
  const char* kKernel = "attention_backward";
  const int lanes = delta_vector_lanes(out, ov, go, gov, dv, fast);
  if (lanes > 0) {
    const int64_t rows_per_block = static_cast<int64_t>(kDeltaWarps) * (32 / lanes);
    const unsigned int grid = grid_of(kKernel, (rows + rows_per_block - 1) / rows_per_block, 1);
    launch_kernel(attention_delta_vector_kernel<T>, dim3(grid), dim3(kDeltaWarps * 32), 0, stream,
                  out, ov, go, gov, delta, rows, nq, lanes);
  } else {
    const unsigned int grid = grid_of(kKernel, (rows + kDeltaWarps - 1) / kDeltaWarps, 1);
    launch_kernel(attention_delta_kernel<T>, dim3(grid), dim3(kDeltaWarps * 32), 0, stream, out, ov,
                  go, gov, delta, rows, nq, dv);
  }
}

template <typename T>
void scalar_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  if (groups == 0) return;
  const char* kKernel = "attention_backward";
  a.groups = groups;
  dispatch_columns(a.in.d, a.in.dv, [&](auto columns) {
    constexpr int kC = decltype(columns)::value;
    if (a.in.nk > 0) {  // dK, dV (zero when there are no queries)
      const int warps = warps_for(a.in.nk);
      BackwardArgs<T> kv = a;
      kv.tiles = (a.in.nk + warps * kRowsPerWarp - 1) / (warps * kRowsPerWarp);
      launch(attention_grad_kv_kernel<T, kC>, grid_of(kKernel, groups, kv.tiles), warps,
             grad_kv_smem_bytes<kC>(warps * kRowsPerWarp), stream, kv);
    }
    if (a.in.nq > 0) {  // dQ (zero when there are no keys) and grad_bias
      const int warps = warps_for(a.in.nq);
      BackwardArgs<T> qa = a;
      qa.tiles = (a.in.nq + warps * kRowsPerWarp - 1) / (warps * kRowsPerWarp);
      launch(attention_grad_q_kernel<T, kC>, grid_of(kKernel, groups, qa.tiles), warps,
             grad_q_smem_bytes<kC>(warps * kRowsPerWarp), stream, qa);
    }
  });
}

#define SKA_ATTENTION_SCALAR(T)                                                                \
  template void scalar_forward<T>(ForwardArgs<T>, int64_t, cudaStream_t);                      \
  template void scalar_backward<T>(BackwardArgs<T>, int64_t, cudaStream_t);                    \
  template void launch_delta<T>(const T*, const View&, const T*, const View&, float*, int64_t, \
                                int, int, bool, cudaStream_t);
SKA_ATTENTION_SCALAR(float)
SKA_ATTENTION_SCALAR(__nv_bfloat16)
SKA_ATTENTION_SCALAR(__half)
#undef SKA_ATTENTION_SCALAR

}  // namespace attn

// --- Host side: the tensor entry points (left out of tests/simt's host build) ---

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

std::atomic<bool> g_async_loads{true};  // set_cuda_attention_async_loads

struct Geometry {
  int64_t nlead = 0;   // number of leading dims
  int64_t groups = 0;  // their product
  int nq = 0, nk = 0, d = 0, dv = 0;
};

Shape with_last(const Shape& lead, int64_t a, int64_t b) {
  Shape s = lead;
  s.push_back(a);
  s.push_back(b);
  return s;
}

// Checks the shapes, dtypes and devices of the operands (as the CPU twin, plus the head dim limit
// and the dtype of the bias) and returns the sizes.
Geometry check_geometry(const char* kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& bias, const Tensor& out) {
  SKA_CHECK(q.dtype() == DType::kF32 || q.dtype() == DType::kBF16 || q.dtype() == DType::kF16,
            DTypeError, "cuda kernel '", kernel, "' supports f32, bf16 and f16, got ",
            dtype_name(q.dtype()));
  const int64_t rank = q.dim();
  SKA_CHECK(rank >= 3 && rank <= 6 && k.dim() == rank && v.dim() == rank && out.dim() == rank,
            ShapeError, kernel, ": q, k, v and out need the same rank (3 to 6), got ", q.str(),
            ", ", k.str(), ", ", v.str(), ", ", out.str());
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  const int64_t nq = q.size(-2), d = q.size(-1), nk = k.size(-2), dv = v.size(-1);
  SKA_CHECK(k.shape() == with_last(lead, nk, d) && v.shape() == with_last(lead, nk, dv) &&
                out.shape() == with_last(lead, nq, dv),
            ShapeError, kernel, ": shapes do not match: q ", q.str(), ", k ", k.str(), ", v ",
            v.str(), ", out ", out.str());
  SKA_CHECK(!bias.defined() || bias.shape() == with_last(lead, nq, nk), ShapeError, kernel,
            ": bias ", bias.str(), " is not ", shape_str(with_last(lead, nq, nk)));
  SKA_CHECK(d >= 0, ShapeError, kernel, ": q and k need a head dim of at least 0, got ", q.str());
  SKA_CHECK(d <= kMaxHeadDim && dv <= kMaxHeadDim, ValueError, kernel,
            ": the CUDA kernel supports head dims up to ", kMaxHeadDim, ", got d = ", d,
            " and dv = ", dv);
  SKA_CHECK(nq < INT_MAX && nk < INT_MAX, ShapeError, kernel, ": ", nq, " queries and ", nk,
            " keys: too many for the CUDA kernel");
  const int device = device_index(q);
  for (const Tensor* t : {&k, &v, &bias, &out}) {
    if (!t->defined()) continue;
    SKA_CHECK(t->dtype() == q.dtype(), DTypeError, kernel, ": q is ", dtype_name(q.dtype()),
              " but got ", t->str());
    SKA_CHECK(device_index(*t) == device, DeviceError, kernel, ": q is on ", q.device(),
              " but got ", t->str());
  }
  Geometry geo;
  geo.nlead = rank - 2;
  geo.groups = shape_numel(lead);
  geo.nq = static_cast<int>(nq);
  geo.nk = static_cast<int>(nk);
  geo.d = static_cast<int>(d);
  geo.dv = static_cast<int>(dv);
  return geo;
}

// Contiguous, or empty (nothing to write; Tensor::is_contiguous is false for some empty views).
bool dense(const Tensor& t) { return t.is_contiguous() || t.numel() == 0; }

void check_stats(const char* kernel, const char* name, const Tensor& t, const Geometry& geo) {
  SKA_CHECK(t.defined() && t.dtype() == DType::kF32 && dense(t) && t.numel() == geo.groups * geo.nq,
            ValueError, kernel, ": ", name, " must be contiguous f32 with ", geo.groups * geo.nq,
            " elements, got ", t.defined() ? t.str() : "an undefined tensor");
}

// A gradient the kernels write: any view with a unit column stride whose rows do not overlap.
void check_grad(const char* name, const Tensor& grad, const Tensor& like, const Shape& shape) {
  const auto rows_apart = [&] {
    const int64_t rows = grad.size(-2), cols = grad.size(-1);
    return (cols <= 1 || grad.stride(-1) == 1) && (rows <= 1 || grad.stride(-2) >= cols);
  };
  SKA_CHECK(grad.defined() && grad.dtype() == like.dtype() && grad.shape() == shape &&
                grad.device() == like.device() && rows_apart(),
            ValueError, "attention_backward: ", name, " must be a unit-column-strided view of ",
            dtype_name(like.dtype()), " and shape ", shape_str(shape), " on ", like.device(),
            ", got ", grad.defined() ? grad.str() : "an undefined tensor");
}

View view_of(const Tensor& t, int64_t nlead) {
  View v{};
  v.lead.ndim = static_cast<int>(nlead);
  for (int64_t i = 0; i < nlead; ++i) {
    v.lead.sizes[i] = t.size(i);
    v.lead.strides[i] = t.stride(i);
  }
  v.row = t.stride(-2);
  v.col = t.stride(-1);
  return v;
}

// Whether the mma.sync kernels may read the bias by pairs (Inputs::bias_pairs): pairs_aligned,
// and for an odd number of keys the element after the view's last one in its storage (a pair
// at the last key reads its neighbour, which the kernels leave unused).
bool bias_pairs_readable(const Tensor& bias, const View& bv, int64_t nk) {
  if (!attn::pairs_aligned(bias.data_ptr(), bv)) return false;
  if (nk % 2 == 0) return true;
  int64_t last = bias.offset();
  for (int64_t d = 0; d < bias.dim(); ++d) {
    if (bias.size(d) == 0 || bias.stride(d) < 0) return false;
    last += (bias.size(d) - 1) * bias.stride(d);
  }
  return static_cast<size_t>(last + 2) * dtype_size(bias.dtype()) <= bias.storage()->nbytes();
}

template <typename T>
Inputs<T> inputs_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                    AttentionMask mask, double scale, const Tensor& scale_factor,
                    const Tensor& bias_factor, const Geometry& geo) {
  Inputs<T> in{};
  in.q = static_cast<const T*>(q.data_ptr());
  in.k = static_cast<const T*>(k.data_ptr());
  in.v = static_cast<const T*>(v.data_ptr());
  in.bias = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
  in.qv = view_of(q, geo.nlead);
  in.kv = view_of(k, geo.nlead);
  in.vv = view_of(v, geo.nlead);
  if (bias.defined()) in.bv = view_of(bias, geo.nlead);
  in.nq = geo.nq;
  in.nk = geo.nk;
  in.d = geo.d;
  in.dv = geo.dv;
  in.scale = static_cast<float>(scale);
  in.diagonal = mask == AttentionMask::kDiagonal;
  in.async_loads = g_async_loads.load(std::memory_order_relaxed);
  in.bias_pairs = in.bias != nullptr && in.async_loads && bias_pairs_readable(bias, in.bv, geo.nk);
  const auto factor = [&](const Tensor& f, const char* name) -> const float* {
    if (!f.defined()) return nullptr;
    SKA_CHECK(f.numel() == 1 && f.dtype() == DType::kF32 && f.device() == q.device(), ValueError,
              "attention: ", name, " must be one f32 element on ", q.device(), ", got ", f.str());
    return static_cast<const float*>(f.data_ptr());
  };
  in.scale_factor = factor(scale_factor, "scale_factor");
  in.bias_factor = factor(bias_factor, "bias_factor");
  SKA_CHECK(!bias_factor.defined() || bias.defined(), ValueError,
            "attention: a bias_factor without a bias");
  return in;
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       AttentionMask mask, double scale, const Tensor& scale_factor,
                       const Tensor& bias_factor, const Tensor& out, const Tensor& lse) {
  const Geometry geo = check_geometry("attention_forward", q, k, v, bias, out);
  check_stats("attention_forward", "lse", lse, geo);
  if (geo.groups == 0 || geo.nq == 0) return;
  const int device = device_index(q);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_floating(q.dtype(), "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    ForwardArgs<T> a{};
    a.in = inputs_of<T>(q, k, v, bias, mask, scale, scale_factor, bias_factor, geo);
    a.out = static_cast<T*>(out.data_ptr());
    a.ov = view_of(out, geo.nlead);
    a.lse = static_cast<float*>(lse.data_ptr());
    if constexpr (!std::is_same_v<T, float>) {
      if (attn::tc_supported(q.dtype(), geo.d, geo.dv, device)) {
        if (attn::mma_enabled()) {
          attn::mma_forward(a, geo.groups, stream);
        } else {
          attn::tc_forward(a, geo.groups, stream);
        }
        return;
      }
    }
    attn::scalar_forward(a, geo.groups, stream);
  });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        AttentionMask mask, const Tensor& out, const Tensor& lse,
                        const Tensor& grad_out, double scale, const Tensor& scale_factor,
                        const Tensor& bias_factor, const Tensor& grad_q, const Tensor& grad_k,
                        const Tensor& grad_v, const Tensor& grad_bias) {
  const char* kKernel = "attention_backward";
  const Geometry geo = check_geometry(kKernel, q, k, v, bias, out);
  check_stats(kKernel, "lse", lse, geo);
  SKA_CHECK(grad_out.defined() && grad_out.shape() == out.shape() &&
                grad_out.dtype() == out.dtype() && grad_out.device() == out.device(),
            ValueError, kKernel, ": grad_out must be a view like out ", out.str(), ", got ",
            grad_out.defined() ? grad_out.str() : "an undefined tensor");
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  check_grad("grad_q", grad_q, q, q.shape());
  check_grad("grad_k", grad_k, q, with_last(lead, geo.nk, geo.d));
  check_grad("grad_v", grad_v, q, with_last(lead, geo.nk, geo.dv));
  if (grad_bias.defined()) {  // contiguous or permuted, rows padded or not: written once each
    const Shape b_shape = with_last(lead, geo.nq, geo.nk);
    SKA_CHECK(grad_bias.dtype() == q.dtype() && grad_bias.shape() == b_shape &&
                  grad_bias.device() == q.device() &&
                  dense_with_padded_rows(grad_bias.shape(), grad_bias.strides()),
              ValueError, kKernel, ": grad_bias must be a ", dtype_name(q.dtype()), " ",
              shape_str(b_shape), " tensor on ", q.device(),
              ", contiguous or permuted, rows padded or not (no element twice), got ",
              grad_bias.str());
  }
  if (geo.groups == 0) return;
  const int device = device_index(q);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  // D = rowsum(dO * O), f32 scratch from the caching allocator (stream-ordered reuse).
  const Tensor delta =
      Tensor::empty({std::max<int64_t>(geo.groups * geo.nq, 1)}, DType::kF32, q.device());
  dispatch_floating(q.dtype(), kKernel, [&](auto tag) {
    using T = decltype(tag);
    BackwardArgs<T> a{};
    a.in = inputs_of<T>(q, k, v, bias, mask, scale, scale_factor, bias_factor, geo);
    a.go = static_cast<const T*>(grad_out.data_ptr());
    a.gov = view_of(grad_out, geo.nlead);
    a.lse = static_cast<const float*>(lse.data_ptr());
    a.delta = static_cast<const float*>(delta.data_ptr());
    a.gq = static_cast<T*>(grad_q.data_ptr());
    a.gk = static_cast<T*>(grad_k.data_ptr());
    a.gv = static_cast<T*>(grad_v.data_ptr());
    a.gqv = view_of(grad_q, geo.nlead);
    a.gkv = view_of(grad_k, geo.nlead);
    a.gvv = view_of(grad_v, geo.nlead);
    a.gb = grad_bias.defined() ? static_cast<T*>(grad_bias.data_ptr()) : nullptr;
    if (grad_bias.defined()) a.gbv = view_of(grad_bias, geo.nlead);
    a.grad_bias_pairs = a.gb != nullptr && a.in.async_loads && attn::pairs_aligned(a.gb, a.gbv);
    if (geo.nq > 0) {
      attn::launch_delta(static_cast<const T*>(out.data_ptr()), view_of(out, geo.nlead), a.go,
                         a.gov, static_cast<float*>(delta.data_ptr()), geo.groups * geo.nq, geo.nq,
                         geo.dv, elementwise_fast_paths(), stream);
    }
    if constexpr (!std::is_same_v<T, float>) {
      if (attn::tc_supported(q.dtype(), geo.d, geo.dv, device)) {
        if (attn::mma_enabled()) {
          attn::mma_backward(a, geo.groups, stream);
        } else {
          attn::tc_backward(a, geo.groups, stream);
        }
        return;
      }
    }
    attn::scalar_backward(a, geo.groups, stream);
  });
}

namespace attn {
bool async_loads_enabled() { return g_async_loads.load(std::memory_order_relaxed); }
}  // namespace attn

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace ska {

bool set_cuda_attention_async_loads(bool enabled) { return cuda::g_async_loads.exchange(enabled); }

}  // namespace ska
#endif
