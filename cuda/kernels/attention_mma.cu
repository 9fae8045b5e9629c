// Fused attention on the tensor cores with mma.sync (m16n8k16, bf16/f16 in, f32 accumulate):
// the forward pass and the dK/dV and dQ kernels of the backward pass, for the problems the WMMA
// kernels of attention_tc.cu take (head dims multiples of 16 up to 128, or d = 0).
//
// Design. Each warp owns 16 rows of one side (queries in the forward and dQ kernels, keys in the
// dK/dV kernel) and walks tiles of the other side staged in shared memory by the whole block
// (load_tile: padded rows, zero past the end). Unlike WMMA, the register layout of mma.sync's
// fragments is documented (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4:
//   A (16 x 16, row-major):   a[0] = (g, 2t..2t+1), a[1] = (g + 8, 2t..), a[2] = (g, 2t+8..),
//                             a[3] = (g + 8, 2t+8..), two 16-bit elements per register;
//   B (16 x 8, "col"):        b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g);
//   C (16 x 8, f32):          c[0..1] = (g, 2t..2t+1), c[2..3] = (g + 8, 2t..2t+1).
// So a thread knows which logits it holds: scale, bias, masking, the online softmax (row max
// and sum reduced over the 4 threads of a quad by shuffles), P = exp(z - lse) and
// dS = P (dP - D) are computed on the accumulators in registers, and the C fragments of two
// neighbouring 8-key tiles, rounded to the input dtype, are exactly the A fragment of the
// second product (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K): no shared-memory round trip
// between the products, the slow part of the WMMA kernels. Operands are read from the padded
// shared tiles by ldmatrix (transposed where the contraction runs down a tile's rows: V, dO, Q
// and K as the second product's B), or, with Inputs::async_loads off, by 32-bit loads (a row's
// two neighbours) and two 16-bit loads; the 16-byte row padding keeps them free of bank
// conflicts.
// Key (or query) tiles are 64 wide (32 for head dims above 64, to bound registers), and 8- or
// 16-wide pieces of a tile past the end are skipped, so a 65-token sequence costs 80 keys, not
// 128. Rounding P and dS to bf16/f16 before the second product is the one loss of precision
// beyond the scalar kernels, as in the WMMA kernels. No atomics and a fixed order of summation:
// the same bits on every run.
//
// Status: the default (set_cuda_attention_mma; train.attention: wmma switches it off); tested
// against the CPU twin, the scalar and the WMMA kernels by tests/cuda/test_attention_kernels.cpp.
// On an H100 (bf16 training steps) 13% faster than WMMA on ViT-S, 8% on CSKA-ViT-S, 4% on
// CAFormer-S18.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/device_runtime.h"
#include "cuda/kernels/attention_tc.cuh"
#include "cuda/kernels/mma.cuh"

namespace ska::cuda::attn {
namespace {

constexpr int kRows = 16;     // the rows a warp owns: the m of m16n8k16
constexpr int kMaxWarps = 4;  // a block owns 16 to 64 rows
constexpr unsigned kFull = 0xffffffffu;

std::atomic<bool> g_mma{true};
std::atomic<bool> g_one_block{true};
std::atomic<bool> g_one_block_forward{true};
std::atomic<bool> g_one_pass{false};
std::atomic<bool> g_register_cap{false};
std::atomic<bool> g_persistent{false};

// The one-block backward (mma_one_block_backward_kernel): sequences of at most kShortRows queries
// and keys, head dims up to 64.
constexpr int kShortRows = 80;  // 5 warps of 16 rows; 65 tokens (a CIFAR ViT) fit
constexpr int kShortWarps = kShortRows / kRows;

// The other side's tile width for head dims up to kHead: 64, or 32 above 64 (registers).
template <int kHead>
constexpr int tile_width() {
  return kHead > 64 ? 32 : 64;
}

// The A fragment of 16 rows x 16 columns of f32 accumulators, rounded to T: tiles c0 (columns
// 0-7) and c1 (columns 8-15) in the C layout, which lines up with A's.
template <typename T>
__device__ __forceinline__ void a_from_c(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack<T>(c0[0], c0[1]);
  a[1] = pack<T>(c0[2], c0[3]);
  a[2] = pack<T>(c1[0], c1[1]);
  a[3] = pack<T>(c1[2], c1[3]);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFull, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}

// acc[n] (n < 8-wide tiles covering `live` columns of the other side, at most kN) += the
// warp's 16 rows of `a` (row stride lda) times the rows of `b` (row stride ldb) transposed,
// over `steps` 16-wide slices of the head dim: S = Q K^T, dP = dO V^T and their transposes.
// `ldsm` (Inputs::async_loads): the fragments by ldmatrix, else by 32-bit loads (the same
// registers).
template <typename T, int kN>
__device__ __forceinline__ void multiply_rows(float (&acc)[kN][4], const T* a, int lda, const T* b,
                                              int ldb, int steps, int live, int lane, bool ldsm) {
#pragma unroll
  for (int n = 0; n < kN; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const int tiles = (live + 7) / 8;
  for (int ks = 0; ks < steps; ++ks) {
    uint32_t fa[4];
    if (ldsm) {
      load_a_ldsm(fa, a + ks * 16, lda, lane);
    } else {
      load_a(fa, a + ks * 16, lda, lane);
    }
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      if (n >= tiles) break;
      uint32_t b0, b1;
      if (ldsm) {
        load_b_rows_ldsm(b0, b1, b + n * 8 * ldb + ks * 16, ldb, lane);
      } else {
        load_b_rows(b0, b1, b + n * 8 * ldb + ks * 16, ldb, lane);
      }
      mma<T>(acc[n], fa, b0, b1);
    }
  }
}

// out[nd] (nd < 8-wide tiles of `cols` columns, at most kOut) += w b: w the 16 x (16 x kb)
// weights held as C fragments w[0..] (their columns the contraction), b the tile's rows
// (row stride ldb), only the 16-row pieces that hold one of `live` rows. `ldsm`
// (Inputs::async_loads): b's fragments by ldmatrix, else by 16-bit loads (the same registers).
template <typename T, int kN, int kOut>
__device__ __forceinline__ void accumulate_weights(float (&out)[kOut][4], const float (&w)[kN][4],
                                                   const T* b, int ldb, int cols, int live,
                                                   int lane, bool ldsm) {
  const int pieces = (live + 15) / 16, tiles = cols / 8;
#pragma unroll
  for (int kb = 0; kb < kN / 2; ++kb) {
    if (kb >= pieces) break;
    uint32_t fa[4];
    a_from_c<T>(fa, w[2 * kb], w[2 * kb + 1]);
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) {
      if (nd >= tiles) break;
      uint32_t b0, b1;
      if (ldsm) {
        load_b_cols_ldsm(b0, b1, b + kb * 16 * ldb + nd * 8, ldb, lane);
      } else {
        load_b_cols(b0, b1, b + kb * 16 * ldb + nd * 8, ldb, lane);
      }
      mma<T>(out[nd], fa, b0, b1);
    }
  }
}

// Writes scale * acc (16 rows from row0, `cols` columns) to an [n, cols] gradient whose rows lie
// `ld` elements apart.
template <typename T, int kOut>
__device__ __forceinline__ void write_rows(const float (&acc)[kOut][4], int cols, float scale,
                                           T* out, int64_t ld, int row0, int n, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nd = 0; nd < kOut; ++nd) {
    if (nd * 8 >= cols) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + g + 8 * (e >> 1), c = nd * 8 + 2 * t + (e & 1);
      if (i < n) out[i * ld + c] = from_float<T>(scale * acc[nd][e]);
    }
  }
}

