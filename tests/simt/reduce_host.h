// The row and column reductions (cuda/kernels/reduce.cu) on host memory, run by tests/simt
// (tests/simt/reduce_host.cpp builds the kernel file for the host), launched as cuda::reduce
// launches them on a GPU of `sms` multiprocessors. T: x's dtype (f32, bf16, f16); Out: T, or f32
// for a 16-bit T.
#pragma once

#include <cstdint>

#include "backend/kernel_types.h"

namespace ska::simt::reduce {

// One pass of the column reduction kernel over [rows, cols] (cuda's ColumnPass): a block of
// col_threads x lanes threads a tile of col_threads * vec columns and chunk_rows rows; grid
// tiles x chunks.
struct ColumnPass {
  int vec = 1, col_threads = 1, lanes = 1;
  int64_t tiles = 1, chunks = 1, chunk_rows = 0;
};

// The passes cuda::reduce takes over the rows of [rows, cols] of elem_bytes elements, x at a
// 16-byte boundary or not: the first over x, and when it leaves partials (first.chunks > 1) the
// second over them.
struct ColumnPlan {
  ColumnPass first, second;
};
ColumnPlan column_plan(int64_t rows, int64_t cols, int elem_bytes, bool x_aligned, int64_t sms);

// out[c] = op over r of x[r * cols + c] (the leading dims reduced).
template <ReduceOp OP, typename T, typename Out>
void columns(const T* x, Out* out, int64_t rows, int64_t cols, int64_t sms);

// out[r] = op over j of x[r * len + j] (the trailing dims reduced), on grids of at most
// max_blocks blocks (the GPU's: 2^20), which stride over the rest.
template <ReduceOp OP, typename T, typename Out>
void rows(const T* x, Out* out, int64_t rows, int64_t len, int64_t sms,
          int64_t max_blocks = int64_t{1} << 20);

// How many pieces the row reduction splits each row into (1: a warp or a block a row).
int64_t row_chunks(int64_t rows, int64_t len, int64_t sms);

}  // namespace ska::simt::reduce
