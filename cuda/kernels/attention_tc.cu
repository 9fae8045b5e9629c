// Fused attention on the tensor cores (WMMA m16n16k16, bf16/f16 in, f32 accumulate): the forward
// pass and the dK/dV and dQ kernels of the backward pass, for head dims multiple of 16 up to 128.
//
// Design. The structure of the scalar kernels (attention.cu), with the two products of each step
// on the tensor cores. A block has 1 to 4 warps; each warp owns kWarpRows = 16 rows (one fragment
// tall) of one side and walks kTile = 32 wide tiles of the other side, staged in shared memory in
// the storage dtype (the load converts any view layout to dense padded rows):
//   forward, dQ: rows are queries, a block per (leading index, 16 x warps queries);
//   dK, dV:      rows are keys, a block per (leading index, 16 x warps keys).
// Per step a warp multiplies its 16 rows by the tile's rows (S = Q K^T, dP = dO V^T, or their
// transposes in dK/dV) into f32 accumulator fragments and stores them to its shared 16 x 32
// scratch. Scalar code then does everything that needs to know which element is which (the
// fragment layouts are opaque): scaling, bias, the online softmax (f32 running max and sum per
// row, the f32 output accumulator in shared memory rescaled row by row), P = exp(z - lse) and
// dS = P (dP - D) in the backward, grad_bias. It writes P or dS back in the input dtype, which
// the warp loads as a matrix_a fragment for the second product (O += P V, dV += P^T dO,
// dK += dS^T Q, dQ += dS K). Rounding P and dS to bf16/f16 there is the one loss of precision
// beyond the scalar kernels (flash-attention does the same); sums, max and lse stay f32.
// The backward keeps the dK/dV and dQ accumulators in fragments (registers: at most 16
// fragments for d = dv = 128), scales them elementwise at the end and writes them through the
// scratch. No atomics, fixed summation order: the same bits on every run. Shared memory per
// block, at 4 warps: forward 33/49/81 KiB, dK/dV 51/63/87 KiB, dQ 39/51/75 KiB for head dims
// 32/64/128 (opted in above 48 KiB; sm_80..sm_90 allow at least 99 KiB). Registers: up to 254
// per thread in the dK/dV kernel at head dim 128 (its 16 accumulator fragments), no spills.
// First verified on a CPU emulator of WMMA; the [cuda] tests pass on an H200 (2026-11-26), and
// tests/simt runs the kernels' own code in CI (its WMMA: tests/simt/wmma.h). Slow:
// 8 TFLOP/s in ViT-S training there (the softmax through shared memory between the products);
// attention_mma.cu keeps it in registers instead (set_cuda_attention_mma).
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/device_runtime.h"
#include "cuda/kernels/attention_tc.cuh"