// The bias of pairs (i, j) and (i, j + 1) of one leading index (bias at its offset), j even and
// below nk, as f32: by one 32-bit load where Inputs::bias_pairs (which the launcher sets only
// where the word is in memory: y is the element after the row's last key when j + 1 = nk, which
// the callers leave unused), else by two bias_at (y = 0 past the last key). The backward's
// query_weights reads every pair so; the forward, where the two-load form made ptxas spill at
// head dim 32, reads the pair only with Inputs::bias_pairs and each key by bias_at otherwise.
template <typename T>
__device__ __forceinline__ float2 bias_pair_at(const Inputs<T>& in, const T* bias, int i, int j) {
  if (in.bias_pairs) return unpack<T>(load_pair(bias + i * in.bv.row + j));
  return make_float2(bias_at(bias, in.bv, i, j),
                     j + 1 < in.nk ? bias_at(bias, in.bv, i, j + 1) : 0.0f);
}

// Stores grad_bias of pairs (i, j) and (i, j + 1) (gb from grad_bias_of), j even and below nk,
// the second only below nk: bscale * dz0 and bscale * dz1, by one 32-bit store where
// BackwardArgs::grad_bias_pairs, else by two store_grad_bias.
template <typename T>
__device__ __forceinline__ void store_grad_bias_pair(T* gb, const BackwardArgs<T>& a, int i, int j,
                                                     float bscale, float dz0, float dz1) {
  const bool second = j + 1 < a.in.nk;
  if (a.grad_bias_pairs && second) {
    *reinterpret_cast<uint32_t*>(gb + i * a.gbv.row + j) = pack<T>(bscale * dz0, bscale * dz1);
    return;
  }
  store_grad_bias(gb, a, i, j, bscale, dz0);
  if (second) store_grad_bias(gb, a, i, j + 1, bscale, dz1);
}

// The query side's weights of a warp's 16 queries (the two rows a thread holds: rows_of, with
// their log-sum-exps and D) over keys [j0, j0 + 8 kN) (j0 even): from the accumulators S = Q K^T
// in s and dP = dO V^T in dp, P = exp(z - lse) into s and dS = P (dP - D) into dp (both 0 past
// the ends and at the pairs the mask excludes), and grad_bias = bscale dS stored where gbg
// (grad_bias_of) is not null. The bias and grad_bias go by pairs of keys (bias_pair_at,
// store_grad_bias_pair).
template <typename T, int kN>
__device__ __forceinline__ void query_weights(float (&s)[kN][4], float (&dp)[kN][4],
                                              const BackwardArgs<T>& a, float scale, float bscale,
                                              const T* bg, T* gbg, const int (&rows_of)[2],
                                              const float (&lse)[2], const float (&delta)[2],
                                              int j0, int t) {
  const Inputs<T>& in = a.in;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = rows_of[h], j = j0 + n * 8 + 2 * t;
      const bool live = i < in.nq && j < in.nk;
      float2 b = make_float2(0.0f, 0.0f);
      if (bg != nullptr && live) b = bias_pair_at(in, bg, i, j);
      float dz[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 2 * h + c;
        float pe = 0.0f, dse = 0.0f;
        if (i < in.nq && j + c < in.nk && !excluded(in, i, j + c)) {
          float z = scale * s[n][e];
          if (bg != nullptr) z += bscale * (c == 0 ? b.x : b.y);
          pe = expf(z - lse[h]);
          dse = pe * (dp[n][e] - delta[h]);
        }
        s[n][e] = pe;
        dp[n][e] = dse;
        dz[c] = dse;
      }
      if (gbg != nullptr && live) store_grad_bias_pair(gbg, a, i, j, bscale, dz[0], dz[1]);
    }
  }
}

// Shared memory of a kernel (byte offsets): the warps' tiles of `rows` rows (one of head dim d,
// and one of dv where `rows_dv`), the other side's tiles of `width` rows (d and dv), and
// `floats` f32 values. The host sizes a launch and the kernel finds its tiles with the same call.
struct Smem {
  int a_d, a_dv, b_d, b_dv, f, bytes;
  __host__ __device__ Smem(int rows, bool rows_dv, int width, int d, int dv, int floats) {
    Carver c;
    a_d = c.take(rows * ld16(d) * 2);
    a_dv = rows_dv ? c.take(rows * ld16(dv) * 2) : 0;
    b_d = c.take(width * ld16(d) * 2);
    b_dv = c.take(width * ld16(dv) * 2);
    f = c.take(floats * 4);
    bytes = c.bytes;
  }
};

// Where a thread stands: its warp and lane (g = lane / 4 and t = lane % 4 in the fragment
// layouts), the block's rows (16 x warps), leading index and first row, and its warp's first row.
struct Place {
  int warp, lane, g, t, rows;
  int64_t grp;
  int first, w0;
};
__device__ __forceinline__ Place place_of(int tiles) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rows = blockDim.x / 32 * kRows;
  const int first = static_cast<int>(blockIdx.x % tiles) * rows;
  return {warp, lane, lane >> 2, lane & 3, rows, blockIdx.x / tiles, first, first + warp * kRows};
}

// --- Forward: a block per (leading index, 16 x warps queries); online softmax over key tiles ---

