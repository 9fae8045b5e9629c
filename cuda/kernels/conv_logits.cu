// CSKA's convolutional logits on the tensor cores (mma.sync m16n8k16, bf16/f16 in, f32
// accumulate), as implicit matrix products: no neighbourhood matrix (im2col) in memory, no
// convolution library.
//
// The op (backend/kernels.inc, conv_logits_forward): for one head h, the queries of an image laid
// out on its H x W grid, each position p's logit over key j is
//   L[p, j] = bias[j] + sum over taps (dy, dx) and channels c of q[p + off(dy, dx), c] w[tap, j, c]
// with off = (dy - r) W + (dx - r), r = k / 2, and a neighbour outside the grid zero. As a matrix
// product per head: M = the B * H * W positions, N = the K keys, and the contraction k * k * d.
//
// Forward (conv_logits_forward_kernel): a block owns 64 positions of one image and head (a warp
// 16 of them, the m of m16n8k16) and 80 keys (10 tiles of 8: CSKA-ViT-S's 65 keys in one block,
// CSKAFormer's 784 in ten). It stages the positions' queries
// with a halo of r * W + r rows before and after (zero outside the image) once, then the taps'
// filters for its keys, [80 keys][d] a tap, as many taps at once as fit in 18 KiB (4 at head dim
// 16, 1 at 64: conv_logits_tap_group) into two buffers in turn, the next group's copies in flight
// while the current one is multiplied; a warp's A fragment for a tap is its rows'
// neighbours, read from the staged queries at a shifted row (zero where the neighbour falls off
// the grid's left or right edge, which the halo's rows do not show), and B the filters' rows.
// grad_q (conv_logits_grad_q_kernel) is the same product run the other way: position s gathers
// dL[s - off, j] w[tap, j, c] over the taps and keys, so a block stages the gradient's rows with
// the same halo, 80 keys at a time, and the filters [80 keys][d] per group of taps, and keeps s's
// d columns in registers. Both kernels take two tiles of 64 positions a block where the block's
// shared memory stays within 64 KiB (dispatch_per_block: CSKA-ViT-S's 8x8 grids, one image a
// tile, and CSKAFormer's forward): the tiles are consecutive in the batch's order (two tiles of an
// image, or of neighbouring images), each stages its own rows, and each filter fragment staged
// and loaded serves both (the filters cross from L2 once for two tiles, and the B loads are
// halved). grad_w (conv_logits_grad_w_kernel) sums dL[p, j] q[p + off, c] over
// every position of the batch: a block owns one head, tap and 80 keys (a warp 16) and a chunk of
// the rows, stages 64 rows of the gradient and the shifted queries at a time (into two buffers
// in turn, the next rows' copies in flight while the current ones are multiplied), and writes its
// partial sums; a second kernel adds the chunks' partials in order. No atomics: the same bits
// on every run.
// Fragments come from the shared tiles by ldmatrix (attn::async_loads_enabled, the default): B
// by ldmatrix.x2 (.trans where the contraction runs down a tile's rows), grad_w's A by
// ldmatrix.x4.trans, and the forward's and grad_q's A, whose 16 rows are the warp's positions'
// neighbours at a tap, by ldmatrix.x4 from the row each lane names (a zero row, in row 0's
// padding, for neighbours off the grid): about one shared-load instruction a mma.sync, where the
// 32- and 16-bit loads (train.attention_loads: sync) took 2.4 (forward) and 4.5 (grad_q,
// grad_w). The same registers either way, so the same bits.
//
// Status: run on the CPU by tests/simt (this file's own code: an f64 reference, both fragment
// loads, the layouts CSKA's mixers give, bank conflicts); [cuda] tests against the CPU twin in
// tests/cuda/test_conv_logits.cpp, which passed on an H200 (2026-11-28) before the ldmatrix
// fragments and the padded rows (not yet run on a GPU since). train.conv_logits: auto times this
// form against the convolution and the GEMM per shape and takes the fastest.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "backend/conv_logits_geometry.h"
#include "cuda/kernels/attention_tc.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/mma.cuh"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {
namespace {

using attn::Carver;
using attn::ld16;
using attn::load_pair;
using attn::mma;

constexpr int kRows = 16;               // rows a warp owns: the m of m16n8k16
constexpr int kWarps = 4;               // warps a block
constexpr int kTile = kRows * kWarps;   // positions a block (forward, grad_q)
constexpr int kKeys = kConvLogitsKeys;  // keys a block or chunk: 10 tiles of 8 (65 keys: one)
constexpr int kKeyTiles = kKeys / 8;
constexpr int kKeyWarps = kKeys / kRows;  // grad_w's warps: 16 keys each

template <typename T>
struct Args {
  const T* q;  // q[b, h, p, c] at q + b * qb + h * qh + p * qp + c
  int64_t qb, qh, qp;
  const T* w;     // [heads, taps, keys, d] contiguous
  const T* bias;  // [heads, keys], or null
  const T* g;     // dL[b, h, p, j] at g + b * gb + h * gh + p * gp + j
  int64_t gb, gh, gp;
  T* out;  // logits [B, heads, P, keys] or grad_q [B, heads, P, d]: element [b, h, p, c]
  int64_t ob, oh, op;   // at out + b * ob + h * oh + p * op + c (grad_q: even strides)
  bool pairs;           // forward: a thread's two neighbouring keys are one aligned 32-bit store
  float* partial;       // grad_w's partial sums [heads * taps, chunks, keys * d], or null
  float* bias_partial;  // the bias gradient's partial sums [heads, chunks, keys], or null
  int heads, height, width, positions, keys, d, k, taps, radius, halo;
  int group;       // taps whose filters are staged at once (conv_logits_tap_group)
  int tiles;       // kTile-position tiles an image
  int64_t units;   // tiles of the batch: batch * tiles (forward, grad_q)
  int key_chunks;  // kKeys-key chunks
  int chunks;      // grad_w's row chunks
  int64_t rows, chunk_rows;
};

// Stages `rows` rows of `cols` columns (a multiple of 8) from column col0 into a shared tile of
// row stride ld: row r from row_of(r) (a pointer to that row's column 0, or null for a row of
// zeros), zero at columns from `valid` on. 16-byte asynchronous copies where a vector lies
// inside `valid` and is 16-byte aligned, element by element otherwise (rows of an odd number of
// keys). Does not wait for its copies: the caller commits them as a group
// (attn::commit_copies), waits for it (attn::wait_copies_pending) and its barrier publishes the
// tile.
template <typename T, typename RowOf>
__device__ void stage(T* tile, int ld, int rows, int col0, int cols, int valid, RowOf row_of) {
  constexpr int kVec = 16 / sizeof(T);
  const int per_row = cols / kVec;
  const T zero = from_float<T>(0.0f);
  for (int e = threadIdx.x; e < rows * per_row; e += blockDim.x) {
    const int r = e / per_row, c = e % per_row * kVec, col = col0 + c;
    T* to = tile + r * ld + c;
    const T* from = row_of(r);
    if (from != nullptr && col + kVec <= valid &&
        reinterpret_cast<uintptr_t>(from + col) % 16 == 0) {
      attn::copy16(to, from + col);
    } else {
#pragma unroll
      for (int x = 0; x < kVec; ++x) {
        to[x] = from != nullptr && col + x < valid ? from[col + x] : zero;
      }
    }
  }
}

// Stages the filters of taps [tap0, tap0 + group) for keys [key0, key0 + 80) of one head (wh: its
// [taps, keys, d] filters) as `group` tiles [80 keys][d] of row stride ld, zero past the keys
// (not waited for, as stage).
template <typename T>
__device__ void stage_filters(T* w_s, int ld, const T* wh, int tap0, int group, int key0,
                              const Args<T>& a) {
  stage(w_s, ld, group * kKeys, 0, a.d, a.d, [&](int r) -> const T* {
    const int tap = tap0 + r / kKeys, j = key0 + r % kKeys;
    return j < a.keys ? wh + (static_cast<int64_t>(tap) * a.keys + j) * a.d : nullptr;
  });
}

// A warp's A fragment from a shared tile whose rows are the fragment's rows: rows src[0] (g) and
// src[1] (g + 8), each already offset to the thread's column pair 2t, zero where !ok.
template <typename T>
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[4], const T* const (&src)[2],
                                            const bool (&ok)[2], int col) {
  a[0] = ok[0] ? load_pair(src[0] + col) : 0u;
  a[1] = ok[1] ? load_pair(src[1] + col) : 0u;
  a[2] = ok[0] ? load_pair(src[0] + col + 8) : 0u;
  a[3] = ok[1] ? load_pair(src[1] + col + 8) : 0u;
}

