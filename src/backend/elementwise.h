// The iteration space of elementwise kernels over same-shaped views, shared by both backends:
// dims coalesced on the host, and offsets computed with 32-bit magic-number division on either.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/shape.h"

#if defined(__CUDACC__)
#define SKA_HOST_DEVICE __host__ __device__ __forceinline__
#define SKA_UNROLL _Pragma("unroll")
#else
#define SKA_HOST_DEVICE inline
#define SKA_UNROLL
#endif

namespace ska {

// N views of one shape, with size-1 dims dropped and neighbouring dims merged wherever every
// operand steps through them as through one: a contiguous tensor becomes one dim, a bias
// broadcast over [B, N, C] two ([B * N, C] with strides (0, 1) for the bias), a head split
// [B, N, h, d] -> [B, h, N, d] four with d contiguous on both sides. Outermost dim first; one
// element is shape {1} with unit strides; an empty view keeps its 0-sized dim.
template <size_t N>
struct ElementwiseLayout {
  Shape shape;
  std::array<Shape, N> strides;
};

template <size_t N>
ElementwiseLayout<N> coalesce_layout(const Shape& shape, const std::array<Shape, N>& strides) {
  ElementwiseLayout<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t n = shape[d];
    if (n == 1) continue;
    bool merges = !out.shape.empty() && n != 0 && out.shape.back() != 0;
    for (size_t k = 0; merges && k < N; ++k) merges = out.strides[k].back() == strides[k][d] * n;
    if (merges) {  // the previous dim steps over this one exactly, in every operand
      out.shape.back() *= n;
      for (size_t k = 0; k < N; ++k) out.strides[k].back() = strides[k][d];
      continue;
    }
    out.shape.push_back(n);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
  }
  if (out.shape.empty()) {
    out.shape = {1};
    for (size_t k = 0; k < N; ++k) out.strides[k] = {1};
  }
  return out;
}

// True when every operand of the layout is one dense run of elements (stride 1 throughout).
template <size_t N>
bool layout_is_dense(const ElementwiseLayout<N>& l) {
  if (l.shape.size() != 1) return false;
  for (size_t k = 0; k < N; ++k) {
    if (l.strides[k][0] != 1 && l.shape[0] > 1) return false;
  }
  return true;
}

// True when the element count and every offset of every operand are below 2^31, so that the
// offsets can be computed in 32 bits (negative strides take the 64-bit path).
template <size_t N>
bool layout_fits_int32(const ElementwiseLayout<N>& l) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  const int64_t numel = shape_numel(l.shape);
  if (numel >= kLimit) return false;
  for (size_t k = 0; k < N; ++k) {
    int64_t last = 0;
    for (size_t d = 0; d < l.shape.size(); ++d) {
      if (l.strides[k][d] < 0) return false;
      if (l.shape[d] > 0) last += (l.shape[d] - 1) * l.strides[k][d];
      if (last >= kLimit) return false;
    }
  }
  return true;
}

// Whether reducing `dims` (sorted, unique) of a view of `shape` sums columns: every reduced dim
// of size above 1 comes before every kept one, and at least one of each has size above 1. For a
// contiguous view that is the reduction of [R, K] over its R rows (a bias gradient).
inline bool reduces_leading_dims(const Shape& shape, const std::vector<int64_t>& dims) {
  std::vector<char> is_reduced(shape.size(), 0);
  for (int64_t d : dims) is_reduced[static_cast<size_t>(d)] = 1;
  bool reduced = false, kept = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (is_reduced[d]) {
      if (kept) return false;
      reduced = true;
    } else {
      kept = true;
    }
  }
  return reduced && kept;
}

// Unsigned division by a fixed divisor d in [1, 2^31) of dividends below 2^31, as a multiply-high,
// an add and a shift (Granlund and Montgomery's round-up method): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s. The sum fits in 32 bits
// because mulhi(n, m) <= n < 2^31.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    SKA_CHECK(d >= 1 && d < (uint32_t{1} << 31), ValueError, "FastDivmod: divisor ", d,
              " is outside [1, 2^31)");
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  SKA_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