// A warp's running state over the key tiles: the output accumulators and each held row's running
// max and sum.
template <int kOut>
struct ForwardRows {
  float o[kOut][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
};

// The warp's 16 queries (from q_w, row stride ldd) against the key tile [j0, j0 + kWidth) staged
// in k_s and v_s: their logits (scale: effective_scale, bscale: bias_scale), the online
// softmax's update of `r` and O += P V.
template <typename T, int kHead, int kWidth>
__device__ __forceinline__ void forward_tile(ForwardRows<kHead / 8>& r, const Inputs<T>& in,
                                             float scale, float bscale, const T* q_w, const T* k_s,
                                             const T* v_s, const T* bg, int w0, int j0, int lane) {
  constexpr int kN = kWidth / 8, kOut = kHead / 8;
  const int g = lane >> 2, t = lane & 3, ldd = ld16(in.d), ldv = ld16(in.dv);
  const int rows_of[2] = {w0 + g, w0 + g + 8};  // the two rows a thread holds
  const int live = min(kWidth, in.nk - j0);
  float s[kN][4];
  multiply_rows<T, kN>(s, q_w, ldd, k_s, ldd, in.d / 16, live, lane, in.async_loads);
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = rows_of[h], j = j0 + n * 8 + 2 * t;  // keys j and j + 1 (bias_pair_at)
      float2 b = make_float2(0.0f, 0.0f);
      if (in.bias_pairs && bg != nullptr && i < in.nq && j < in.nk) b = bias_pair_at(in, bg, i, j);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 2 * h + c;
        float z = -INFINITY;
        if (j + c < in.nk && !excluded(in, i, j + c)) {
          z = scale * s[n][e];
          if (bg != nullptr && i < in.nq) {
            z += bscale * (in.bias_pairs ? (c == 0 ? b.x : b.y) : bias_at(bg, in.bv, i, j + c));
          }
        }
        s[n][e] = z;
        tile_max[h] = fmaxf(tile_max[h], z);
      }
    }
  }
  float ref[2], alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(r.m_run[h], quad_max(tile_max[h]));
    // While every z of the row so far is -inf, measure from 0: the weights stay 0, not NaN.
    ref[h] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = expf(r.m_run[h] - ref[h]);
    r.m_run[h] = m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = expf(s[n][e] - ref[e >> 1]);
      sum[e >> 1] += s[n][e];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) r.l_run[h] = r.l_run[h] * alpha[h] + quad_sum(sum[h]);
#pragma unroll
  for (int nd = 0; nd < kOut; ++nd) {
#pragma unroll
    for (int e = 0; e < 4; ++e) r.o[nd][e] *= alpha[e >> 1];
  }
  accumulate_weights<T, kN, kOut>(r.o, s, v_s, ldv, in.dv, live, lane, in.async_loads);
}

// Writes the warp's normalised output rows and their log-sum-exps.
template <typename T, int kOut>
__device__ __forceinline__ void forward_write(const ForwardRows<kOut>& r, const ForwardArgs<T>& a,
                                              int64_t grp, int w0, int lane) {
  const Inputs<T>& in = a.in;
  const int g = lane >> 2, t = lane & 3;
  T* og = a.out + a.ov.lead.offset(grp);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = w0 + g + 8 * h;
    if (i >= in.nq) continue;
    const auto [inv, lse] = row_end(r.l_run[h], r.m_run[h], in.nk);
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) {
      if (nd * 8 >= in.dv) break;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = nd * 8 + 2 * t + e;
        og[i * a.ov.row + c * a.ov.col] = from_float<T>(r.o[nd][2 * h + e] * inv);
      }
    }
    if (t == 0) a.lse[grp * in.nq + i] = lse;
  }
}

// kWidth: keys per tile, tile_width<kHead>() with up to kMaxWarps warps; or, for a problem of at
// most kShortRows queries and keys (mma_forward's one-block form), kShortRows with up to
// kShortWarps warps: one block per leading index, every key in one tile.
template <typename T, int kHead, int kWidth>
__global__ void __launch_bounds__((kWidth == kShortRows ? kShortWarps : kMaxWarps) * 32)
    mma_forward_kernel(ForwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const auto [warp, lane, g, t, rows, grp, i0, w0] = place_of(a.tiles);  // w0: first query
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  const Smem at(rows, false, kWidth, in.d, in.dv, 0);  // q [rows][d], k [width][d], v [width][dv]
  T* q_s = reinterpret_cast<T*>(smem + at.a_d);
  T* k_s = reinterpret_cast<T*>(smem + at.b_d);
  T* v_s = reinterpret_cast<T*>(smem + at.b_dv);

  const T* kg = in.k + in.kv.lead.offset(grp);
  const T* vg = in.v + in.vv.lead.offset(grp);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
  load_tile(q_s, ldd, in.q + in.qv.lead.offset(grp), in.qv, i0, rows, in.nq, in.d, in.async_loads);
  const bool active = w0 < in.nq;  // warp-uniform
  ForwardRows<kHead / 8> r;
  for (int j0 = 0; j0 < in.nk; j0 += kWidth) {
    __syncthreads();  // every warp is done with the previous tiles (and q_s is loaded)
    load_tile(k_s, ldd, kg, in.kv, j0, kWidth, in.nk, in.d, in.async_loads, /*wait=*/false);
    load_tile(v_s, ldv, vg, in.vv, j0, kWidth, in.nk, in.dv, in.async_loads);
    __syncthreads();
    if (!active) continue;
    forward_tile<T, kHead, kWidth>(r, in, scale, bscale, q_s + warp * kRows * ldd, k_s, v_s, bg, w0,
                                   j0, lane);
  }
  if (!active) return;
  forward_write<T, kHead / 8>(r, a, grp, w0, lane);
}

// The persistent forward's shared memory for blocks of `rows` queries: two sets of the
// one-block forward's tiles (q [rows][d], k [kShortRows][d], v [kShortRows][dv]), `bytes` apart
// (128-byte aligned).
struct ForwardSet {
  Smem at;
  int bytes;
  __host__ __device__ ForwardSet(int rows, int d, int dv)
      : at(rows, false, kShortRows, d, dv, 0), bytes((at.bytes + 127) / 128 * 128) {}
};

// The one-block forward as a persistent kernel (train.attention_schedule: persistent; the
// forward's counterpart of mma_persistent_backward_kernel below, which describes the schedule):
// block b takes leading indices b, b + gridDim.x, ... in turn, staging the next index's q, k and
// v into one set of tiles while its warps compute the current one from the other. Each index
// gets the one-block forward's instructions (its single key tile, forward_tile and
// forward_write) on the same tiles: the same bits.
template <typename T, int kHead>
__global__ void __launch_bounds__(kShortWarps * 32)
    mma_persistent_forward_kernel(ForwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * kRows;
  const int rows = blockDim.x / 32 * kRows, ldd = ld16(in.d), ldv = ld16(in.dv);
  const ForwardSet set_of(rows, in.d, in.dv);
  const Smem& at = set_of.at;
  const auto stage = [&](unsigned char* base, int64_t grp) {
    load_tile(reinterpret_cast<T*>(base + at.a_d), ldd, in.q + in.qv.lead.offset(grp), in.qv, 0,
              rows, in.nq, in.d, in.async_loads, /*wait=*/false);
    load_tile(reinterpret_cast<T*>(base + at.b_d), ldd, in.k + in.kv.lead.offset(grp), in.kv, 0,
              kShortRows, in.nk, in.d, in.async_loads, /*wait=*/false);
    load_tile(reinterpret_cast<T*>(base + at.b_dv), ldv, in.v + in.vv.lead.offset(grp), in.vv, 0,
              kShortRows, in.nk, in.dv, in.async_loads, /*wait=*/false);
  };
  int set = 0;
  int64_t grp = blockIdx.x;  // the launcher's grid has at most one block per leading index
  stage(smem, grp);
  commit_copies();
  for (; grp < a.groups; grp += gridDim.x) {
    const int64_t next = grp + gridDim.x;
    // The other set was last read by the previous index, before the barrier that ended it.
    if (next < a.groups) stage(smem + (set ^ 1) * set_of.bytes, next);
    commit_copies();
    wait_copies_pending<1>();
    __syncthreads();
    if (w0 < in.nq) {  // warp-uniform
      const unsigned char* base = smem + set * set_of.bytes;
      const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
      ForwardRows<kHead / 8> r;
      if (in.nk > 0) {  // the one-block forward's single key tile
        forward_tile<T, kHead, kShortRows>(
            r, in, scale, bscale, reinterpret_cast<const T*>(base + at.a_d) + w0 * ldd,
            reinterpret_cast<const T*>(base + at.b_d), reinterpret_cast<const T*>(base + at.b_dv),
            bg, w0, 0, lane);
      }
      forward_write<T, kHead / 8>(r, a, grp, w0, lane);
    }
    __syncthreads();
    set ^= 1;
  }
}

