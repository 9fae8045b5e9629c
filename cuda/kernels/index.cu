// Indexing along one dim on CUDA: index_select, gather (copies, any dtype), index_add
// (deterministic: each output element sums its rows in index order, as the CPU does) and
// scatter_add (atomicAdd, f32/bf16/f16). Indices are i64; out-of-range ones are skipped.
//
// No host-side range check (it would need a device sync): an index outside [0, size(dim)) never
// touches memory; index_select / gather write 0 for it and index_add / scatter_add drop it.
// The copies and the deterministic index_add launch on raw operands (launch_index_copy,
// launch_index_add_sums), so that tests/simt runs their code on the host; the tensor entry
// points and the atomic kernel are left out there.
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

// One thread per element of an iteration shape (`sizes`). Each element pairs an offset into the
// iterated tensor (`it_strides`) with one into the indexed tensor (`ix_strides`), whose
// coordinate along `dim` comes from the index instead.
struct IndexGeometry {
  int ndim;
  int dim;
  int64_t dim_size;  // size of the indexed tensor along dim
  int64_t numel;
  int64_t sizes[kMaxDims];
  int64_t it_strides[kMaxDims];
  int64_t ix_strides[kMaxDims];
  bool per_element;  // gather / scatter: index has the iteration shape; else 1-D along dim
};

// Offsets of element `linear`; false when its index is out of range.
__device__ __forceinline__ bool index_offsets(const IndexGeometry& g, const int64_t* index,
                                              int64_t linear, int64_t* it_off, int64_t* ix_off) {
  int64_t it = 0, ix = 0, rest = linear, k = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t i = rest % g.sizes[d];
    rest /= g.sizes[d];
    it += i * g.it_strides[d];
    if (d == g.dim) {
      k = g.per_element ? index[linear] : index[i];
    } else {
      ix += i * g.ix_strides[d];
    }
  }
  *it_off = it;
  if (k < 0 || k >= g.dim_size) return false;
  *ix_off = ix + k * g.ix_strides[g.dim];
  return true;
}

// out[it] = x[ix] (index_select, gather); E is a same-sized stand-in for the element type.
template <typename E>
__global__ void index_copy_kernel(const E* x, const int64_t* index, IndexGeometry g, E* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t it, ix;
    const bool ok = index_offsets(g, index, i, &it, &ix);
    out[it] = ok ? x[ix] : E{};
  }
}

// out[ix] += src[it] (index_add, scatter_add).
template <typename T>
__global__ void index_add_kernel(const T* src, const int64_t* index, IndexGeometry g, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t it, ix;
    if (index_offsets(g, index, i, &it, &ix)) atomicAdd(out + ix, src[it]);
  }
}

// The accumulator of a deterministic sum of T values: f32 for the 16-bit types, as the CPU's.
template <typename T>
using SumType = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
__device__ __forceinline__ SumType<T> widen(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return to_float(v);
  }
}
template <typename T>
__device__ __forceinline__ T narrow(SumType<T> v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return from_float<T>(v);
  }
}

// index_add on contiguous src [outer, n, inner] into out [outer, rows, inner], one thread per
// element of out: its value plus the src rows whose index names its row, added in index order in
// SumType<T> and rounded once, so the bits match the CPU's (and repeat from run to run, where
// atomics would add in whatever order the threads arrive). Work: out's size times n, so for
// tables and index lists of moderate size (a relative position bias: 169 x 2401).
constexpr int64_t kIndexAddOutputRows = 1024;
template <typename T>
__global__ void index_add_by_output(const T* src, const int64_t* index, int64_t n, int64_t rows,
                                    int64_t inner, int64_t numel, T* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < numel;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, k = (e / inner) % rows, o = e / (inner * rows);
    const T* s = src + o * n * inner + j;
    SumType<T> acc = widen(out[e]);
    for (int64_t i = 0; i < n; ++i) {
      if (index[i] == k) acc += widen(s[i * inner]);
    }
    out[e] = narrow<T>(acc);
  }
}

// The same sums for large problems, one thread per column (o, j) walking the index in order:
// deterministic too, f32 bits equal to the CPU's; a 16-bit out is rounded after each add.
template <typename T>
__global__ void index_add_by_column(const T* src, const int64_t* index, int64_t n, int64_t rows,
                                    int64_t inner, int64_t columns, T* out) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < columns;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = c % inner, o = c / inner;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = index[i];
      if (k < 0 || k >= rows) continue;
      T* d = out + (o * rows + k) * inner + j;
      *d = narrow<T>(widen(*d) + widen(src[(o * n + i) * inner + j]));
    }
  }
}