namespace ska::cuda::attn {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarpRows = 16;  // the rows a warp owns: one fragment tall
constexpr int kMaxWarps = 4;   // a block owns 16 to 64 rows
constexpr int kTile = 32;      // the tile of the other side: two fragments wide
constexpr int kFrag = 16;      // m = n = k of the fragments
constexpr int kMaxHeadDim = 128;

#if !defined(SKA_SIMT_KERNELS_ONLY)
std::atomic<bool> g_tensor_cores{true};
#endif

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major>;
template <typename T, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, Layout>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// The tiles of each kernel (byte offsets), for `rows` = 16 x warps rows per block. "scratch":
// each warp's 16 x 32 f32 products; p, ds: the same in the input dtype.
struct ForwardSmem {
  int q, k, v, s, p, o, bytes;
  __host__ __device__ ForwardSmem(int rows, int d, int dv) {
    Carver c;
    q = c.take(rows * ld16(d) * 2);      // [rows][d]
    k = c.take(kTile * ld16(d) * 2);     // [32][d]
    v = c.take(kTile * ld16(dv) * 2);    // [32][dv]
    s = c.take(rows * ld32(kTile) * 4);  // scratch
    p = c.take(rows * ld16(kTile) * 2);  // [rows][32]
    o = c.take(rows * ld32(dv) * 4);     // [rows][dv] f32 output accumulator
    bytes = c.bytes;
  }
};
struct GradKvSmem {
  int k, v, q, go, s, dp, p, ds, bias, lse, delta, bytes;
  __host__ __device__ GradKvSmem(int rows, int d, int dv) {
    Carver c;
    k = c.take(rows * ld16(d) * 2);        // [rows][d]
    v = c.take(rows * ld16(dv) * 2);       // [rows][dv]
    q = c.take(kTile * ld16(d) * 2);       // [32][d]
    go = c.take(kTile * ld16(dv) * 2);     // [32][dv]
    s = c.take(rows * ld32(kTile) * 4);    // scratch: S^T
    dp = c.take(rows * ld32(kTile) * 4);   // scratch: dP^T
    p = c.take(rows * ld16(kTile) * 2);    // [rows][32]: P^T
    ds = c.take(rows * ld16(kTile) * 2);   // [rows][32]: dS^T
    bias = c.take(kTile * (rows + 1) * 4);  // [32][rows + 1] f32: odd stride, no bank conflicts
    lse = c.take(kTile * 4);
    delta = c.take(kTile * 4);
    bytes = c.bytes;
  }
};
struct GradQSmem {
  int q, go, k, v, s, dp, ds, lse, delta, bytes;
  __host__ __device__ GradQSmem(int rows, int d, int dv) {
    Carver c;
    q = c.take(rows * ld16(d) * 2);       // [rows][d]
    go = c.take(rows * ld16(dv) * 2);     // [rows][dv]
    k = c.take(kTile * ld16(d) * 2);      // [32][d]
    v = c.take(kTile * ld16(dv) * 2);     // [32][dv]
    s = c.take(rows * ld32(kTile) * 4);   // scratch: S
    dp = c.take(rows * ld32(kTile) * 4);  // scratch: dP
    ds = c.take(rows * ld16(kTile) * 2);  // [rows][32]: dS
    lse = c.take(rows * 4);
    delta = c.take(rows * 4);
    bytes = c.bytes;
  }
};

// c (16 x 32 f32, row stride ldc) = a b^T: a the warp's 16 rows and b a tile's 32 rows, both
// 16 x steps wide, row-major in shared memory (b^T is b read as a column-major matrix_b).
template <typename T>
__device__ void multiply_abt(const T* a, int lda, const T* b, int ldb, int steps, float* c,
                             int ldc) {
  FragC acc[2];
  wmma::fill_fragment(acc[0], 0.0f);
  wmma::fill_fragment(acc[1], 0.0f);
  for (int kk = 0; kk < steps; ++kk) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + kk * kFrag, lda);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      FragB<T, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, b + n * kFrag * ldb + kk * kFrag, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
  wmma::store_matrix_sync(c, acc[0], ldc, wmma::mem_row_major);
  wmma::store_matrix_sync(c + kFrag, acc[1], ldc, wmma::mem_row_major);
}

// acc[nb] += a b[:, 16 nb : 16 nb + 16] for nb < steps: a the warp's 16 x 32 weights, b a tile's
// 32 rows, both row-major in shared memory. The accumulators stay in registers (kSteps covers
// the widest head dim; the loop unrolls so that acc is indexed by constants).
template <typename T, int kSteps>
__device__ void accumulate_ab(FragC (&acc)[kSteps], const T* a, int lda, const T* b, int ldb,
                              int steps) {
  FragA<T> fa[2];
  wmma::load_matrix_sync(fa[0], a, lda);
  wmma::load_matrix_sync(fa[1], a + kFrag, lda);
#pragma unroll
  for (int nb = 0; nb < kSteps; ++nb) {
    if (nb >= steps) break;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      FragB<T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + kk * kFrag * ldb + nb * kFrag, ldb);
      wmma::mma_sync(acc[nb], fa[kk], fb, acc[nb]);
    }
  }
}