// --- Backward ---

// dK and dV: a block per (leading index, 16 x warps keys), walking the query tiles. The warp
// computes S^T = K Q^T and dP^T = V dO^T for its 16 keys, then P^T and dS^T in registers:
//   dV[j] = sum over i of P[i, j] dO[i],  dK[j] = scale * sum over i of dS[i, j] q[i].
template <typename T, int kHead>
__global__ void __launch_bounds__(kMaxWarps * 32) mma_grad_kv_kernel(BackwardArgs<T> a) {
  constexpr int kWidth = tile_width<kHead>(), kN = kWidth / 8, kOut = kHead / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const auto [warp, lane, g, t, rows, grp, j0, w0] = place_of(a.tiles);  // w0: first key
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  const Smem at(rows, true, kWidth, in.d, in.dv, 2 * kWidth);
  T* k_s = reinterpret_cast<T*>(smem + at.a_d);
  T* v_s = reinterpret_cast<T*>(smem + at.a_dv);
  T* q_s = reinterpret_cast<T*>(smem + at.b_d);
  T* go_s = reinterpret_cast<T*>(smem + at.b_dv);
  float* lse_s = reinterpret_cast<float*>(smem + at.f);
  float* delta_s = lse_s + kWidth;

  const T* qg = in.q + in.qv.lead.offset(grp);
  const T* gog = a.go + a.gov.lead.offset(grp);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
  load_tile(k_s, ldd, in.k + in.kv.lead.offset(grp), in.kv, j0, rows, in.nk, in.d, in.async_loads,
            /*wait=*/false);
  load_tile(v_s, ldv, in.v + in.vv.lead.offset(grp), in.vv, j0, rows, in.nk, in.dv, in.async_loads);
  const bool active = w0 < in.nk;
  const int keys_of[2] = {w0 + g, w0 + g + 8};

  float dk[kOut][4], dv[kOut][4];
#pragma unroll
  for (int nd = 0; nd < kOut; ++nd) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;
  }
  for (int i0 = 0; i0 < in.nq; i0 += kWidth) {
    __syncthreads();
    load_tile(q_s, ldd, qg, in.qv, i0, kWidth, in.nq, in.d, in.async_loads, /*wait=*/false);
    load_tile(go_s, ldv, gog, a.gov, i0, kWidth, in.nq, in.dv, in.async_loads);
    for (int e = threadIdx.x; e < kWidth; e += blockDim.x) {  // a block may be one warp
      const int i = i0 + e;
      lse_s[e] = i < in.nq ? a.lse[grp * in.nq + i] : 0.0f;
      delta_s[e] = i < in.nq ? a.delta[grp * in.nq + i] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int live = min(kWidth, in.nq - i0);
    float p[kN][4], ds[kN][4];
    multiply_rows<T, kN>(p, k_s + warp * kRows * ldd, ldd, q_s, ldd, in.d / 16, live, lane,
                         in.async_loads);
    multiply_rows<T, kN>(ds, v_s + warp * kRows * ldv, ldv, go_s, ldv, in.dv / 16, live, lane,
                         in.async_loads);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = keys_of[e >> 1], ti = n * 8 + 2 * t + (e & 1), i = i0 + ti;
        float pe = 0.0f, dse = 0.0f;
        if (i < in.nq && j < in.nk && !excluded(in, i, j)) {
          float z = scale * p[n][e];
          if (bg != nullptr) z += bscale * bias_at(bg, in.bv, i, j);
          pe = expf(z - lse_s[ti]);
          dse = pe * (ds[n][e] - delta_s[ti]);
        }
        p[n][e] = pe;
        ds[n][e] = dse;
      }
    }
    accumulate_weights<T, kN, kOut>(dv, p, go_s, ldv, in.dv, live, lane, in.async_loads);
    accumulate_weights<T, kN, kOut>(dk, ds, q_s, ldd, in.d, live, lane, in.async_loads);
  }
  if (!active) return;
  write_rows<T, kOut>(dk, in.d, scale, a.gk + a.gkv.lead.offset(grp), a.gkv.row, w0, in.nk, lane);
  write_rows<T, kOut>(dv, in.dv, 1.0f, a.gv + a.gvv.lead.offset(grp), a.gvv.row, w0, in.nk, lane);
}

// dQ and grad_bias: a block per (leading index, 16 x warps queries), walking the key tiles.
//   dS[i, j] = P[i, j] * (dO[i] . v[j] - D[i]),  dQ[i] = scale * sum over j of dS[i, j] k[j].
template <typename T, int kHead>
__global__ void __launch_bounds__(kMaxWarps * 32) mma_grad_q_kernel(BackwardArgs<T> a) {
  constexpr int kWidth = tile_width<kHead>(), kN = kWidth / 8, kOut = kHead / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const auto [warp, lane, g, t, rows, grp, i0, w0] = place_of(a.tiles);  // w0: first query
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  const Smem at(rows, true, kWidth, in.d, in.dv, 0);
  T* q_s = reinterpret_cast<T*>(smem + at.a_d);
  T* go_s = reinterpret_cast<T*>(smem + at.a_dv);
  T* k_s = reinterpret_cast<T*>(smem + at.b_d);
  T* v_s = reinterpret_cast<T*>(smem + at.b_dv);

  const T* kg = in.k + in.kv.lead.offset(grp);
  const T* vg = in.v + in.vv.lead.offset(grp);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
  T* gbg = grad_bias_of(a, grp);
  load_tile(q_s, ldd, in.q + in.qv.lead.offset(grp), in.qv, i0, rows, in.nq, in.d, in.async_loads,
            /*wait=*/false);
  load_tile(go_s, ldv, a.go + a.gov.lead.offset(grp), a.gov, i0, rows, in.nq, in.dv,
            in.async_loads);
  const bool active = w0 < in.nq;
  const int rows_of[2] = {w0 + g, w0 + g + 8};
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = rows_of[r] < in.nq;
    lse[r] = valid ? a.lse[grp * in.nq + rows_of[r]] : 0.0f;
    delta[r] = valid ? a.delta[grp * in.nq + rows_of[r]] : 0.0f;
  }

  float dq[kOut][4];