constexpr int kElementwiseMaxDims = 8;

// Element offsets of operand k for a linear index of a layout (row-major over its shape), in
// 32 bits: one magic division per dim but the outermost, none for a one-dim layout.
template <size_t N>
struct OffsetCalc32 {
  int ndim = 0;
  FastDivmod dims[kElementwiseMaxDims];            // innermost first
  uint32_t strides[kElementwiseMaxDims][N] = {};   // innermost first

  SKA_HOST_DEVICE void offsets(uint32_t linear, uint32_t (&out)[N]) const {
SKA_UNROLL
    for (size_t k = 0; k < N; ++k) out[k] = 0;
SKA_UNROLL
    for (int d = 0; d < kElementwiseMaxDims; ++d) {
      if (d == ndim) break;
      uint32_t i = linear;
      if (d + 1 < ndim) {
        const uint32_t q = dims[d].div(linear);
        i = linear - q * dims[d].divisor;
        linear = q;
      }
SKA_UNROLL
      for (size_t k = 0; k < N; ++k) out[k] += i * strides[d][k];
    }
  }
};

// The same in 64 bits, with ordinary division: views past 2^31 elements and negative strides.
template <size_t N>
struct OffsetCalc64 {
  int ndim = 0;
  int64_t sizes[kElementwiseMaxDims] = {};         // innermost first
  int64_t strides[kElementwiseMaxDims][N] = {};    // innermost first

  SKA_HOST_DEVICE void offsets(int64_t linear, int64_t (&out)[N]) const {
SKA_UNROLL
    for (size_t k = 0; k < N; ++k) out[k] = 0;
SKA_UNROLL
    for (int d = 0; d < kElementwiseMaxDims; ++d) {
      if (d == ndim) break;
      int64_t i = linear;
      if (d + 1 < ndim) {
        i = linear % sizes[d];
        linear /= sizes[d];
      }
SKA_UNROLL
      for (size_t k = 0; k < N; ++k) out[k] += i * strides[d][k];
    }
  }
};

// The calculators of a layout; both throw ShapeError past kElementwiseMaxDims dims, and the
// 32-bit one ValueError when !layout_fits_int32(l).
template <size_t N>
OffsetCalc32<N> offset_calc32(const ElementwiseLayout<N>& l) {
  const int nd = static_cast<int>(l.shape.size());
  SKA_CHECK(nd <= kElementwiseMaxDims, ShapeError, "elementwise kernels support views of up to ",
            kElementwiseMaxDims, " dims after merging, got ", shape_str(l.shape));
  SKA_CHECK(layout_fits_int32(l), ValueError, "offset_calc32: the layout ", shape_str(l.shape),
            " has offsets past 2^31");
  OffsetCalc32<N> c;
  c.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    const size_t src = static_cast<size_t>(nd - 1 - d);
    c.dims[d] = FastDivmod(static_cast<uint32_t>(l.shape[src] > 0 ? l.shape[src] : 1));
    for (size_t k = 0; k < N; ++k) c.strides[d][k] = static_cast<uint32_t>(l.strides[k][src]);
  }
  return c;
}

template <size_t N>
OffsetCalc64<N> offset_calc64(const ElementwiseLayout<N>& l) {
  const int nd = static_cast<int>(l.shape.size());
  SKA_CHECK(nd <= kElementwiseMaxDims, ShapeError, "elementwise kernels support views of up to ",
            kElementwiseMaxDims, " dims after merging, got ", shape_str(l.shape));
  OffsetCalc64<N> c;
  c.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    const size_t src = static_cast<size_t>(nd - 1 - d);
    c.sizes[d] = l.shape[src] > 0 ? l.shape[src] : 1;
    for (size_t k = 0; k < N; ++k) c.strides[d][k] = l.strides[k][src];
  }
  return c;
}

}  // namespace ska