// Writes scale * acc, the warp's 16 rows from row0 on (rows >= n skipped), to an
// [n, 16 x steps] gradient whose rows lie `ld` elements apart, each fragment staged through the
// warp's f32 scratch.
template <typename T, int kSteps>
__device__ void write_rows(FragC (&acc)[kSteps], int steps, float scale, float* scratch, int lds,
                           T* out, int64_t ld, int row0, int n) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nb = 0; nb < kSteps; ++nb) {
    if (nb >= steps) break;
    for (int e = 0; e < acc[nb].num_elements; ++e) acc[nb].x[e] *= scale;
    wmma::store_matrix_sync(scratch, acc[nb], lds, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < kFrag * kFrag; e += 32) {
      const int r = e / kFrag, c = e % kFrag, i = row0 + r;
      if (i < n) out[i * ld + nb * kFrag + c] = from_float<T>(scratch[r * lds + c]);
    }
    __syncwarp();
  }
}

// --- Forward: a block per (leading index g, 16 x warps queries); online softmax over key tiles ---
template <typename T>
__global__ void __launch_bounds__(kMaxWarps * 32) tc_forward_kernel(ForwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kWarpRows;
  const int64_t g = blockIdx.x / a.tiles;
  const int i0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = i0 + warp * kWarpRows;  // the warp's first query
  const ForwardSmem at(rows, in.d, in.dv);
  const int ldk = ld16(in.d), ldv = ld16(in.dv), lds = ld32(kTile), ldp = ld16(kTile),
            ldo = ld32(in.dv);
  T* q_s = reinterpret_cast<T*>(smem + at.q);
  T* k_s = reinterpret_cast<T*>(smem + at.k);
  T* v_s = reinterpret_cast<T*>(smem + at.v);
  float* s_w = reinterpret_cast<float*>(smem + at.s) + warp * kWarpRows * lds;
  T* p_w = reinterpret_cast<T*>(smem + at.p) + warp * kWarpRows * ldp;
  float* o_w = reinterpret_cast<float*>(smem + at.o) + warp * kWarpRows * ldo;

  const T* kg = in.k + in.kv.lead.offset(g);
  const T* vg = in.v + in.vv.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  load_tile(q_s, ldk, in.q + in.qv.lead.offset(g), in.qv, i0, rows, in.nq, in.d, in.async_loads);
  for (int e = lane; e < kWarpRows * in.dv; e += 32) o_w[e / in.dv * ldo + e % in.dv] = 0.0f;
  const bool active = w0 < in.nq;  // warp-uniform
  const int dsteps = in.d / kFrag, vsteps = in.dv / kFrag;

  // The f32 softmax statistics of row r live in lane r: the running max and sum.
  float m_own = -INFINITY, l_own = 0.0f;
  for (int j0 = 0; j0 < in.nk; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous tiles (and q_s is loaded)
    load_tile(k_s, ldk, kg, in.kv, j0, kTile, in.nk, in.d, in.async_loads, /*wait=*/false);
    load_tile(v_s, ldv, vg, in.vv, j0, kTile, in.nk, in.dv, in.async_loads);
    __syncthreads();
    if (!active) continue;
    multiply_abt(q_s + warp * kWarpRows * ldk, ldk, k_s, ldk, dsteps, s_w, lds);
    __syncwarp();
    const int j = j0 + lane;
    for (int r = 0; r < kWarpRows; ++r) {
      const int i = w0 + r;
      float z = -INFINITY;
      if (j < in.nk && !excluded(in, i, j)) {
        z = scale * s_w[r * lds + lane];
        if (bg != nullptr && i < in.nq) z += bscale * bias_at(bg, in.bv, i, j);
      }
      const float m_old = __shfl_sync(0xffffffffu, m_own, r);
      const float m_new = fmaxf(m_old, warp_max(z));
      // While every z of the row so far is -inf, measure from 0: the weights stay 0, not NaN.
      const float ref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m_old - ref);
      const float p = expf(z - ref);
      const float sum = warp_sum(p);
      if (lane == r) {
        l_own = l_own * alpha + sum;
        m_own = m_new;
      }
      p_w[r * ldp + lane] = from_float<T>(p);
      if (alpha != 1.0f) {  // warp-uniform: the row's max moved
        for (int c = lane; c < in.dv; c += 32) o_w[r * ldo + c] *= alpha;
      }
    }
    __syncwarp();
    // O += P V, the accumulator fragments loaded from and stored back to o_w.
    FragA<T> fp[2];
    wmma::load_matrix_sync(fp[0], p_w, ldp);
    wmma::load_matrix_sync(fp[1], p_w + kFrag, ldp);
    for (int nb = 0; nb < vsteps; ++nb) {
      FragC acc;
      wmma::load_matrix_sync(acc, o_w + nb * kFrag, ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        FragB<T, wmma::row_major> fv;
        wmma::load_matrix_sync(fv, v_s + kk * kFrag * ldv + nb * kFrag, ldv);
        wmma::mma_sync(acc, fp[kk], fv, acc);
      }
      wmma::store_matrix_sync(o_w + nb * kFrag, acc, ldo, wmma::mem_row_major);
    }
  }
  if (!active) return;
  __syncwarp();
  T* og = a.out + a.ov.lead.offset(g);
  for (int r = 0; r < kWarpRows; ++r) {
    const int i = w0 + r;
    if (i >= in.nq) break;  // warp-uniform
    const auto [inv, lse] = row_end(__shfl_sync(0xffffffffu, l_own, r),
                                    __shfl_sync(0xffffffffu, m_own, r), in.nk);
    for (int c = lane; c < in.dv; c += 32) {
      og[i * a.ov.row + c * a.ov.col] = from_float<T>(o_w[r * ldo + c] * inv);
    }
    if (lane == 0) a.lse[g * in.nq + i] = lse;
  }
}