// acc[n] += a b over the 16 rows of `b` (row stride ldb) for the 8-wide column tiles n of its
// `cols` columns: B read down the tile's rows (grad_w's queries), by ldmatrix.x2.trans (kLdsm)
// or by four 16-bit loads (the same registers).
template <bool kLdsm, typename T, int kN>
__device__ __forceinline__ void multiply_down(float (&acc)[kN][4], const uint32_t (&a)[4],
                                              const T* b, int ldb, int cols, int lane) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    if (n * 8 >= cols) break;
    uint32_t b0, b1;
    if constexpr (kLdsm) {
      attn::load_b_cols_ldsm(b0, b1, b + n * 8, ldb, lane);
    } else {
      attn::load_b_cols(b0, b1, b + n * 8, ldb, lane);
    }
    mma<T>(acc[n], a, b0, b1);
  }
}

// The row of a tile staged from position p0 - halo that holds position p's neighbour at offset
// (dy, dx) on the grid, or -1 where the neighbour is off the grid (or p not a position at all).
template <typename T>
__device__ __forceinline__ int neighbour_row(int p, int p0, int dy, int dx, const Args<T>& a) {
  const int x = p % a.width + dx, s = p + dy * a.width + dx;
  const bool ok = p < a.positions && x >= 0 && x < a.width && s >= 0 && s < a.positions;
  return ok ? s - p0 + a.halo : -1;
}

// Where a thread's two rows (positions p0 + warp * 16 + g and + 8) find their neighbour at
// offset (dy, dx): the staged row, offset to the thread's column pair 2t, and whether it is one.
template <typename T>
__device__ __forceinline__ void neighbours(const T* (&src)[2], bool (&ok)[2], const T* tile, int ld,
                                           const int (&pos)[2], int p0, int dy, int dx,
                                           const Args<T>& a, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = neighbour_row(pos[r], p0, dy, dx, a);
    ok[r] = row >= 0;
    src[r] = tile + max(row, 0) * ld + 2 * t;
  }
}

// ldmatrix's zero rows for the lanes whose neighbour is off the grid, in a 128-byte aligned piece
// of shared memory of its own (kZeroBytes, the last the kernels carve; the block zeroes it once):
// row q, 16 bytes at q * 16, lies in bank group q % 8 (of 4 banks each). A lane whose neighbour
// is off the grid names row g + col / 8, g the group its neighbour's row would be in at column 0,
// so that the 8 rows of an ldmatrix matrix (8 consecutive positions' neighbours) stay in 8
// different groups whether or not some are off the grid (one shared-memory wavefront a matrix,
// where one zero row for all put a second on most matrices of an edge tap), and its row at
// column col is its row at column 0 plus col, as an in-grid lane's: no select in the loop.
// Columns up to 128 (col / 8 <= 14): 7 + 14 + 1 rows.
constexpr int kZeroRows = 22;
constexpr int kZeroBytes = kZeroRows * 16;
template <typename T>
__device__ __forceinline__ void clear_zero_rows(T* zeros) {
  if (threadIdx.x < kZeroRows) {
    *reinterpret_cast<uint4*>(zeros + threadIdx.x * 8) = make_uint4(0, 0, 0, 0);
  }
}

// The row lane l names to ldmatrix_x4 for the A fragment of the warp's 16 positions (first
// position `first`) at offset (dy, dx), at column 0: row l % 16's neighbour, column 8 (l / 16),
// or where it is off the grid the zero row (kZeroBytes at `zeros`) in the bank group the
// neighbour's row would have been in.
template <typename T>
__device__ __forceinline__ const T* lane_neighbour(const T* tile, int ld, int first, int p0, int dy,
                                                   int dx, const Args<T>& a, int lane,
                                                   const T* zeros) {
  const int p = first + lane % 16, row = neighbour_row(p, p0, dy, dx, a);
  if (row >= 0) return tile + row * ld + lane / 16 * 8;
  const int group = ((p + dy * a.width + dx - p0 + a.halo) * (ld / 8) + lane / 16) & 7;
  return zeros + group * 8;
}

