// The indexing kernels (cuda/kernels/index.cu) on host memory, run by tests/simt
// (tests/simt/index_host.cpp builds the kernel file for the host), launched as index_select,
// gather and the contiguous index_add launch them. Contiguous operands of `sizes` (the output's
// for the copies); i64 indices, an out-of-range one writing 0 (copies) or dropped (index_add).
#pragma once

#include <cstdint>
#include <vector>

namespace ska::simt::index {

using Dims = std::vector<int64_t>;

// out [.., index.size(), ..] = x [.., x_dim_size, ..] at index along dim (E: the element).
template <typename E>
void index_select(const E* x, int64_t x_dim_size, const Dims& out_sizes, int64_t dim,
                  const int64_t* index, E* out);

// out = x at index [out_sizes] along dim (x of x_sizes).
template <typename E>
void gather(const E* x, const Dims& x_sizes, const Dims& out_sizes, int64_t dim,
            const int64_t* index, E* out);

// out [outer, rows, inner] += src [outer, n, inner] by index [n]: by output element or by
// column; by_output_fits says which index_add takes.
template <typename T>
void index_add(const T* src, const int64_t* index, int64_t n, int64_t outer, int64_t rows,
               int64_t inner, T* out, bool by_output);
bool by_output_fits(int64_t rows, int64_t out_numel, int64_t n);

}  // namespace ska::simt::index