// --- Backward ---

// dK and dV: a block per (leading index g, 16 x warps keys), walking the query tiles.
//   dV[j] = sum over i of P[i, j] dO[i],  dK[j] = scale * sum over i of dS[i, j] q[i].
template <typename T, int kSteps>
__global__ void __launch_bounds__(kMaxWarps * 32) tc_grad_kv_kernel(BackwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kWarpRows;
  const int64_t g = blockIdx.x / a.tiles;
  const int j0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = j0 + warp * kWarpRows;  // the warp's first key
  const GradKvSmem at(rows, in.d, in.dv);
  const int ldk = ld16(in.d), ldv = ld16(in.dv), lds = ld32(kTile), ldp = ld16(kTile);
  T* k_s = reinterpret_cast<T*>(smem + at.k);
  T* v_s = reinterpret_cast<T*>(smem + at.v);
  T* q_s = reinterpret_cast<T*>(smem + at.q);
  T* go_s = reinterpret_cast<T*>(smem + at.go);
  float* s_w = reinterpret_cast<float*>(smem + at.s) + warp * kWarpRows * lds;
  float* dp_w = reinterpret_cast<float*>(smem + at.dp) + warp * kWarpRows * lds;
  T* p_w = reinterpret_cast<T*>(smem + at.p) + warp * kWarpRows * ldp;
  T* ds_w = reinterpret_cast<T*>(smem + at.ds) + warp * kWarpRows * ldp;
  float* b_s = reinterpret_cast<float*>(smem + at.bias);
  float* lse_s = reinterpret_cast<float*>(smem + at.lse);
  float* delta_s = reinterpret_cast<float*>(smem + at.delta);

  const T* qg = in.q + in.qv.lead.offset(g);
  const T* gog = a.go + a.gov.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  load_tile(k_s, ldk, in.k + in.kv.lead.offset(g), in.kv, j0, rows, in.nk, in.d, in.async_loads,
            /*wait=*/false);
  load_tile(v_s, ldv, in.v + in.vv.lead.offset(g), in.vv, j0, rows, in.nk, in.dv, in.async_loads);
  const bool active = w0 < in.nk;
  const int dsteps = in.d / kFrag, vsteps = in.dv / kFrag;

  FragC acc_k[kSteps], acc_v[kSteps];
#pragma unroll
  for (int nb = 0; nb < kSteps; ++nb) {
    wmma::fill_fragment(acc_k[nb], 0.0f);
    wmma::fill_fragment(acc_v[nb], 0.0f);
  }
  for (int i0 = 0; i0 < in.nq; i0 += kTile) {
    __syncthreads();
    load_tile(q_s, ldk, qg, in.qv, i0, kTile, in.nq, in.d, in.async_loads, /*wait=*/false);
    load_tile(go_s, ldv, gog, a.gov, i0, kTile, in.nq, in.dv, in.async_loads);
    if (threadIdx.x < kTile) {
      const int i = i0 + threadIdx.x;
      lse_s[threadIdx.x] = i < in.nq ? a.lse[g * in.nq + i] : 0.0f;
      delta_s[threadIdx.x] = i < in.nq ? a.delta[g * in.nq + i] : 0.0f;
    }
    if (bg != nullptr) {  // read along the keys: coalesced for a row-major bias
      for (int e = threadIdx.x; e < kTile * rows; e += blockDim.x) {
        const int ti = e / rows, tj = e % rows, i = i0 + ti, j = j0 + tj;
        b_s[ti * (rows + 1) + tj] =
            i < in.nq && j < in.nk ? bscale * bias_at(bg, in.bv, i, j) : 0.0f;
      }
    }
    __syncthreads();
    if (!active) continue;
    multiply_abt(k_s + warp * kWarpRows * ldk, ldk, q_s, ldk, dsteps, s_w, lds);    // S^T
    multiply_abt(v_s + warp * kWarpRows * ldv, ldv, go_s, ldv, vsteps, dp_w, lds);  // dP^T
    __syncwarp();
    const int i = i0 + lane;
#pragma unroll 1
    for (int r = 0; r < kWarpRows; ++r) {
      const int j = w0 + r;
      float p = 0.0f, ds = 0.0f;
      if (i < in.nq && j < in.nk && !excluded(in, i, j)) {
        float z = scale * s_w[r * lds + lane];
        if (bg != nullptr) z += b_s[lane * (rows + 1) + warp * kWarpRows + r];
        p = expf(z - lse_s[lane]);
        ds = p * (dp_w[r * lds + lane] - delta_s[lane]);
      }
      p_w[r * ldp + lane] = from_float<T>(p);
      ds_w[r * ldp + lane] = from_float<T>(ds);
    }
    __syncwarp();
    accumulate_ab(acc_v, p_w, ldp, go_s, ldv, vsteps);
    accumulate_ab(acc_k, ds_w, ldp, q_s, ldk, dsteps);
  }
  if (!active) return;
  write_rows(acc_k, dsteps, scale, s_w, lds, a.gk + a.gkv.lead.offset(g), a.gkv.row, w0, in.nk);
  write_rows(acc_v, vsteps, 1.0f, s_w, lds, a.gv + a.gvv.lead.offset(g), a.gvv.row, w0, in.nk);
}

