// The indexing kernels (cuda/kernels/index.cu) built by the host compiler and run by tests/simt:
// launch_index_copy and launch_index_add_sums on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/index.cu"
// clang-format on

#include "tests/simt/index_host.h"

namespace ska::simt::index {
namespace {

Dims contiguous(const Dims& sizes) {
  Dims s(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) s[d - 1] = s[d] * sizes[d];
  return s;
}

// The geometry of iterating `iter` (contiguous) against a contiguous indexed tensor of
// `indexed` sizes along dim, as the entry points build it.
cuda::IndexGeometry geometry(const Dims& iter, const Dims& indexed, int64_t dim, bool per_element) {
  cuda::IndexGeometry g{};
  g.ndim = static_cast<int>(iter.size());
  g.dim = static_cast<int>(dim);
  g.dim_size = indexed[static_cast<size_t>(dim)];
  g.numel = 1;
  g.per_element = per_element;
  const Dims it = contiguous(iter), ix = contiguous(indexed);
  for (size_t d = 0; d < iter.size(); ++d) {
    g.sizes[d] = iter[d];
    g.it_strides[d] = it[d];
    g.ix_strides[d] = ix[d];
    g.numel *= iter[d];
  }
  return g;
}

}  // namespace

template <typename E>
void index_select(const E* x, int64_t x_dim_size, const Dims& out_sizes, int64_t dim,
                  const int64_t* index, E* out) {
  Dims x_sizes = out_sizes;
  x_sizes[static_cast<size_t>(dim)] = x_dim_size;
  cuda::launch_index_copy(x, index, geometry(out_sizes, x_sizes, dim, false), out, sizeof(E),
                          nullptr);
}

template <typename E>
void gather(const E* x, const Dims& x_sizes, const Dims& out_sizes, int64_t dim,
            const int64_t* index, E* out) {
  cuda::launch_index_copy(x, index, geometry(out_sizes, x_sizes, dim, true), out, sizeof(E),
                          nullptr);
}

template <typename T>
void index_add(const T* src, const int64_t* index, int64_t n, int64_t outer, int64_t rows,
               int64_t inner, T* out, bool by_output) {
  cuda::launch_index_add_sums(src, index, n, outer, rows, inner, out, by_output, nullptr);
}

bool by_output_fits(int64_t rows, int64_t out_numel, int64_t n) {
  return cuda::index_add_by_output_fits(rows, out_numel, n);
}

template void index_select<uint16_t>(const uint16_t*, int64_t, const Dims&, int64_t, const int64_t*,
                                     uint16_t*);
template void index_select<float>(const float*, int64_t, const Dims&, int64_t, const int64_t*,
                                  float*);
template void gather<float>(const float*, const Dims&, const Dims&, int64_t, const int64_t*,
                            float*);
template void index_add<float>(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                               float*, bool);
template void index_add<__nv_bfloat16>(const __nv_bfloat16*, const int64_t*, int64_t, int64_t,
                                       int64_t, int64_t, __nv_bfloat16*, bool);

}  // namespace ska::simt::index
