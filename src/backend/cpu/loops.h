// Strided iteration for CPU kernels: visits every element of same-shaped views row by row
// (innermost dim of their coalesced layout), with rows spread over OpenMP threads.
#pragma once

#include <array>
#include <cstdint>

#include "backend/elementwise.h"
#include "core/tensor.h"

namespace ska::cpu {

// For each innermost row: fn(offsets, length, inner_strides), where offsets[k] is the element
// offset of the row's first element in operand k (relative to its data_ptr()). Dims are merged
// first (coalesce_layout), so a contiguous or broadcast operand gives long rows.
template <size_t N, typename F>
void for_each_row(const Shape& view_shape, const std::array<Shape, N>& view_strides, F&& fn) {
  const ElementwiseLayout<N> layout = coalesce_layout<N>(view_shape, view_strides);
  const Shape& shape = layout.shape;
  const std::array<Shape, N>& strides = layout.strides;
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t inner = ndim == 0 ? 1 : shape[ndim - 1];
  std::array<int64_t, N> inner_strides{};
  for (size_t k = 0; k < N; ++k) inner_strides[k] = ndim == 0 ? 0 : strides[k][ndim - 1];
  const int64_t rows = inner == 0 ? 0 : shape_numel(shape) / inner;
#pragma omp parallel for schedule(static) if (rows * inner > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    std::array<int64_t, N> off{};
    int64_t rem = r;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rem % shape[d];
      rem /= shape[d];
      for (size_t k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
    fn(off, inner, inner_strides);
  }
}

// Applies f to every element of `n` consecutive elements; contiguous fast path, parallel.
template <typename F>
void parallel_for(int64_t n, F&& f, int64_t grain = 32768) {
#pragma omp parallel for schedule(static) if (n > grain)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace ska::cpu