// dQ and grad_bias: a block per (leading index g, 16 x warps queries), walking the key tiles.
//   dS[i, j] = P[i, j] * (dO[i] . v[j] - D[i]),  dQ[i] = scale * sum over j of dS[i, j] k[j].
template <typename T, int kSteps>
__global__ void __launch_bounds__(kMaxWarps * 32) tc_grad_q_kernel(BackwardArgs<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Inputs<T>& in = a.in;
  const float scale = effective_scale(in), bscale = bias_scale(in);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = blockDim.x / 32 * kWarpRows;
  const int64_t g = blockIdx.x / a.tiles;
  const int i0 = static_cast<int>(blockIdx.x % a.tiles) * rows;
  const int w0 = i0 + warp * kWarpRows;  // the warp's first query
  const GradQSmem at(rows, in.d, in.dv);
  const int ldk = ld16(in.d), ldv = ld16(in.dv), lds = ld32(kTile), ldp = ld16(kTile);
  T* q_s = reinterpret_cast<T*>(smem + at.q);
  T* go_s = reinterpret_cast<T*>(smem + at.go);
  T* k_s = reinterpret_cast<T*>(smem + at.k);
  T* v_s = reinterpret_cast<T*>(smem + at.v);
  float* s_w = reinterpret_cast<float*>(smem + at.s) + warp * kWarpRows * lds;
  float* dp_w = reinterpret_cast<float*>(smem + at.dp) + warp * kWarpRows * lds;
  T* ds_w = reinterpret_cast<T*>(smem + at.ds) + warp * kWarpRows * ldp;
  float* lse_s = reinterpret_cast<float*>(smem + at.lse);
  float* delta_s = reinterpret_cast<float*>(smem + at.delta);

  const T* kg = in.k + in.kv.lead.offset(g);
  const T* vg = in.v + in.vv.lead.offset(g);
  const T* bg = in.bias ? in.bias + in.bv.lead.offset(g) : nullptr;
  T* gbg = grad_bias_of(a, g);
  load_tile(q_s, ldk, in.q + in.qv.lead.offset(g), in.qv, i0, rows, in.nq, in.d, in.async_loads,
            /*wait=*/false);
  load_tile(go_s, ldv, a.go + a.gov.lead.offset(g), a.gov, i0, rows, in.nq, in.dv, in.async_loads);
  if (threadIdx.x < rows) {
    const int i = i0 + threadIdx.x;
    lse_s[threadIdx.x] = i < in.nq ? a.lse[g * in.nq + i] : 0.0f;
    delta_s[threadIdx.x] = i < in.nq ? a.delta[g * in.nq + i] : 0.0f;
  }
  const bool active = w0 < in.nq;
  const int dsteps = in.d / kFrag, vsteps = in.dv / kFrag;
  const float* lse_w = lse_s + warp * kWarpRows;
  const float* delta_w = delta_s + warp * kWarpRows;

  FragC acc[kSteps];
#pragma unroll
  for (int nb = 0; nb < kSteps; ++nb) wmma::fill_fragment(acc[nb], 0.0f);
  for (int j0 = 0; j0 < in.nk; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous tiles (and q_s, go_s are loaded)
    load_tile(k_s, ldk, kg, in.kv, j0, kTile, in.nk, in.d, in.async_loads, /*wait=*/false);
    load_tile(v_s, ldv, vg, in.vv, j0, kTile, in.nk, in.dv, in.async_loads);
    __syncthreads();
    if (!active) continue;
    multiply_abt(q_s + warp * kWarpRows * ldk, ldk, k_s, ldk, dsteps, s_w, lds);    // S
    multiply_abt(go_s + warp * kWarpRows * ldv, ldv, v_s, ldv, vsteps, dp_w, lds);  // dP
    __syncwarp();
    const int j = j0 + lane;
#pragma unroll 1
    for (int r = 0; r < kWarpRows; ++r) {
      const int i = w0 + r;
      float ds = 0.0f;
      if (i < in.nq && j < in.nk) {
        if (!excluded(in, i, j)) {
          float z = scale * s_w[r * lds + lane];
          if (bg != nullptr) z += bscale * bias_at(bg, in.bv, i, j);
          ds = expf(z - lse_w[r]) * (dp_w[r * lds + lane] - delta_w[r]);
        }
        if (gbg != nullptr) store_grad_bias(gbg, a, i, j, bscale, ds);
      }
      ds_w[r * ldp + lane] = from_float<T>(ds);
    }
    __syncwarp();
    accumulate_ab(acc, ds_w, ldp, k_s, ldk, dsteps);
  }
  if (!active) return;
  write_rows(acc, dsteps, scale, s_w, lds, a.gq + a.gqv.lead.offset(g), a.gqv.row, w0, in.nq);
}