// The A fragment of the warp's 16 neighbours at columns [col, col + 16): by one ldmatrix.x4 from
// the rows lane_neighbour named, each at column col, with kLdsm, else by 32-bit loads
// (load_a_rows; the same registers).
template <bool kLdsm, typename T>
__device__ __forceinline__ void load_a_neighbours(uint32_t (&fa)[4], const T* mine,
                                                  const T* const (&src)[2], const bool (&ok)[2],
                                                  int col) {
  if constexpr (kLdsm) {
    attn::ldmatrix_x4(fa, mine + col);
  } else {
    load_a_rows(fa, src, ok, col);
  }
}

// The tiles of a forward or grad_q block: kPer consecutive units of the batch from unit0 (unit =
// b * tiles + tile), each with its image b, first position p0, the thread's two positions, and
// whether it is a unit at all (staged: block-uniform; the batch's last block may hold one tile)
// and the warp's 16 rows hold a position (active: warp-uniform).
template <int kPer>
struct Tiles {
  int64_t b[kPer];
  int p0[kPer], pos[kPer][2];
  bool staged[kPer], active[kPer];
  bool any_active;  // of the warp's rows in any tile
};
template <int kPer, typename T>
__device__ __forceinline__ Tiles<kPer> tiles_of(const Args<T>& a, int64_t unit0, int warp, int g) {
  Tiles<kPer> tl;
  tl.any_active = false;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t unit = unit0 + u;
    tl.b[u] = unit / a.tiles;
    tl.p0[u] = static_cast<int>(unit - tl.b[u] * a.tiles) * kTile;
    tl.pos[u][0] = tl.p0[u] + warp * kRows + g;
    tl.pos[u][1] = tl.pos[u][0] + 8;
    tl.staged[u] = unit < a.units;
    tl.active[u] = tl.staged[u] && tl.p0[u] + warp * kRows < a.positions;
    tl.any_active |= tl.active[u];
  }
  return tl;
}

// Where the warp's rows of each of a block's tiles find their neighbours at offset (dy, dx):
// neighbours() and lane_neighbour() per tile, for load_a_neighbours.
template <int kPer, typename T>
struct TapRows {
  const T* src[kPer][2];
  bool ok[kPer][2];
  const T* mine[kPer];
  template <bool kLdsm>
  __device__ __forceinline__ void load_a(uint32_t (&fa)[4], int u, int col) const {
    load_a_neighbours<kLdsm>(fa, mine[u], src[u], ok[u], col);
  }
};
template <int kPer, typename T>
__device__ __forceinline__ TapRows<kPer, T> tap_rows(T* const (&tiles)[kPer], int ld,
                                                     const Tiles<kPer>& tl, int dy, int dx,
                                                     const Args<T>& a, int warp, int lane,
                                                     const T* zeros) {
  TapRows<kPer, T> rows;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    neighbours(rows.src[u], rows.ok[u], tiles[u], ld, tl.pos[u], tl.p0[u], dy, dx, a, lane & 3);
    rows.mine[u] =
        lane_neighbour(tiles[u], ld, tl.p0[u] + warp * kRows, tl.p0[u], dy, dx, a, lane, zeros);
  }
  return rows;
}

// --- Forward: a block per (kPer tiles of 64 positions, 80 keys) and head ---
// A tile is 64 positions of one image; unit = b * tiles + tile numbers them over the batch, and a
// block owns kPer consecutive units (two where dispatch_per_block says so: two tiles of one
// image, or of neighbouring images). Each staged filter fragment serves all of the block's tiles,
// so the filters are staged once for kPer tiles. kLdsm (attn::async_loads_enabled): the fragments
// by ldmatrix, else by 32-bit loads.
template <typename T, bool kLdsm, int kPer>
__global__ void __launch_bounds__(kWarps * 32) conv_logits_forward_kernel(Args<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int chunk = blockIdx.x % a.key_chunks;
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x / a.key_chunks) * kPer;
  const int h = blockIdx.y, key0 = chunk * kKeys;
  const int ld = ld16(a.d), span = kTile + 2 * a.halo;
  Carver carve;
  T* q_s[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) q_s[u] = reinterpret_cast<T*>(smem + carve.take(span * ld * 2));
  // The filters of a group of taps, in two buffers: the next group's copies are in flight while
  // the warps multiply the current one's.
  T* const w0 = reinterpret_cast<T*>(smem + carve.take(a.group * kKeys * ld * 2));
  T* const w1 = reinterpret_cast<T*>(smem + carve.take(a.group * kKeys * ld * 2));
  T* const zeros = reinterpret_cast<T*>(smem + carve.take(kZeroBytes));  // for off-grid lanes
  if (kLdsm) clear_zero_rows(zeros);

  const Tiles<kPer> tl = tiles_of<kPer>(a, unit0, warp, g);
  const auto& [b, p0, pos, staged, active, any_active] = tl;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (!staged[u]) continue;
    const T* qg = a.q + b[u] * a.qb + h * a.qh;
    const int first = p0[u] - a.halo;
    stage(q_s[u], ld, span, 0, a.d, a.d, [&](int r) -> const T* {
      const int s = first + r;
      return s >= 0 && s < a.positions ? qg + s * a.qp : nullptr;
    });
  }
  const int tiles = (min(kKeys, a.keys - key0) + 7) / 8;
  const T* wh = a.w + static_cast<int64_t>(h) * a.taps * a.keys * a.d;

  float acc[kPer][kKeyTiles][4];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
      acc[u][n][0] = acc[u][n][1] = acc[u][n][2] = acc[u][n][3] = 0.0f;
  }
  // The queries and the first group's filters: one group of copies.
  stage_filters(w0, ld, wh, 0, min(a.group, a.taps), key0, a);
  attn::commit_copies();
  int buf = 0;
  for (int tap0 = 0; tap0 < a.taps; tap0 += a.group, buf ^= 1) {
    const int group = min(a.group, a.taps - tap0);
    // The next group's filters go in flight into the other buffer (which every warp finished
    // reading at the barrier that ended the last group) before this group's are waited for.
    const int next = tap0 + a.group;
    if (next < a.taps) {
      stage_filters(buf ? w0 : w1, ld, wh, next, min(a.group, a.taps - next), key0, a);
      attn::commit_copies();
      attn::wait_copies_pending<1>();
    } else {
      attn::wait_copies_pending<0>();
    }
    __syncthreads();  // every thread's copies of this group (and of the queries) have landed
    const T* w_s = buf ? w1 : w0;
    for (int tap = tap0; tap < (any_active ? tap0 + group : tap0); ++tap) {
      const T* wt_s = w_s + (tap - tap0) * kKeys * ld;  // this tap's filters, [80 keys][d]
      const int dy = tap / a.k - a.radius, dx = tap % a.k - a.radius;
      const TapRows<kPer, T> rows = tap_rows(q_s, ld, tl, dy, dx, a, warp, lane, zeros);
      for (int ks = 0; ks < a.d / 16; ++ks) {
        uint32_t fa[kPer][4];
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
          if (active[u]) rows.template load_a<kLdsm>(fa[u], u, ks * 16);
        }
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          if (n >= tiles) break;
          uint32_t b0, b1;  // b(c, j) = w[j][c]
          if constexpr (kLdsm) {
            attn::load_b_rows_ldsm(b0, b1, wt_s + n * 8 * ld + ks * 16, ld, lane);
          } else {
            attn::load_b_rows(b0, b1, wt_s + n * 8 * ld + ks * 16, ld, lane);
          }
#pragma unroll
          for (int u = 0; u < kPer; ++u) {
            if (active[u]) mma<T>(acc[u][n], fa[u], b0, b1);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this group's buffer before it is staged again
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (!active[u]) continue;
    T* out = a.out + b[u] * a.ob + h * a.oh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (pos[u][r] >= a.positions) continue;
      T* row = out + static_cast<int64_t>(pos[u][r]) * a.op;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        if (n >= tiles) break;
        const int j = key0 + n * 8 + 2 * t;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool live = j + e < a.keys;
          v[e] =
              acc[u][n][2 * r + e] + (a.bias && live ? to_float(a.bias[h * a.keys + j + e]) : 0.0f);
        }
        if (a.pairs && j + 1 < a.keys) {
          *reinterpret_cast<uint32_t*>(row + j) = attn::pack<T>(v[0], v[1]);
        } else {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (j + e < a.keys) row[j + e] = from_float<T>(v[e]);
          }
        }
      }
    }
  }
}