#pragma unroll
  for (int nd = 0; nd < kOut; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
  for (int j0 = 0; j0 < in.nk; j0 += kWidth) {
    __syncthreads();  // every warp is done with the previous tiles (and q_s, go_s are loaded)
    load_tile(k_s, ldd, kg, in.kv, j0, kWidth, in.nk, in.d, in.async_loads, /*wait=*/false);
    load_tile(v_s, ldv, vg, in.vv, j0, kWidth, in.nk, in.dv, in.async_loads);
    __syncthreads();
    if (!active) continue;
    const int live = min(kWidth, in.nk - j0);
    float ds[kN][4], dp[kN][4];
    multiply_rows<T, kN>(ds, q_s + warp * kRows * ldd, ldd, k_s, ldd, in.d / 16, live, lane,
                         in.async_loads);
    multiply_rows<T, kN>(dp, go_s + warp * kRows * ldv, ldv, v_s, ldv, in.dv / 16, live, lane,
                         in.async_loads);
    query_weights<T, kN>(ds, dp, a, scale, bscale, bg, gbg, rows_of, lse, delta, j0, t);
    accumulate_weights<T, kN, kOut>(dq, dp, k_s, ldd, in.d, live, lane, in.async_loads);
  }
  if (!active) return;
  write_rows<T, kOut>(dq, in.d, scale, a.gq + a.gqv.lead.offset(grp), a.gqv.row, w0, in.nq, lane);
}

// The one-block backward kernels' shared memory: q and dO, k and v as padded tiles of kShortRows
// rows, then the queries' log-sum-exps and D.
template <typename T>
__host__ __device__ inline Smem one_block_smem(const Inputs<T>& in) {
  return Smem(kShortRows, true, kShortRows, in.d, in.dv, 2 * kShortRows);
}

// Where the one-block kernels' operands of one leading index lie in shared memory from `base`
// (`at`: one_block_smem).
template <typename T>
struct OneBlockTiles {
  T *q, *go, *k, *v;
  float *lse, *delta;
};
template <typename T>
__device__ __forceinline__ OneBlockTiles<T> one_block_tiles(unsigned char* base, const Smem& at) {
  float* lse = reinterpret_cast<float*>(base + at.f);
  return {reinterpret_cast<T*>(base + at.a_d),
          reinterpret_cast<T*>(base + at.a_dv),
          reinterpret_cast<T*>(base + at.b_d),
          reinterpret_cast<T*>(base + at.b_dv),
          lse,
          lse + kShortRows};
}

// Starts filling tiles `s` with the operands of leading index `grp`: q, dO, k and v by load_tile
// without waiting, the log-sum-exps and D by 4-byte copies (with Inputs::async_loads; else a
// load and a store each), zero past the ends. The thread's copies may be in flight on return:
// the caller waits for them and publishes the tiles with a barrier.
template <typename T>
__device__ __forceinline__ void stage_one_block_tiles(const OneBlockTiles<T>& s,
                                                      const BackwardArgs<T>& a, int64_t grp) {
  const Inputs<T>& in = a.in;
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  load_tile(s.q, ldd, in.q + in.qv.lead.offset(grp), in.qv, 0, kShortRows, in.nq, in.d,
            in.async_loads, /*wait=*/false);
  load_tile(s.go, ldv, a.go + a.gov.lead.offset(grp), a.gov, 0, kShortRows, in.nq, in.dv,
            in.async_loads, /*wait=*/false);
  load_tile(s.k, ldd, in.k + in.kv.lead.offset(grp), in.kv, 0, kShortRows, in.nk, in.d,
            in.async_loads, /*wait=*/false);
  load_tile(s.v, ldv, in.v + in.vv.lead.offset(grp), in.vv, 0, kShortRows, in.nk, in.dv,
            in.async_loads, /*wait=*/false);
  const float* lse = a.lse + grp * in.nq;
  const float* delta = a.delta + grp * in.nq;
  for (int i = threadIdx.x; i < kShortRows; i += blockDim.x) {
    if (i >= in.nq) {
      s.lse[i] = s.delta[i] = 0.0f;
    } else if (in.async_loads) {
      copy4(s.lse + i, lse + i);
      copy4(s.delta + i, delta + i);
    } else {
      s.lse[i] = lse[i];
      s.delta[i] = delta[i];
    }
  }
}

// The tiles of leading index `grp` at the start of shared memory, loaded and published by a
// barrier.
template <typename T>
__device__ __forceinline__ OneBlockTiles<T> load_one_block_tiles(unsigned char* smem,
                                                                 const Smem& at,
                                                                 const BackwardArgs<T>& a,
                                                                 int64_t grp) {
  const OneBlockTiles<T> s = one_block_tiles<T>(smem, at);
  stage_one_block_tiles(s, a, grp);
  wait_copies();
  __syncthreads();
  return s;
}