// --- Host side ---

// Warps per block for n rows on the warps' side: as many as have rows, at most kMaxWarps.
int warps_for(int n) { return std::clamp((n + kWarpRows - 1) / kWarpRows, 1, kMaxWarps); }
int tiles_for(int n, int warps) { return (n + warps * kWarpRows - 1) / (warps * kWarpRows); }

// Calls f(std::integral_constant<int, kSteps>{}) with kSteps the fragments that cover the widest
// head dim: 2 (up to 32), 4 (up to 64) or 8 (up to 128).
template <typename F>
void dispatch_steps(int d, int dv, F&& f) {
  dispatch_head_dim(d, dv, [&](auto head) {
    f(std::integral_constant<int, decltype(head)::value / kFrag>{});
  });
}

}  // namespace

// The device queries; tests/simt's host build answers resident_blocks itself
// (attention_mma_host.cpp) and calls tc_forward / tc_backward directly.
#if !defined(SKA_SIMT_KERNELS_ONLY)
int64_t resident_blocks(const void* kernel, int warps, size_t bytes) {
  int device = 0;
  SKA_CUDA_CHECK(cudaGetDevice(&device));
  using Key = std::tuple<const void*, int, size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{kernel, warps, bytes, device};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  allow_smem(kernel, bytes);
  int per_sm = 0;
  SKA_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * 32, bytes));
  const int64_t blocks = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * sm_count(device));
  cache.emplace(key, blocks);
  return blocks;
}

