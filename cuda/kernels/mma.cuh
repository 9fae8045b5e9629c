// The mma.sync m16n8k16 fragments (bf16/f16 in, f32 accumulate) shared by the tensor-core
// kernels: the attention kernels (attention_mma.cu) and CSKA's convolutional logits
// (conv_logits.cu). The register layout is the PTX ISA's ("Matrix Fragments for
// mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major):   a[0] = (g, 2t..2t+1), a[1] = (g + 8, 2t..), a[2] = (g, 2t+8..),
//                             a[3] = (g + 8, 2t+8..), two 16-bit elements per register;
//   B (16 x 8, "col"):        b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g);
//   C (16 x 8, f32):          c[0..1] = (g, 2t..2t+1), c[2..3] = (g + 8, 2t..2t+1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ska::cuda::attn {

template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {  // p[0] low, p[1] high; 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(p);
}
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* lo, const T* hi) {
  const uint32_t a = *reinterpret_cast<const uint16_t*>(lo);
  const uint32_t b = *reinterpret_cast<const uint16_t*>(hi);
  return a | (b << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The two 16-bit values of a word (the low one first) as f32: pack's inverse up to its rounding.
template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack<__half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// c += a b on one m16n8k16 tile.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(SKA_SIMT)
  simt::mma_m16n8k16(c, a, b0, b1, std::is_same_v<T, __nv_bfloat16>);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// The A fragment of the 16 x 16 block at `m` (row-major, row stride ld).
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* m, int ld, int lane) {
  const T* p = m + (lane >> 2) * ld + 2 * (lane & 3);
  a[0] = load_pair(p);
  a[1] = load_pair(p + 8 * ld);
  a[2] = load_pair(p + 8);
  a[3] = load_pair(p + 8 * ld + 8);
}

// The B fragment b(k, n) = m[n][k] of the 8 x 16 block at `m` (rows are B's columns: K in
// Q K^T, dO in V dO^T ...).
template <typename T>
__device__ __forceinline__ void load_b_rows(uint32_t& b0, uint32_t& b1, const T* m, int ld,
                                            int lane) {
  const T* p = m + (lane >> 2) * ld + 2 * (lane & 3);
  b0 = load_pair(p);
  b1 = load_pair(p + 8);
}

// The B fragment b(k, n) = m[k][n] of the 16 x 8 block at `m` (the contraction runs down the
// rows: V in P V, dO in P^T dO ...).
template <typename T>
__device__ __forceinline__ void load_b_cols(uint32_t& b0, uint32_t& b1, const T* m, int ld,
                                            int lane) {
  const T* p = m + 2 * (lane & 3) * ld + (lane >> 2);
  b0 = load_pair(p, p + ld);
  b1 = load_pair(p + 8 * ld, p + 9 * ld);
}

// The A fragment of the transpose of the 16 x 16 block at `m` (row-major, row stride ld):
// a(r, c) = m[c][r] (P^T and dS^T read from tiles of P and dS stored [query][key]).
template <typename T>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const T* m, int ld, int lane) {
  const T* p = m + 2 * (lane & 3) * ld + (lane >> 2);
  a[0] = load_pair(p, p + ld);
  a[1] = load_pair(p + 8, p + ld + 8);
  a[2] = load_pair(p + 8 * ld, p + 9 * ld);
  a[3] = load_pair(p + 8 * ld + 8, p + 9 * ld + 8);
}

// Shared-memory address of p for ldmatrix.
template <typename T>
__device__ __forceinline__ unsigned shared_address(const T* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Whether the fragment loads below are ldmatrix (sm_75 and newer, or its host emulation in
// tests/simt) rather than the loads they replace.
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750) || defined(SKA_SIMT)
#define SKA_LDMATRIX 1
#else
#define SKA_LDMATRIX 0
#endif

#if SKA_LDMATRIX
// ldmatrix.sync.aligned.m8n8.x4 (kTrans: .trans).shared.b16 from the row this lane names.
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
#if defined(SKA_SIMT)
  simt::ldmatrix(r, 4, kTrans, row);
#else
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  }
#endif
}
// The same with .x2: lanes 0-15 name the rows (b0: lanes 0-7, b1: 8-15).
template <bool kTrans>
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, const void* row) {
#if defined(SKA_SIMT)
  uint32_t r[2];
  simt::ldmatrix(r, 2, kTrans, row);
  r0 = r[0];
  r1 = r[1];
#else
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(shared_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(shared_address(row)));
  }