// --- grad_q: a block per kPer tiles of 64 positions (as the forward's) and head, walking the keys
// 80 at a time ---
//   dq[s, c] = sum over taps and keys j of dL[s - off, j] w[tap, j, c]
template <typename T, int kD, bool kLdsm, int kPer>
__global__ void __launch_bounds__(kWarps * 32) conv_logits_grad_q_kernel(Args<T> a) {
  constexpr int kOut = kD / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * kPer;
  const int h = blockIdx.y;
  const int ldg = ld16(kKeys), ldw = ld16(a.d), span = kTile + 2 * a.halo;
  Carver carve;
  T* g_s[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) g_s[u] = reinterpret_cast<T*>(smem + carve.take(span * ldg * 2));
  T* const w0 = reinterpret_cast<T*>(smem + carve.take(a.group * kKeys * ldw * 2));
  T* const w1 = reinterpret_cast<T*>(smem + carve.take(a.group * kKeys * ldw * 2));
  T* const zeros = reinterpret_cast<T*>(smem + carve.take(kZeroBytes));  // as the forward's
  if (kLdsm) clear_zero_rows(zeros);

  const T* wh = a.w + static_cast<int64_t>(h) * a.taps * a.keys * a.d;
  const Tiles<kPer> tl = tiles_of<kPer>(a, unit0, warp, g);
  const auto& [b, p0, pos, staged, active, any_active] = tl;

  float acc[kPer][kOut][4];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
#pragma unroll
    for (int n = 0; n < kOut; ++n) acc[u][n][0] = acc[u][n][1] = acc[u][n][2] = acc[u][n][3] = 0.0f;
  }
  // The gradient's rows of the tiles for keys [key0, key0 + 80), not waited for.
  const auto stage_gradient = [&](int key0) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if (!tl.staged[u]) continue;  // tl, not its bindings: a C++17 lambda cannot capture those
      const T* gg = a.g + tl.b[u] * a.gb + h * a.gh;
      const int first = tl.p0[u] - a.halo;
      stage(g_s[u], ldg, span, key0, kKeys, a.keys, [&](int r) -> const T* {
        const int s = first + r;
        return s >= 0 && s < a.positions ? gg + s * a.gp : nullptr;
      });
    }
  };
  // The block's steps: each chunk of 80 keys, and within it each group of taps. A step's filters
  // are staged into one of two buffers in turn, the next step's in flight while this one runs;
  // the gradient's rows once a chunk, after the barrier that ends the chunk's last step.
  const int groups = (a.taps + a.group - 1) / a.group, last_step = a.key_chunks * groups - 1;
  const auto stage_step_filters = [&](int step) {
    const int tap0 = step % groups * a.group;
    stage_filters(step % 2 ? w1 : w0, ldw, wh, tap0, min(a.group, a.taps - tap0),
                  step / groups * kKeys, a);
  };
  stage_gradient(0);
  stage_step_filters(0);
  attn::commit_copies();
  for (int step = 0; step <= last_step; ++step) {
    const int key0 = step / groups * kKeys, tap0 = step % groups * a.group;
    const int group = min(a.group, a.taps - tap0);
    if (step > 0 && tap0 == 0) {  // a new chunk of keys
      stage_gradient(key0);
      attn::commit_copies();
    }
    if (step < last_step) {
      stage_step_filters(step + 1);
      attn::commit_copies();
      attn::wait_copies_pending<1>();  // all but the next step's filters
    } else {
      attn::wait_copies_pending<0>();
    }
    __syncthreads();  // every thread's copies of this step's rows and filters have landed
    const int steps = (min(kKeys, a.keys - key0) + 15) / 16;
    const T* w_s = step % 2 ? w1 : w0;
    for (int tap = tap0; tap < (any_active ? tap0 + group : tap0); ++tap) {
      const T* wt_s = w_s + (tap - tap0) * kKeys * ldw;  // this tap's filters, [80 keys][d]
      // The forward pair (s - off, tap) reached s: the neighbour at -(dy, dx).
      const int dy = a.radius - tap / a.k, dx = a.radius - tap % a.k;
      const TapRows<kPer, T> rows = tap_rows(g_s, ldg, tl, dy, dx, a, warp, lane, zeros);
      for (int ks = 0; ks < steps; ++ks) {
        uint32_t fa[kPer][4];
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
          if (active[u]) rows.template load_a<kLdsm>(fa[u], u, ks * 16);
        }
        const T* wk = wt_s + ks * 16 * ldw;  // b(j, c) = w[j][c], down the filters' rows
#pragma unroll
        for (int n = 0; n < kOut; ++n) {
          if (n * 8 >= a.d) break;
          uint32_t b0, b1;
          if constexpr (kLdsm) {
            attn::load_b_cols_ldsm(b0, b1, wk + n * 8, ldw, lane);
          } else {
            attn::load_b_cols(b0, b1, wk + n * 8, ldw, lane);
          }
#pragma unroll
          for (int u = 0; u < kPer; ++u) {
            if (active[u]) mma<T>(acc[u][n], fa[u], b0, b1);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this step's filters (and the chunk's rows)
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (!active[u]) continue;
    T* out = a.out + b[u] * a.ob + h * a.oh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (pos[u][r] >= a.positions) continue;
#pragma unroll
      for (int n = 0; n < kOut; ++n) {
        if (n * 8 >= a.d) break;
        // The strides and the offset are even: the pair is one aligned 32-bit store.
        *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(pos[u][r]) * a.op + n * 8 + 2 * t) =
            attn::pack<T>(acc[u][n][2 * r], acc[u][n][2 * r + 1]);
      }
    }
  }
}