// out = x indexed by g (index_select, gather), as elements of `esize` bytes.
inline void launch_index_copy(const void* x, const int64_t* index, const IndexGeometry& g,
                              void* out, size_t esize, cudaStream_t s) {
  const auto run = [&](auto tag) {
    using E = decltype(tag);
    launch_kernel(index_copy_kernel<E>, dim3(grid_for(g.numel)), dim3(256), 0, s,
                  static_cast<const E*>(x), index, g, static_cast<E*>(out));
  };
  switch (esize) {
    case 1:
      run(uint8_t{});
      break;
    case 2:
      run(uint16_t{});
      break;
    case 4:
      run(uint32_t{});
      break;
    case 8:
      run(uint64_t{});
      break;
    default:
      SKA_FAIL(DTypeError, "index copy: unsupported element size ", esize);
  }
}

// Whether index_add sums by output element (tables of up to kIndexAddOutputRows rows, reading
// the index at most 2^31 times in all) rather than by column.
inline bool index_add_by_output_fits(int64_t rows, int64_t out_numel, int64_t n) {
  return rows <= kIndexAddOutputRows &&
         static_cast<double>(out_numel) * static_cast<double>(n) <= 2147483648.0;
}

// out [outer, rows, inner] += src [outer, n, inner] by index [n], deterministically: by output
// element or by column.
template <typename T>
void launch_index_add_sums(const T* src, const int64_t* index, int64_t n, int64_t outer,
                           int64_t rows, int64_t inner, T* out, bool by_output, cudaStream_t s) {
  const int64_t numel = outer * rows * inner;
  if (by_output) {
    launch_kernel(index_add_by_output<T>, dim3(grid_for(numel)), dim3(256), 0, s, src, index, n,
                  rows, inner, numel, out);
  } else {
    launch_kernel(index_add_by_column<T>, dim3(grid_for(outer * inner)), dim3(256), 0, s, src,
                  index, n, rows, inner, outer * inner, out);
  }
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// Geometry over `iter` (the iteration shape with the iterated tensor's strides) against the
// indexed tensor `indexed` along `dim`.
IndexGeometry geometry(const Shape& sizes, const Shape& it_strides, const Tensor& indexed,
                       int64_t dim, bool per_element, const char* kernel) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  SKA_CHECK(nd <= kMaxDims, ShapeError, kernel, ": at most ", kMaxDims, " dims, got ", nd);
  SKA_CHECK(indexed.dim() == nd, ShapeError, kernel, ": rank mismatch (", shape_str(sizes), " vs ",
            shape_str(indexed.shape()), ")");
  SKA_CHECK(dim >= 0 && dim < nd, ShapeError, kernel, ": dim ", dim, " out of range");
  IndexGeometry g{};
  g.ndim = static_cast<int>(nd);
  g.dim = static_cast<int>(dim);
  g.dim_size = indexed.shape()[dim];
  g.numel = shape_numel(sizes);
  g.per_element = per_element;
  for (int64_t d = 0; d < nd; ++d) {
    g.sizes[d] = sizes[d];
    g.it_strides[d] = it_strides[d];
    g.ix_strides[d] = indexed.strides()[d];
  }
  return g;
}

// Along every dim but `dim`, `inner` must fit in `outer` (equal when `exact`).
void check_other_dims(const Shape& inner, const Shape& outer, int64_t dim, bool exact,
                      const char* kernel) {
  SKA_CHECK(inner.size() == outer.size() && dim >= 0 && dim < static_cast<int64_t>(inner.size()),
            ShapeError, kernel, ": shapes ", shape_str(inner), " and ", shape_str(outer),
            " do not match along dim ", dim);
  for (size_t d = 0; d < inner.size(); ++d) {
    if (static_cast<int64_t>(d) == dim) continue;
    SKA_CHECK(exact ? inner[d] == outer[d] : inner[d] <= outer[d], ShapeError, kernel, ": shapes ",
              shape_str(inner), " and ", shape_str(outer), " do not match at dim ", d);
  }
}

void check_index(const Tensor& index, const char* kernel) {
  SKA_CHECK(index.dtype() == DType::kI64, DTypeError, kernel, ": index must be i64, got ",
            index.dtype());
  SKA_CHECK(index.is_contiguous(), ValueError, kernel, ": index must be contiguous");
}