#endif
}
#endif

// load_a by one ldmatrix.x4 (`m` in shared memory, rows 16-byte aligned): lanes 0-7 address rows
// 0-7 at column 0 (a[0]), 8-15 rows 8-15 (a[1]), 16-23 rows 0-7 at column 8 (a[2]), 24-31 rows
// 8-15 at column 8 (a[3]); thread i receives row i / 4, columns 2 (i % 4) and + 1 of each:
// load_a's registers.
template <typename T>
__device__ __forceinline__ void load_a_ldsm(uint32_t (&a)[4], const T* m, int ld, int lane) {
#if SKA_LDMATRIX
  ldsm_x4<false>(a, m + (lane & 15) * ld + (lane >> 4) * 8);
#else
  load_a(a, m, ld, lane);
#endif
}

// ldmatrix.x4 from the row each lane names (shared memory, 16-byte aligned): lanes 8j to 8j + 7
// give the addresses of rows 0-7 of matrix j (8 elements each, any rows, the same one more than
// once), and thread i receives row i / 4, columns 2 (i % 4) and + 1 of matrix j in register j.
// For a warp whose 16 A rows lie anywhere in a tile (CSKA's shifted neighbours, zero rows among
// them): lane l names row l % 16 at column 8 (l / 16), and the registers are load_a's. Before
// sm_75, the rows' addresses by shuffles and 32-bit loads (the same registers).
template <typename T>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const T* row) {
#if SKA_LDMATRIX
  ldsm_x4<false>(a, row);
#else
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const auto at = __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(row),
                                8 * j + (lane >> 2));
    a[j] = load_pair(reinterpret_cast<const T*>(at) + 2 * (lane & 3));
  }
#endif
}

// load_a_trans by one ldmatrix.x4.trans (`m` in shared memory, rows 16-byte aligned): lanes 0-7
// address rows 0-7 of m at column 0 (a[0]), 8-15 the same rows at column 8 (a[1]), 16-23 rows
// 8-15 at column 0 (a[2]), 24-31 rows 8-15 at column 8 (a[3]); transposed as they load, thread i
// receives column i / 4 at rows 2 (i % 4) and + 1: load_a_trans's registers.
template <typename T>
__device__ __forceinline__ void load_a_trans_ldsm(uint32_t (&a)[4], const T* m, int ld, int lane) {
#if SKA_LDMATRIX
  ldsm_x4<true>(a, m + ((lane & 7) + ((lane >> 4) & 1) * 8) * ld + ((lane >> 3) & 1) * 8);
#else
  load_a_trans(a, m, ld, lane);
#endif
}

// load_b_rows by one ldmatrix.x2 (as load_a_ldsm): lanes 0-7 address rows 0-7 at column 0 (b0),
// lanes 8-15 the same rows at column 8 (b1).
template <typename T>
__device__ __forceinline__ void load_b_rows_ldsm(uint32_t& b0, uint32_t& b1, const T* m, int ld,
                                                 int lane) {
#if SKA_LDMATRIX
  ldsm_x2<false>(b0, b1, m + (lane & 7) * ld + ((lane >> 3) & 1) * 8);
#else
  load_b_rows(b0, b1, m, ld, lane);
#endif
}

// load_b_cols by one ldmatrix (`m` in shared memory, its 16 rows 16-byte aligned): the two 8 x 8
// blocks of the 16 x 8 tile, rows 0-7 (b0) and 8-15 (b1), transposed as they load. With .trans,
// thread i receives column i / 4 of a block at rows 2 (i % 4) and 2 (i % 4) + 1, low half first:
// (k 2t..2t+1, n g), B's layout. One instruction where load_b_cols issues four 16-bit loads and
// packs them: the same registers.
template <typename T>
__device__ __forceinline__ void load_b_cols_ldsm(uint32_t& b0, uint32_t& b1, const T* m, int ld,
                                                 int lane) {
#if SKA_LDMATRIX
  // Lanes 0-7 address rows 0-7 (the first block), lanes 8-15 rows 8-15; the others' addresses
  // are not read, and are the same rows again.
  ldsm_x2<true>(b0, b1, m + (lane & 15) * ld);
#else
  load_b_cols(b0, b1, m, ld, lane);
#endif
}

}  // namespace ska::cuda::attn
