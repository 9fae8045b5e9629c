// The row and column reductions (cuda/kernels/reduce.cu) built by the host compiler and run by
// tests/simt: cuda::reduce's launches (launch_reduce_rows, launch_reduce_cols) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/reduce.cu"
// clang-format on

#include "tests/simt/reduce_host.h"

#include <vector>

namespace ska::cuda {
namespace {
// The column kernel's `extern __shared__ float col_lanes[]`.
alignas(128) thread_local float col_lanes[227 * 1024 / sizeof(float)];
const bool registered =
    (simt::register_shared(reinterpret_cast<unsigned char*>(col_lanes), sizeof col_lanes), true);
}  // namespace
}  // namespace ska::cuda

namespace ska::simt::reduce {
namespace {

ColumnPass pass_of(const cuda::ColumnPass& p) {
  return {p.vec, p.col_threads, p.lanes, p.tiles, p.chunks, p.chunk_rows};
}

}  // namespace

ColumnPlan column_plan(int64_t rows, int64_t cols, int elem_bytes, bool x_aligned, int64_t sms) {
  const cuda::ColumnPlan plan = cuda::plan_columns(rows, cols, elem_bytes, x_aligned, sms);
  return {pass_of(plan.first), pass_of(plan.second)};
}

template <ReduceOp OP, typename T, typename Out>
void columns(const T* x, Out* out, int64_t rows, int64_t cols, int64_t sms) {
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const cuda::ColumnPlan plan = cuda::plan_columns(rows, cols, sizeof(T), aligned, sms);
  std::vector<float> partials(static_cast<size_t>(plan.partial_floats));
  cuda::launch_reduce_cols<OP>(x, out, rows, cols, plan, partials.data(), nullptr);
}

template <ReduceOp OP, typename T, typename Out>
void rows(const T* x, Out* out, int64_t rows, int64_t len, int64_t sms, int64_t max_blocks) {
  std::vector<float> partials(static_cast<size_t>(cuda::row_partial_floats(rows, len, sms)));
  cuda::launch_reduce_rows<OP>(x, out, rows, len, sms, partials.data(), nullptr, max_blocks);
}

int64_t row_chunks(int64_t rows, int64_t len, int64_t sms) {
  return cuda::row_chunks(rows, len, sms);
}

#define SKA_SIMT_REDUCE(OP, T, Out)                                             \
  template void columns<OP, T, Out>(const T*, Out*, int64_t, int64_t, int64_t); \
  template void rows<OP, T, Out>(const T*, Out*, int64_t, int64_t, int64_t, int64_t);
#define SKA_SIMT_REDUCE_TYPES(OP)                   \
  SKA_SIMT_REDUCE(OP, float, float)                 \
  SKA_SIMT_REDUCE(OP, __nv_bfloat16, __nv_bfloat16) \
  SKA_SIMT_REDUCE(OP, __nv_bfloat16, float)         \
  SKA_SIMT_REDUCE(OP, __half, __half)
SKA_SIMT_REDUCE_TYPES(ReduceOp::kSum)
SKA_SIMT_REDUCE_TYPES(ReduceOp::kMean)
SKA_SIMT_REDUCE_TYPES(ReduceOp::kMax)
SKA_SIMT_REDUCE_TYPES(ReduceOp::kMin)
#undef SKA_SIMT_REDUCE_TYPES
#undef SKA_SIMT_REDUCE

}  // namespace ska::simt::reduce