// --- grad_w: a block per (kAcross taps and row chunk, 80 keys, head), partial sums over its rows
// The taps vary fastest across blocks: the blocks that read the same rows of the gradient run
// side by side, so those rows come from L2 rather than once a tap from memory. The rows come 64
// at a time into two buffers in turn: the next rows' copies are in flight while the warps
// multiply the current ones. kAcross = 1: a block per tap. kAcross = k (train.conv_logits_grad_w:
// per_row; 3x3 filters at head dims up to 64): a block per filter row, taps [row k, row k + k),
// which stages the gradient's rows and loads each A fragment once for its k products, against a
// shifted query tile per tap. Each tap's sums take the same rows in the same order either way:
// the same partial sums, bit for bit.
// The rows a step stages (kStep): 64 a block per tap; 32 a block per row (its shared memory, two
// buffers of the gradient's rows and of three query tiles, 38 KB at head dim 64, five blocks an
// SM). The sums take the rows' 16-row pieces in order whatever the step: the same bits.
//   dw[tap, j, c] = sum over the batch's positions p of dL[p, j] q[p + off, c]
__host__ __device__ constexpr int grad_w_step_rows(int across) { return across == 1 ? kTile : 32; }

template <typename T, int kD, bool kLdsm, int kAcross>
__global__ void __launch_bounds__(kKeyWarps * 32) conv_logits_grad_w_kernel(Args<T> a) {
  constexpr int kOut = kD / 8, kStep = grad_w_step_rows(kAcross);
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int per_chunk = a.taps / kAcross;  // blocks per chunk of rows
  const int tap0 = blockIdx.x % per_chunk * kAcross, chunk = blockIdx.x / per_chunk;
  const int key0 = blockIdx.y * kKeys, h = blockIdx.z;
  const int ldg = ld16(kKeys), ldq = ld16(a.d);
  Carver carve;
  // Two buffers each, chosen by selects and offsets rather than indexing (an indexed array of
  // pointers would live in local memory): the gradient's g0 and g1, then the queries' tiles,
  // buffer 0's kAcross taps and buffer 1's (q_tile).
  T* const g0 = reinterpret_cast<T*>(smem + carve.take(kStep * ldg * 2));
  T* const g1 = reinterpret_cast<T*>(smem + carve.take(kStep * ldg * 2));
  T* const q_all = reinterpret_cast<T*>(smem + carve.take(2 * kAcross * kStep * ldq * 2));
  // kStep * ldq * 2 bytes is a multiple of 128 (ldq a multiple of 8): each tile is as aligned as
  // a carved piece.
  const auto q_tile = [&](int buf, int u) { return q_all + (buf * kAcross + u) * kStep * ldq; };

  const int64_t first = chunk * a.chunk_rows;
  const int64_t last = first + a.chunk_rows < a.rows ? first + a.chunk_rows : a.rows;
  const int wkey = warp * kRows;  // the warp's first key in the chunk
  const bool active = key0 + wkey < a.keys;
  // The centre tap's blocks read every row of the gradient unshifted: they also sum its columns,
  // the bias gradient, by one more product a step with a B of ones (every column of the result
  // is the sum of the rows; f32 accumulation, a fixed order).
  const bool bias_sums =
      a.bias_partial != nullptr && tap0 <= a.taps / 2 && a.taps / 2 < tap0 + kAcross;
  float bias_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t ones = attn::pack<T>(1.0f, 1.0f);

  float acc[kAcross][kOut][4];
#pragma unroll
  for (int u = 0; u < kAcross; ++u) {
#pragma unroll
    for (int n = 0; n < kOut; ++n) acc[u][n][0] = acc[u][n][1] = acc[u][n][2] = acc[u][n][3] = 0.0f;
  }
  // Stages rows [m0, m0 + kStep) of the gradient and each tap's shifted queries into buffer
  // `buf`, its copies committed as one group and not waited for. Row m of the batch is
  // position m % P of image m / P.
  const auto stage_rows = [&](int buf, int64_t m0) {
    stage(buf ? g1 : g0, ldg, kStep, key0, kKeys, a.keys, [&](int r) -> const T* {
      const int64_t m = m0 + r;
      if (m >= last) return nullptr;
      const int64_t b = m / a.positions;
      const int p = static_cast<int>(m - b * a.positions);
      return a.g + b * a.gb + h * a.gh + p * a.gp;
    });
#pragma unroll
    for (int u = 0; u < kAcross; ++u) {
      const int tap = tap0 + u, dy = tap / a.k - a.radius, dx = tap % a.k - a.radius;
      stage(q_tile(buf, u), ldq, kStep, 0, a.d, a.d, [&](int r) -> const T* {
        const int64_t m = m0 + r;
        if (m >= last) return nullptr;
        const int64_t b = m / a.positions;
        const int p = static_cast<int>(m - b * a.positions);
        const int x = p % a.width + dx, s = p + dy * a.width + dx;
        if (x < 0 || x >= a.width || s < 0 || s >= a.positions) return nullptr;
        return a.q + b * a.qb + h * a.qh + s * a.qp;
      });
    }
    attn::commit_copies();
  };
  if (first < last) stage_rows(0, first);
  int buf = 0;
  for (int64_t m0 = first; m0 < last; m0 += kStep, buf ^= 1) {
    // The next rows go in flight into the other buffer (which every warp finished reading at the
    // barrier that ended the last step) before this step's are waited for.
    if (m0 + kStep < last) {
      stage_rows(buf ^ 1, m0 + kStep);
      attn::wait_copies_pending<1>();
    } else {
      attn::wait_copies_pending<0>();
    }
    __syncthreads();  // every thread's copies of this step's rows have landed
    const int steps = static_cast<int>(((last - m0 < kStep ? last - m0 : kStep) + 15) / 16);
    for (int ks = 0; ks < (active ? steps : 0); ++ks) {
      // A(j, m) = g_s[m][j]: the contraction runs down the staged rows.
      const T* block = (buf ? g1 : g0) + ks * 16 * ldg + wkey;
      uint32_t fa[4];
      if constexpr (kLdsm) {
        attn::load_a_trans_ldsm(fa, block, ldg, lane);
      } else {
        attn::load_a_trans(fa, block, ldg, lane);
      }
      if (bias_sums) mma<T>(bias_acc, fa, ones, ones);
      if (a.partial == nullptr) continue;  // the bias gradient alone
#pragma unroll
      for (int u = 0; u < kAcross; ++u) {  // b(m, c) = q_s[m][c], the tap's shifted queries
        multiply_down<kLdsm>(acc[u], fa, q_tile(buf, u) + ks * 16 * ldq, ldq, a.d, lane);
      }
    }
    __syncthreads();  // every warp is done with this step's buffer before it is staged again
  }
  if (!active) return;
  if (bias_sums && t == 0) {  // column 0 of the sums: keys g and g + 8
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = key0 + wkey + g + 8 * r;
      if (j < a.keys) {
        a.bias_partial[(static_cast<int64_t>(h) * a.chunks + chunk) * a.keys + j] = bias_acc[2 * r];
      }
    }
  }
  if (a.partial == nullptr) return;