// Launches the copy kernel with an element type of the tensor's element size.
void launch_copy(const Tensor& x, const Tensor& index, const IndexGeometry& g, const Tensor& out,
                 const char* kernel) {
  SKA_CHECK(x.dtype() == out.dtype(), DTypeError, kernel, ": x is ", x.dtype(), ", out is ",
            out.dtype());
  if (g.numel == 0) return;
  const int device = device_index(x);
  DeviceGuard guard(device);
  const cudaStream_t s = current_stream(device);
  launch_index_copy(x.data_ptr(), static_cast<const int64_t*>(index.data_ptr()), g, out.data_ptr(),
                    x.element_size(), s);
}

void launch_add(const Tensor& src, const Tensor& index, const IndexGeometry& g, const Tensor& out,
                const char* kernel) {
  SKA_CHECK(src.dtype() == out.dtype(), DTypeError, kernel, ": src is ", src.dtype(), ", out is ",
            out.dtype());
  const int device = device_index(out);
  DeviceGuard guard(device);
  dispatch_floating(out.dtype(), kernel, [&](auto tag) {
    using T = decltype(tag);
    if (g.numel == 0) return;
    launch_kernel(index_add_kernel<T>, dim3(grid_for(g.numel)), dim3(256), 0,
                  current_stream(device), static_cast<const T*>(src.data_ptr()),
                  static_cast<const int64_t*>(index.data_ptr()), g,
                  static_cast<T*>(out.data_ptr()));
  });
}

}  // namespace

void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  check_index(index, "index_select");
  SKA_CHECK(out.is_contiguous(), ValueError, "index_select: out must be contiguous");
  check_other_dims(out.shape(), x.shape(), dim, true, "index_select");
  SKA_CHECK(out.shape()[dim] == index.numel(), ShapeError, "index_select: out ",
            shape_str(out.shape()), " does not hold ", index.numel(), " indices along dim ", dim);
  launch_copy(x, index, geometry(out.shape(), out.strides(), x, dim, false, "index_select"), out,
              "index_select");
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  check_index(index, "gather");
  SKA_CHECK(out.is_contiguous() && out.shape() == index.shape(), ShapeError,
            "gather: out must be contiguous with index's shape ", shape_str(index.shape()));
  check_other_dims(index.shape(), x.shape(), dim, false, "gather");
  launch_copy(x, index, geometry(out.shape(), out.strides(), x, dim, true, "gather"), out,
              "gather");
}

void index_add(const Tensor& src, int64_t dim, const Tensor& index, const Tensor& out) {
  check_index(index, "index_add");
  check_other_dims(src.shape(), out.shape(), dim, true, "index_add");
  SKA_CHECK(src.shape()[dim] == index.numel(), ShapeError, "index_add: src ",
            shape_str(src.shape()), " does not hold ", index.numel(), " indices along dim ", dim);
  if (!src.is_contiguous() || !out.is_contiguous()) {  // strided operands: the atomic kernel
    launch_add(src, index, geometry(src.shape(), src.strides(), out, dim, false, "index_add"), out,
               "index_add");
    return;
  }
  SKA_CHECK(src.dtype() == out.dtype(), DTypeError, "index_add: src is ", src.dtype(), ", out is ",
            out.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out.shape()[d];
  for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.shape()[d];
  const int64_t n = index.numel(), rows = out.shape()[dim];
  if (out.numel() == 0 || n == 0) return;
  const int device = device_index(out);
  DeviceGuard guard(device);
  const cudaStream_t s = current_stream(device);
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  // By output element for tables of up to kIndexAddOutputRows rows while that reads the index at
  // most 2^31 times in all, else by column.
  const bool by_output = index_add_by_output_fits(rows, out.numel(), n);
  dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    launch_index_add_sums(static_cast<const T*>(src.data_ptr()), idx, n, outer, rows, inner,
                          static_cast<T*>(out.data_ptr()), by_output, s);
  });
}

void scatter_add(const Tensor& src, int64_t dim, const Tensor& index, const Tensor& out) {
  check_index(index, "scatter_add");
  check_other_dims(index.shape(), out.shape(), dim, false, "scatter_add");
  SKA_CHECK(src.dim() == index.dim(), ShapeError, "scatter_add: src ", shape_str(src.shape()),
            " and index ", shape_str(index.shape()), " differ in rank");
  for (int64_t d = 0; d < index.dim(); ++d) {
    SKA_CHECK(index.shape()[d] <= src.shape()[d], ShapeError, "scatter_add: index ",
              shape_str(index.shape()), " larger than src ", shape_str(src.shape()));
  }
  // Iterate over index's shape; src is read at the same coordinates through its own strides.
  launch_add(src, index, geometry(index.shape(), src.strides(), out, dim, true, "scatter_add"), out,
             "scatter_add");
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