// The whole backward of one leading index in one block, for short sequences (at most
// kShortRows queries and keys, head dims up to 64): the block loads q, k, v, dO, lse and D once;
// then warp w computes dK and dV for keys [16w, 16w + 16) as mma_grad_kv_kernel does with every
// query in one tile, and dQ (and grad_bias) for queries [16w, 16w + 16) as mma_grad_q_kernel does
// with every key in one tile. No barrier after the loads, no atomics, and one launch instead of
// two of blocks that each load their other side tile by tile (for 65 tokens: two 64-row tiles,
// the second with one live row). one_block_backward_head is that computation on loaded tiles;
// it returns in every warp at its end (no early return), so callers may place barriers after it.
template <typename T, int kHead>
__device__ __forceinline__ void one_block_backward_head(const BackwardArgs<T>& a,
                                                        const OneBlockTiles<T>& tiles,
                                                        int64_t grp) {
  constexpr int kN = kShortRows / 8, kOut = kHead / 8;
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int w0 = warp * kRows;  // the warp's first key (dK, dV) and first query (dQ)
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  const T *q_s = tiles.q, *go_s = tiles.go, *k_s = tiles.k, *v_s = tiles.v;
  const float *lse_s = tiles.lse, *delta_s = tiles.delta;
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
  T* gbg = grad_bias_of(a, grp);

  float w[kN][4], dw[kN][4];  // this warp's weights and their gradients, in turn for both passes
  if (w0 < in.nk) {
    // dK, dV: S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys over every query.
    const int keys_of[2] = {w0 + g, w0 + g + 8};
    multiply_rows<T, kN>(w, k_s + w0 * ldd, ldd, q_s, ldd, in.d / 16, in.nq, lane, in.async_loads);
    multiply_rows<T, kN>(dw, v_s + w0 * ldv, ldv, go_s, ldv, in.dv / 16, in.nq, lane,
                         in.async_loads);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = keys_of[e >> 1], i = n * 8 + 2 * t + (e & 1);
        float pe = 0.0f, dse = 0.0f;
        if (i < in.nq && j < in.nk && !excluded(in, i, j)) {
          float z = scale * w[n][e];
          if (bg != nullptr) z += bscale * bias_at(bg, in.bv, i, j);
          pe = expf(z - lse_s[i]);
          dse = pe * (dw[n][e] - delta_s[i]);
        }
        w[n][e] = pe;
        dw[n][e] = dse;
      }
    }
    float dk[kOut][4], dv[kOut][4];
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;
    }
    accumulate_weights<T, kN, kOut>(dv, w, go_s, ldv, in.dv, in.nq, lane, in.async_loads);
    accumulate_weights<T, kN, kOut>(dk, dw, q_s, ldd, in.d, in.nq, lane, in.async_loads);
    write_rows<T, kOut>(dk, in.d, scale, a.gk + a.gkv.lead.offset(grp), a.gkv.row, w0, in.nk, lane);
    write_rows<T, kOut>(dv, in.dv, 1.0f, a.gv + a.gvv.lead.offset(grp), a.gvv.row, w0, in.nk, lane);
  }
  if (w0 < in.nq) {
    // dQ and grad_bias: S = Q K^T and dP = dO V^T for the warp's 16 queries over every key.
    const int rows_of[2] = {w0 + g, w0 + g + 8};
    multiply_rows<T, kN>(w, q_s + w0 * ldd, ldd, k_s, ldd, in.d / 16, in.nk, lane, in.async_loads);
    multiply_rows<T, kN>(dw, go_s + w0 * ldv, ldv, v_s, ldv, in.dv / 16, in.nk, lane,
                         in.async_loads);
    const float lse[2] = {lse_s[rows_of[0]], lse_s[rows_of[1]]};  // 0 past nq (the tiles' fill)
    const float delta[2] = {delta_s[rows_of[0]], delta_s[rows_of[1]]};
    query_weights<T, kN>(w, dw, a, scale, bscale, bg, gbg, rows_of, lse, delta, 0, t);
    float dq[kOut][4];
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
    accumulate_weights<T, kN, kOut>(dq, dw, k_s, ldd, in.d, in.nk, lane, in.async_loads);
    write_rows<T, kOut>(dq, in.d, scale, a.gq + a.gqv.lead.offset(grp), a.gqv.row, w0, in.nq, lane);
  }
}

template <typename T, int kHead>
__device__ __forceinline__ void one_block_backward(const BackwardArgs<T>& a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t grp = blockIdx.x;
  one_block_backward_head<T, kHead>(a, load_one_block_tiles(smem, one_block_smem(a.in), a, grp),
                                    grp);
}

template <typename T, int kHead>
__global__ void __launch_bounds__(kShortWarps * 32)
    mma_one_block_backward_kernel(BackwardArgs<T> a) {
  one_block_backward<T, kHead>(a);
}

// The same kernel held to kOneBlockRegisterCap registers a thread (train.attention_registers:
// capped): at head dim 64 ptxas gives the kernel above 147 (CUDA 13.0, sm_90), so two blocks of
// five warps fit in an SM's 64K registers; at 136 three do (15 warps to hide the loads' and the
// products' latency instead of 10), with no spills. Its shared memory (46 KB) lets four fit.
// The same instructions on the same values, so the same bits. __maxnreg__ needs CUDA 12.4 or
// newer; an older nvcc builds the uncapped kernel under this name.
constexpr int kOneBlockRegisterCap = 136;
#if (__CUDACC_VER_MAJOR__ > 12) || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
template <typename T, int kHead>
__global__ void __maxnreg__(kOneBlockRegisterCap)
    mma_one_block_backward_capped_kernel(BackwardArgs<T> a) {
  one_block_backward<T, kHead>(a);
}
#else
template <typename T, int kHead>
__global__ void __launch_bounds__(kShortWarps * 32)
    mma_one_block_backward_capped_kernel(BackwardArgs<T> a) {
  one_block_backward<T, kHead>(a);
}
#endif

// The persistent backward's shared memory: two sets of the one-block tiles, this many bytes
// apart (128-byte aligned).
template <typename T>
__host__ __device__ inline int persistent_set_bytes(const Inputs<T>& in) {
  return (one_block_smem(in).bytes + 127) / 128 * 128;
}

// The one-block backward as a persistent kernel (train.attention_schedule: persistent): a grid of
// as many blocks as fit on the GPU at once (mma_backward sizes it by the occupancy calculator,
// at most one block per leading index), block b taking leading indices b, b + gridDim.x, ... in
// turn with two sets of tiles (93 KB at head dim 64, 53 KB at 32; with 161 and 149 registers a
// thread, CUDA 13.0 on sm_90, two blocks an SM either way). While the warps compute one index
// from one set, the copies of the next index's operands are in flight into the other (one
// cp.async group per index): the global memory latency that the one-block kernel's blocks pay
// before any product is paid once by each block here, for its first index, and hidden behind
// the products for the others. Each index gets the one-block kernel's instructions on the same
// tiles: the same bits. By iteration: stage the next index into the other set and commit (an
// empty group after the last index, so that there is one group per iteration and
// wait_copies_pending<1> means "this index's group has landed"); wait; a barrier publishes
// every thread's copies; compute; a barrier, after which the set just read may be restaged.
// tests/simt runs it on the CPU with copies landing only at their wait and their set poisoned
// from their issue.
template <typename T, int kHead>
__global__ void __launch_bounds__(kShortWarps * 32)
    mma_persistent_backward_kernel(BackwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Smem at = one_block_smem(a.in);
  const int set_bytes = persistent_set_bytes(a.in);
  int set = 0;
  int64_t grp = blockIdx.x;  // the launcher's grid has at most one block per leading index
  stage_one_block_tiles(one_block_tiles<T>(smem, at), a, grp);
  commit_copies();
  for (; grp < a.groups; grp += gridDim.x) {
    const int64_t next = grp + gridDim.x;
    // The other set was last read by the previous index, before the barrier that ended it.
    if (next < a.groups) {
      stage_one_block_tiles(one_block_tiles<T>(smem + (set ^ 1) * set_bytes, at), a, next);
    }
    commit_copies();
    wait_copies_pending<1>();
    __syncthreads();
    one_block_backward_head<T, kHead>(a, one_block_tiles<T>(smem + set * set_bytes, at), grp);
    __syncthreads();
    set ^= 1;
  }
}