#pragma unroll
  for (int u = 0; u < kAcross; ++u) {
    const int slice = h * a.taps + tap0 + u;
    float* out = a.partial + (static_cast<int64_t>(slice) * a.chunks + chunk) * a.keys * a.d;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = key0 + wkey + g + 8 * r;
      if (j >= a.keys) continue;
#pragma unroll
      for (int n = 0; n < kOut; ++n) {
        if (n * 8 >= a.d) break;
        // d is even: the pair is one aligned 64-bit store.
        *reinterpret_cast<float2*>(out + static_cast<int64_t>(j) * a.d + n * 8 + 2 * t) =
            make_float2(acc[u][n][2 * r], acc[u][n][2 * r + 1]);
      }
    }
  }
}

// grad_w[s, e] = the sum over the chunks, in order, of partial[s, chunk, e] (s = head * taps +
// tap, e = key * d + c), rounded once.
template <typename T>
__global__ void conv_logits_sum_partials_kernel(const float* partial, int chunks, int64_t per,
                                                int64_t n, T* gw) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = i / per, e = i - s * per;
    const float* p = partial + s * chunks * per + e;
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += p[c * per];
    gw[i] = from_float<T>(sum);
  }
}

// --- Host side ---

// The kernels' arguments for geometry geo, the queries q (strides qb, qh and qp in elements, the
// last dim's 1) and the filters w.
template <typename T>
Args<T> args_of(const ConvLogitsGeometry& geo, const T* q, int64_t qb, int64_t qh, int64_t qp,
                const T* w) {
  Args<T> a{};
  a.q = q;
  a.qb = qb;
  a.qh = qh;
  a.qp = qp;
  a.w = w;
  a.heads = static_cast<int>(geo.heads);
  a.height = static_cast<int>(geo.height);
  a.width = static_cast<int>(geo.width);
  a.positions = static_cast<int>(geo.height * geo.width);
  a.keys = static_cast<int>(geo.keys);
  a.d = static_cast<int>(geo.d);
  a.k = static_cast<int>(geo.kernel);
  a.taps = a.k * a.k;
  a.radius = a.k / 2;
  a.halo = a.radius * a.width + a.radius;
  a.group = static_cast<int>(conv_logits_tap_group(geo.d, geo.kernel));
  a.tiles = (a.positions + kTile - 1) / kTile;
  a.units = geo.batch * a.tiles;
  a.key_chunks = (a.keys + kKeys - 1) / kKeys;
  a.rows = geo.batch * a.positions;
  return a;
}

template <typename F>
void dispatch_16bit(DType dtype, const char* kernel, F&& f) {
  if (dtype == DType::kBF16) {
    f(__nv_bfloat16{});
  } else if (dtype == DType::kF16) {
    f(__half{});
  } else {
    SKA_FAIL(DTypeError, kernel, ": the CUDA kernels take bf16 or f16, got ", dtype_name(dtype));
  }
}

// The device (compute capability 8.0 or newer, for mma.sync bf16) and the problem (head dim and
// grid width, conv_logits_direct_fits) the kernels take; DeviceError / ShapeError otherwise.
void check_supported(const char* kernel, int device, const ConvLogitsGeometry& geo) {
  SKA_CHECK(compute_capability(device) >= 80, DeviceError, kernel,
            ": needs a device of compute capability 8.0 or newer (mma.sync bf16), cuda:", device,
            " has ", compute_capability(device) / 10, ".", compute_capability(device) % 10);
  SKA_CHECK(conv_logits_direct_fits(geo.d, geo.width, geo.kernel), ShapeError, kernel,
            ": head dim ", geo.d, " on a grid ", geo.width, " wide with a ", geo.kernel, "x",
            geo.kernel,
            " filter: the CUDA kernels take head dims that are multiples of 16 up to 128"
            " and tiles that fit in shared memory");
}

