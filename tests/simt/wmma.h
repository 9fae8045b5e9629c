// nvcuda::wmma for the host build of CUDA kernels (tests/simt; included by simt.h): the
// m16n16k16 fragments with bf16 or f16 inputs and f32 accumulators, as the tensor-core attention
// kernels (attention_tc.cu) use them. The toolkit's <mma.h> declares nothing for a host compiler.
//
// A fragment's 256 elements are spread over the warp: lane l holds elements 8 l .. 8 l + 7 of
// the 16 x 16 tile in row-major order (m, k for matrix_a; k, n for matrix_b; m, n for the
// accumulator), whatever layout it was loaded from. The device's layout is opaque, so code that
// touches x[] only elementwise runs the same on both. Loads and stores are each lane's own
// elements, with no meeting of the lanes: a lane that loads a tile before the others have
// written it (a missing __syncwarp) reads what was there before. mma_sync is warp-wide (all 32
// lanes meet): exact products summed with the accumulator in f64 and rounded once to f32, as
// simt's mma.sync, not the tensor cores' own order. Pointers must be 32-byte aligned and strides
// multiples of 16 bytes, as the CUDA Programming Guide asks; anything else is an error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ska::simt {

// d = a b + c on the warp's fragments, each lane passing its 8 elements of each (16-bit inputs
// as bits; bf16 or f16) and getting its 8 of d.
void wmma_mma(float (&d)[8], const uint16_t (&a)[8], const uint16_t (&b)[8], const float (&c)[8],
              bool bf16);
// Fails unless p is 32-byte aligned and the row stride ldm_bytes a multiple of 16 bytes.
void wmma_check(const void* p, size_t ldm_bytes, const char* what);
int lane();

}  // namespace ska::simt

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "simt's wmma has m16n16k16 only");
  static_assert(std::is_same_v<Use, accumulator>
                    ? std::is_same_v<T, float>
                    : std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "simt's wmma: bf16 or f16 inputs, f32 accumulators");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace detail {

// Element e of a lane's 8: its (row, column) in the tile (row-major order).
inline int row_of(int e) { return (ska::simt::lane() * 8 + e) / 16; }
inline int col_of(int e) { return (ska::simt::lane() * 8 + e) % 16; }

template <typename T>
uint16_t bits(T v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

}  // namespace detail

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
  for (T& e : f.x) e = v;
}

// matrix_a (m, k) or matrix_b (k, n) from p, rows (row_major) or columns (col_major) ldm
// elements apart.
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its layout");
  ska::simt::wmma_check(p, size_t{ldm} * sizeof(T), "wmma::load_matrix_sync");
  for (int e = 0; e < 8; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    f.x[e] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
  }
}
template <typename Layout>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, float, Layout>& f, const float* p,
                      unsigned ldm, layout_t layout) {
  ska::simt::wmma_check(p, size_t{ldm} * sizeof(float), "wmma::load_matrix_sync");
  for (int e = 0; e < 8; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}
template <typename Layout>
void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float, Layout>& f,
                       unsigned ldm, layout_t layout) {
  ska::simt::wmma_check(p, size_t{ldm} * sizeof(float), "wmma::store_matrix_sync");
  for (int e = 0; e < 8; ++e) {
    const int r = detail::row_of(e), c = detail::col_of(e);
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

template <typename T, typename LayoutA, typename LayoutB, typename LayoutC, typename LayoutD>
void mma_sync(fragment<accumulator, 16, 16, 16, float, LayoutD>& d,
              const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float, LayoutC>& c) {
  uint16_t ab[8], bb[8];
  for (int e = 0; e < 8; ++e) {
    ab[e] = detail::bits(a.x[e]);
    bb[e] = detail::bits(b.x[e]);
  }
  ska::simt::wmma_mma(d.x, ab, bb, c.x, std::is_same_v<T, __nv_bfloat16>);
}

}  // namespace nvcuda::wmma