// The one-pass backward's shared memory: the one-block kernel's tiles (q, dO, k, v, the
// log-sum-exps and D), then P and dS as [kShortRows queries][kWeightLd] tiles of 16-bit values.
constexpr int kWeightLd = kShortRows + 8;  // 176-byte rows: ldmatrix's 8 rows in 8 bank groups
struct OnePassSmem {
  Smem tiles;
  int p, ds, bytes;
  __host__ __device__ OnePassSmem(int d, int dv)
      : tiles(kShortRows, true, kShortRows, d, dv, 2 * kShortRows) {
    p = (tiles.bytes + 127) / 128 * 128;
    ds = p + kShortRows * kWeightLd * 2;
    bytes = ds + kShortRows * kWeightLd * 2;
  }
};

// The backward of one leading index in one block with every weight computed once
// (train.attention_backward: one_pass), for the problems of mma_one_block_backward_kernel. Warp
// w first takes queries [16w, 16w + 16) as that kernel's query side does (S = Q K^T and
// dP = dO V^T over every key, P = exp(z - lse) and dS = P (dP - D) on the accumulators, dQ =
// dS K, grad_bias) and stores P and dS, rounded to T as the second products read them, in
// shared [query][key] tiles; after one barrier it takes keys [16w, 16w + 16): dV = P^T dO and
// dK = dS^T Q, with P^T's and dS^T's A fragments read from the tiles transposed. Five products
// instead of seven, and exp, the mask and the bias read once per logit instead of twice (CSKA's
// logits, the bias here, no longer read down their columns). The sums run in the one-block
// kernel's order; P and dS come from S rather than from S^T, so the results are within rounding
// of that kernel's, not always its bits.
template <typename T, int kHead>
__global__ void __launch_bounds__(kShortWarps * 32)
    mma_one_pass_backward_kernel(BackwardArgs<T> a) {
  constexpr int kN = kShortRows / 8, kOut = kHead / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t grp = blockIdx.x;
  const int w0 = warp * kRows;  // the warp's first query (phase 1) and first key (phase 2)
  const int ldd = ld16(in.d), ldv = ld16(in.dv);
  const OnePassSmem at(in.d, in.dv);
  const OneBlockTiles<T> tiles = load_one_block_tiles(smem, at.tiles, a, grp);
  const T *q_s = tiles.q, *go_s = tiles.go, *k_s = tiles.k, *v_s = tiles.v;
  const float *lse_s = tiles.lse, *delta_s = tiles.delta;
  T* p_s = reinterpret_cast<T*>(smem + at.p);
  T* ds_s = reinterpret_cast<T*>(smem + at.ds);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(grp) : nullptr;
  T* gbg = grad_bias_of(a, grp);

  if (w0 < in.nq) {
    // Phase 1: P and dS of the warp's 16 queries over every key; dQ and grad_bias.
    const int rows_of[2] = {w0 + g, w0 + g + 8};
    float w[kN][4], dw[kN][4];
    multiply_rows<T, kN>(w, q_s + w0 * ldd, ldd, k_s, ldd, in.d / 16, in.nk, lane, in.async_loads);
    multiply_rows<T, kN>(dw, go_s + w0 * ldv, ldv, v_s, ldv, in.dv / 16, in.nk, lane,
                         in.async_loads);
    const float lse[2] = {lse_s[rows_of[0]], lse_s[rows_of[1]]};  // 0 past nq (the tiles' fill)
    const float delta[2] = {delta_s[rows_of[0]], delta_s[rows_of[1]]};
    query_weights<T, kN>(w, dw, a, scale, bscale, bg, gbg, rows_of, lse, delta, 0, t);
    // Every row and column of the warp's piece, zero past the ends: phase 2 reads them whole.
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int at_row = (w0 + g + 8 * r) * kWeightLd + n * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(p_s + at_row) = pack<T>(w[n][2 * r], w[n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(ds_s + at_row) = pack<T>(dw[n][2 * r], dw[n][2 * r + 1]);
      }
    }
    float dq[kOut][4];
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
    accumulate_weights<T, kN, kOut>(dq, dw, k_s, ldd, in.d, in.nk, lane, in.async_loads);
    write_rows<T, kOut>(dq, in.d, scale, a.gq + a.gqv.lead.offset(grp), a.gqv.row, w0, in.nq, lane);
  }
  __syncthreads();  // every query piece's P and dS is in the tiles
  if (w0 >= in.nk) return;
  // Phase 2: dV = P^T dO and dK = dS^T Q for the warp's 16 keys over every query, in pieces of
  // 16 queries in order (the one-block kernel's sums).
  float dk[kOut][4], dv[kOut][4];
#pragma unroll
  for (int nd = 0; nd < kOut; ++nd) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;
  }
  const int pieces = (in.nq + 15) / 16, dv_tiles = in.dv / 8, d_tiles = in.d / 8;
#pragma unroll
  for (int kb = 0; kb < kN / 2; ++kb) {
    if (kb >= pieces) break;
    uint32_t fp[4], fds[4];
    if (in.async_loads) {
      load_a_trans_ldsm(fp, p_s + kb * 16 * kWeightLd + w0, kWeightLd, lane);
      load_a_trans_ldsm(fds, ds_s + kb * 16 * kWeightLd + w0, kWeightLd, lane);
    } else {
      load_a_trans(fp, p_s + kb * 16 * kWeightLd + w0, kWeightLd, lane);
      load_a_trans(fds, ds_s + kb * 16 * kWeightLd + w0, kWeightLd, lane);
    }
#pragma unroll
    for (int nd = 0; nd < kOut; ++nd) {
      uint32_t b0, b1;
      if (nd < dv_tiles) {
        if (in.async_loads) {
          load_b_cols_ldsm(b0, b1, go_s + kb * 16 * ldv + nd * 8, ldv, lane);
        } else {
          load_b_cols(b0, b1, go_s + kb * 16 * ldv + nd * 8, ldv, lane);
        }
        mma<T>(dv[nd], fp, b0, b1);
      }
      if (nd < d_tiles) {
        if (in.async_loads) {
          load_b_cols_ldsm(b0, b1, q_s + kb * 16 * ldd + nd * 8, ldd, lane);
        } else {
          load_b_cols(b0, b1, q_s + kb * 16 * ldd + nd * 8, ldd, lane);
        }
        mma<T>(dk[nd], fds, b0, b1);
      }
    }
  }
  write_rows<T, kOut>(dk, in.d, scale, a.gk + a.gkv.lead.offset(grp), a.gkv.row, w0, in.nk, lane);
  write_rows<T, kOut>(dv, in.dv, 1.0f, a.gv + a.gvv.lead.offset(grp), a.gvv.row, w0, in.nk, lane);
}