// Calls f with std::true_type where the kernels read their fragments by ldmatrix
// (attn::async_loads_enabled, train.attention_loads: async), std::false_type otherwise.
template <typename F>
void dispatch_loads(F&& f) {
  if (attn::async_loads_enabled()) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// The dynamic shared memory of a forward or grad_q block owning `per` tiles: `per` staged tiles
// of tile_bytes each, two buffers of a tap group's filters and the zero rows (the kernels'
// carving).
int tiles_smem(int per, int tile_bytes, int filter_bytes) {
  Carver carve;
  for (int u = 0; u < per; ++u) carve.take(tile_bytes);
  for (int i = 0; i < 2; ++i) carve.take(filter_bytes);
  carve.take(kZeroBytes);
  return carve.bytes;
}

// Tiles a forward or grad_q block owns (the kernels' kPer): two where that block's shared memory
// stays within 64 KiB, so that three fit an SM (CSKA-ViT-S's 8x8 grids, CSKAFormer's forward),
// and kPairs (grad_q's accumulators: head dims up to 64); else one. Calls f with
// std::integral_constant<int, kPer>.
template <bool kPairs, typename F>
void dispatch_per_block(int tile_bytes, int filter_bytes, F&& f) {
  constexpr int kPairBytes = 64 * 1024;
  if constexpr (kPairs) {
    if (tiles_smem(2, tile_bytes, filter_bytes) <= kPairBytes) {
      f(std::integral_constant<int, 2>{});
      return;
    }
  }
  f(std::integral_constant<int, 1>{});
}

std::atomic<bool> g_grad_w_rows{false};

// The taps a grad_w block owns (the kernel's kAcross): a filter row, 3, with 3x3 filters at head
// dims up to 64 (kD: the accumulators of three taps in registers) where
// train.conv_logits_grad_w: per_row; else one. Calls f with std::integral_constant<int, kAcross>.
template <int kD, typename F>
void dispatch_grad_w_across(int k, F&& f) {
  if constexpr (kD <= 64) {
    if (k == 3 && g_grad_w_rows.load()) {
      f(std::integral_constant<int, 3>{});
      return;
    }
  }
  f(std::integral_constant<int, 1>{});
}

int grid_dim(const char* kernel, int64_t n) {
  SKA_CHECK(n >= 1 && n <= INT_MAX, ShapeError, kernel, ": ", n, " blocks: too many");
  return static_cast<int>(n);
}
// A grid's y or z extent (heads, key chunks): at most 65535.
unsigned grid_yz(const char* kernel, const char* what, int64_t n) {
  SKA_CHECK(n >= 1 && n <= 65535, ShapeError, kernel, ": ", n, " ", what,
            ": the CUDA kernels take at most 65535");
  return static_cast<unsigned>(n);
}

// conv_logits_forward's launch once its operands are checked: `a` from args_of, with the bias,
// the logits (out, ob, oh, op) and pairs set.
template <typename T>
void launch_forward(const Args<T>& a, cudaStream_t stream) {
  const char* kKernel = "conv_logits_forward";
  const int tile_bytes = (kTile + 2 * a.halo) * ld16(a.d) * 2;
  const int filter_bytes = a.group * kKeys * ld16(a.d) * 2;
  dispatch_per_block<true>(tile_bytes, filter_bytes, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    const dim3 grid(grid_dim(kKernel, (a.units + kPer - 1) / kPer * a.key_chunks),
                    grid_yz(kKernel, "heads", a.heads));
    dispatch_loads([&](auto ldsm) {
      attn::launch(conv_logits_forward_kernel<T, decltype(ldsm)::value, kPer>, grid, kWarps,
                   tiles_smem(kPer, tile_bytes, filter_bytes), stream, a);
    });
  });
}

// The f32 partial sums launch_backward needs for grad_w and the bias gradient (either wanted or
// not).
int64_t partial_floats(const ConvLogitsGeometry& geo, bool grad_w, bool grad_bias) {
  const int64_t chunks = conv_logits_chunks(geo).chunks, taps = geo.kernel * geo.kernel;
  return (grad_w ? geo.heads * taps * chunks * geo.keys * geo.d : 0) +
         (grad_bias ? geo.heads * chunks * geo.keys : 0);
}

// Where grad_q goes: [b, h, p, c] at data + b * ob + h * oh + p * op + c; data null: not wanted.
template <typename T>
struct GradQ {
  T* data;
  int64_t ob, oh, op;
};