bool tc_supported(DType dtype, int d, int dv, int device) {
  const auto fits = [](int n) { return n >= kFrag && n <= kMaxHeadDim && n % kFrag == 0; };
  // d = 0: no q k^T term (attention from given logits in the bias); the products with V remain.
  return g_tensor_cores.load() && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         (d == 0 || fits(d)) && fits(dv) && compute_capability(device) >= 80;
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

template <typename T>
void tc_forward(ForwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  const int warps = warps_for(a.in.nq);
  a.tiles = tiles_for(a.in.nq, warps);
  const unsigned int grid = grid_of("attention_forward", groups, a.tiles);
  const ForwardSmem smem(warps * kWarpRows, a.in.d, a.in.dv);
  launch(tc_forward_kernel<T>, grid, warps, smem.bytes, stream, a);
}

template <typename T>
void tc_backward(BackwardArgs<T> a, int64_t groups, cudaStream_t stream) {
  const char* kKernel = "attention_backward";
  const Inputs<T>& in = a.in;
  dispatch_steps(in.d, in.dv, [&](auto steps) {
    constexpr int kSteps = decltype(steps)::value;
    if (in.nk > 0) {  // dK, dV (zero when there are no queries)
      const int warps = warps_for(in.nk);
      BackwardArgs<T> kv = a;
      kv.tiles = tiles_for(in.nk, warps);
      const GradKvSmem smem(warps * kWarpRows, in.d, in.dv);
      launch(tc_grad_kv_kernel<T, kSteps>, grid_of(kKernel, groups, kv.tiles), warps, smem.bytes,
             stream, kv);
    }
    if (in.nq > 0) {  // dQ (zero when there are no keys) and grad_bias
      const int warps = warps_for(in.nq);
      BackwardArgs<T> qa = a;
      qa.tiles = tiles_for(in.nq, warps);
      const GradQSmem smem(warps * kWarpRows, in.d, in.dv);
      launch(tc_grad_q_kernel<T, kSteps>, grid_of(kKernel, groups, qa.tiles), warps, smem.bytes,
             stream, qa);
    }
  });
}

template void tc_forward<__nv_bfloat16>(ForwardArgs<__nv_bfloat16>, int64_t, cudaStream_t);
template void tc_forward<__half>(ForwardArgs<__half>, int64_t, cudaStream_t);
template void tc_backward<__nv_bfloat16>(BackwardArgs<__nv_bfloat16>, int64_t, cudaStream_t);
template void tc_backward<__half>(BackwardArgs<__half>, int64_t, cudaStream_t);

}  // namespace ska::cuda::attn

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace ska {

bool set_cuda_attention_tensor_cores(bool enabled) {
  return cuda::attn::g_tensor_cores.exchange(enabled);
}

}  // namespace ska
#endif