// --- Host side ---

// Blocks of 16-row warps over n rows: as few blocks as kMaxWarps allows, their warps balanced
// (65 rows: two blocks of three warps, 96 rows, rather than 64 + 64).
struct Split {
  int warps, tiles;
};
Split split_rows(int n) {
  const int pieces = std::max(1, (n + kRows - 1) / kRows);
  const int tiles = (pieces + kMaxWarps - 1) / kMaxWarps;
  return {(pieces + tiles - 1) / tiles, tiles};
}

}  // namespace

bool mma_enabled() { return g_mma.load(); }

template <typename T>
void mma_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  const char* kKernel = "attention_forward";
  dispatch_head_dim(a.in.d, a.in.dv, [&](auto head) {
    constexpr int kHead = decltype(head)::value, kWidth = tile_width<kHead>();
    if constexpr (kHead <= 64) {
      // One block per leading index and every key in one tile where the queries and keys fit
      // and a tiled launch would take two tiles of either (65 tokens: 2 x 3 warps, and a second
      // key tile holding one key).
      const int longest = std::max(a.in.nq, a.in.nk);
      if (g_one_block_forward.load() && longest > kWidth && longest <= kShortRows) {
        const int warps = std::max(1, (a.in.nq + kRows - 1) / kRows);
        a.tiles = 1;
        if (g_persistent.load()) {
          void (*kernel)(ForwardArgs<T>) = mma_persistent_forward_kernel<T, kHead>;
          const int bytes = 2 * ForwardSet(warps * kRows, a.in.d, a.in.dv).bytes;
          const int64_t resident =
              resident_blocks(reinterpret_cast<const void*>(kernel), warps, bytes);
          a.groups = groups;
          launch(kernel, grid_of(kKernel, std::min(groups, resident), 1), warps, bytes, stream, a);
          return;
        }
        const Smem smem(warps * kRows, false, kShortRows, a.in.d, a.in.dv, 0);
        launch(mma_forward_kernel<T, kHead, kShortRows>, grid_of(kKernel, groups, 1), warps,
               smem.bytes, stream, a);
        return;
      }
    }
    const Split split = split_rows(a.in.nq);
    a.tiles = split.tiles;
    const Smem smem(split.warps * kRows, false, kWidth, a.in.d, a.in.dv, 0);
    launch(mma_forward_kernel<T, kHead, kWidth>, grid_of(kKernel, groups, a.tiles), split.warps,
           smem.bytes, stream, a);
  });
}

template <typename T>
void mma_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  const char* kKernel = "attention_backward";
  const Inputs<T>& in = a.in;
  dispatch_head_dim(in.d, in.dv, [&](auto head) {
    constexpr int kHead = decltype(head)::value, kWidth = tile_width<kHead>();
    if constexpr (kHead <= 64) {
      if (g_one_pass.load() && in.nq <= kShortRows && in.nk <= kShortRows) {
        const int pieces = (std::max(std::max(in.nq, in.nk), 1) + kRows - 1) / kRows;
        launch(mma_one_pass_backward_kernel<T, kHead>, grid_of(kKernel, groups, 1), pieces,
               OnePassSmem(in.d, in.dv).bytes, stream, a);
        return;
      }
      if (g_one_block.load() && in.nq <= kShortRows && in.nk <= kShortRows) {
        const int pieces = (std::max(std::max(in.nq, in.nk), 1) + kRows - 1) / kRows;
        if (g_persistent.load() && groups > 0) {
          // The register cap does not apply: two sets of tiles fit two blocks an SM either way.
          void (*kernel)(BackwardArgs<T>) = mma_persistent_backward_kernel<T, kHead>;
          const int bytes = 2 * persistent_set_bytes(in);
          const int64_t resident =
              resident_blocks(reinterpret_cast<const void*>(kernel), pieces, bytes);
          a.groups = groups;
          launch(kernel, grid_of(kKernel, std::min(groups, resident), 1), pieces, bytes, stream, a);
          return;
        }
        const Smem smem = one_block_smem(in);
        // Capped where the cap fits another block on an SM: head dim 64 (at 32 the kernel
        // already takes fewer registers than the cap).
        void (*kernel)(BackwardArgs<T>) = mma_one_block_backward_kernel<T, kHead>;
        if constexpr (kHead == 64) {
          if (g_register_cap.load()) kernel = mma_one_block_backward_capped_kernel<T, kHead>;
        }
        launch(kernel, grid_of(kKernel, groups, 1), pieces, smem.bytes, stream, a);
        return;
      }
    }
    if (in.nk > 0) {  // dK, dV (zero when there are no queries)
      const Split split = split_rows(in.nk);
      BackwardArgs<T> kv = a;
      kv.tiles = split.tiles;
      const Smem smem(split.warps * kRows, true, kWidth, in.d, in.dv, 2 * kWidth);
      launch(mma_grad_kv_kernel<T, kHead>, grid_of(kKernel, groups, kv.tiles), split.warps,
             smem.bytes, stream, kv);
    }
    if (in.nq > 0) {  // dQ (zero when there are no keys) and grad_bias
      const Split split = split_rows(in.nq);
      BackwardArgs<T> qa = a;
      qa.tiles = split.tiles;
      const Smem smem(split.warps * kRows, true, kWidth, in.d, in.dv, 0);
      launch(mma_grad_q_kernel<T, kHead>, grid_of(kKernel, groups, qa.tiles), split.warps,
             smem.bytes, stream, qa);
    }
  });
}

template void mma_forward<__nv_bfloat16>(ForwardArgs<__nv_bfloat16>, int64_t, cudaStream_t);
template void mma_forward<__half>(ForwardArgs<__half>, int64_t, cudaStream_t);
template void mma_backward<__nv_bfloat16>(BackwardArgs<__nv_bfloat16>, int64_t, cudaStream_t);
template void mma_backward<__half>(BackwardArgs<__half>, int64_t, cudaStream_t);

}  // namespace ska::cuda::attn

namespace ska {

bool set_cuda_attention_mma(bool enabled) { return cuda::attn::g_mma.exchange(enabled); }
bool set_cuda_attention_one_block_backward(bool enabled) {
  return cuda::attn::g_one_block.exchange(enabled);
}
bool set_cuda_attention_one_block_forward(bool enabled) {
  return cuda::attn::g_one_block_forward.exchange(enabled);
}
bool set_cuda_attention_one_pass_backward(bool enabled) {
  return cuda::attn::g_one_pass.exchange(enabled);
}
bool set_cuda_attention_register_cap(bool enabled) {
  return cuda::attn::g_register_cap.exchange(enabled);
}
bool set_cuda_attention_persistent(bool enabled) {
  return cuda::attn::g_persistent.exchange(enabled);
}

}  // namespace ska