// conv_logits_backward's launches once its operands are checked (no extent 0): `a` from
// args_of with the logits' gradient (g, gb, gh, gp) set; grad_w and grad_bias contiguous, or
// null where not wanted, through `partials` (partial_floats of them).
template <typename T>
void launch_backward(const Args<T>& a, const ConvLogitsGeometry& geo, const GradQ<T>& grad_q,
                     T* grad_w, T* grad_bias, float* partials, cudaStream_t stream) {
  const char* kKernel = "conv_logits_backward";
  attn::dispatch_head_dim(static_cast<int>(geo.d), static_cast<int>(geo.d), [&](auto head) {
    dispatch_loads([&](auto ldsm) {
      constexpr int kD = decltype(head)::value;
      constexpr bool kLdsm = decltype(ldsm)::value;
      if (grad_q.data != nullptr) {
        Args<T> qa = a;
        qa.out = grad_q.data;
        qa.ob = grad_q.ob;
        qa.oh = grad_q.oh;
        qa.op = grad_q.op;
        const int tile_bytes = (kTile + 2 * a.halo) * ld16(kKeys) * 2;
        const int filter_bytes = a.group * kKeys * ld16(a.d) * 2;
        dispatch_per_block<(kD <= 64)>(tile_bytes, filter_bytes, [&](auto per) {
          constexpr int kPer = decltype(per)::value;
          const dim3 grid(grid_dim(kKernel, (a.units + kPer - 1) / kPer),
                          grid_yz(kKernel, "heads", geo.heads));
          attn::launch(conv_logits_grad_q_kernel<T, kD, kLdsm, kPer>, grid, kWarps,
                       tiles_smem(kPer, tile_bytes, filter_bytes), stream, qa);
        });
      }
      // grad_w and the bias gradient: one launch (the bias alone still runs every tap's blocks,
      // the centre tap's summing; frozen filters with a trained bias are rare).
      if (grad_w != nullptr || grad_bias != nullptr) {
        Args<T> wa = a;
        const ConvLogitsChunks split = conv_logits_chunks(geo);
        wa.chunks = static_cast<int>(split.chunks);
        wa.chunk_rows = split.chunk_rows;
        const int64_t per = geo.keys * geo.d, slices = geo.heads * a.taps;
        wa.partial = grad_w != nullptr ? partials : nullptr;
        wa.bias_partial = grad_bias != nullptr
                              ? partials + partial_floats(geo, grad_w != nullptr, false)
                              : nullptr;
        dispatch_grad_w_across<kD>(a.k, [&](auto across) {
          constexpr int kAcross = decltype(across)::value;
          constexpr int kStep = grad_w_step_rows(kAcross);
          Carver carve;  // the kernel's two buffers of the gradient's rows, then the queries'
          for (int i = 0; i < 2; ++i) carve.take(kStep * ld16(kKeys) * 2);
          carve.take(2 * kAcross * kStep * ld16(a.d) * 2);
          const dim3 grid(grid_dim(kKernel, split.chunks * (a.taps / kAcross)),
                          grid_yz(kKernel, "chunks of 80 keys", a.key_chunks),
                          grid_yz(kKernel, "heads", geo.heads));
          attn::launch(conv_logits_grad_w_kernel<T, kD, kLdsm, kAcross>, grid, kKeyWarps,
                       carve.bytes, stream, wa);
        });
        if (grad_w != nullptr) {
          launch_kernel(conv_logits_sum_partials_kernel<T>, grid_for(slices * per), 256, 0, stream,
                        static_cast<const float*>(wa.partial), wa.chunks, per, slices * per,
                        grad_w);
        }
        if (grad_bias != nullptr) {
          launch_kernel(conv_logits_sum_partials_kernel<T>, grid_for(geo.heads * geo.keys), 256, 0,
                        stream, static_cast<const float*>(wa.bias_partial), wa.chunks, geo.keys,
                        geo.heads * geo.keys, grad_bias);
        }
      }
    });
  });
}

}  // namespace

// The tensor-level entry points (tests/simt runs the launches above on raw host operands).
#if !defined(SKA_SIMT_KERNELS_ONLY)
void conv_logits_forward(const Tensor& q, const Tensor& w, const Tensor& bias, int64_t height,
                         int64_t width, const Tensor& logits) {
  const char* kKernel = "conv_logits_forward";
  const ConvLogitsGeometry geo = conv_logits_geometry(kKernel, q, w, bias, height, width, logits);
  if (geo.batch == 0 || geo.heads == 0 || geo.keys == 0) return;
  const int device = device_index(q);
  DeviceGuard guard(device);
  check_supported(kKernel, device, geo);
  dispatch_16bit(q.dtype(), kKernel, [&](auto tag) {
    using T = decltype(tag);
    Args<T> a = args_of<T>(geo, static_cast<const T*>(q.data_ptr()), q.stride(0), q.stride(1),
                           q.stride(2), static_cast<const T*>(w.data_ptr()));
    a.bias = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
    a.out = static_cast<T*>(logits.data_ptr());
    a.ob = logits.stride(0);
    a.oh = logits.stride(1);
    a.op = logits.stride(2);
    // A thread's keys 2t and 2t + 1 as one store where the rows, and so every even column, are
    // 4-byte aligned (the kernel stores an odd count's last key alone): an even key count in
    // contiguous logits (CSKAFormer's 784), or rows padded to 16 bytes (CSKA-ViT-S's 65 keys in
    // the mixer's logits, empty_aligned_rows).
    a.pairs = conv_logits_even_layout(logits);
    launch_forward(a, current_stream(device));
  });
}

void conv_logits_backward(const Tensor& grad, const Tensor& q, const Tensor& w, int64_t height,
                          int64_t width, const Tensor& grad_q, const Tensor& grad_w,
                          const Tensor& grad_bias) {
  const char* kKernel = "conv_logits_backward";
  const ConvLogitsGeometry geo =
      conv_logits_geometry(kKernel, q, w, Tensor(), height, width, grad, grad_q, grad_w, grad_bias);
  const int device = device_index(q);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const auto zero = [&](const Tensor& t) {
    if (t.defined() && t.numel() > 0)
      SKA_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.numel() * t.element_size(), stream));
  };
  if (geo.batch == 0 || geo.heads == 0 || geo.keys == 0 || geo.d == 0) {
    if (grad_q.defined()) Tensor(grad_q).fill_(0.0);  // a view, perhaps not dense
    zero(grad_w);
    zero(grad_bias);
    return;
  }
  check_supported(kKernel, device, geo);
  dispatch_16bit(q.dtype(), kKernel, [&](auto tag) {
    using T = decltype(tag);
    Args<T> a = args_of<T>(geo, static_cast<const T*>(q.data_ptr()), q.stride(0), q.stride(1),
                           q.stride(2), static_cast<const T*>(w.data_ptr()));
    a.g = static_cast<const T*>(grad.data_ptr());
    a.gb = grad.stride(0);
    a.gh = grad.stride(1);
    a.gp = grad.stride(2);
    GradQ<T> gq{nullptr, 0, 0, 0};
    if (grad_q.defined()) {
      gq = {static_cast<T*>(grad_q.data_ptr()), grad_q.stride(0), grad_q.stride(1),
            grad_q.stride(2)};
    }
    auto data = [](const Tensor& t) {
      return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
    };
    const int64_t floats = partial_floats(geo, grad_w.defined(), grad_bias.defined());
    const Tensor partials = floats > 0 ? workspace(device, floats * sizeof(float)) : Tensor();
    launch_backward(a, geo, gq, data(grad_w), data(grad_bias),
                    floats > 0 ? static_cast<float*>(partials.data_ptr()) : nullptr, stream);
  });
}
#endif

}  // namespace ska::cuda

namespace ska {
bool set_cuda_conv_logits_grad_w_rows(bool enabled) {
  return cuda::g_grad_w_rows.exchange(enabled);
}
}  // namespace ska
