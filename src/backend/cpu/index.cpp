// CPU kernels: indexing along a dim (index_select / index_add on whole slices, gather /
// scatter_add per element). Every index is range-checked before any element is written.
#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

// A contiguous tensor seen as [outer, size(dim), inner] around `dim`.
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
};

DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) s.outer *= shape[d];
    if (d > dim) s.inner *= shape[d];
  }
  s.size = shape.empty() ? 1 : shape[dim];
  return s;
}

// Throws ValueError naming the first index outside [0, dim_size).
void check_index_range(const char* kernel, const Tensor& index, int64_t dim, int64_t dim_size) {
  SKA_CHECK(index.dtype() == DType::kI64 && index.is_contiguous(), DTypeError, kernel,
            ": index must be a contiguous i64 tensor, got ", index.str());
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  for (int64_t e = 0; e < index.numel(); ++e) {
    SKA_CHECK(ip[e] >= 0 && ip[e] < dim_size, ValueError, kernel, ": index ", ip[e],
              " (at position ", e, ") is out of range for dim ", dim, " of size ", dim_size);
  }
}

void check_values(const char* kernel, const Tensor& a, const Tensor& b) {
  SKA_CHECK(a.dtype() == b.dtype(), DTypeError, kernel, ": operands of different dtypes (",
            dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), ")");
  SKA_CHECK(a.is_contiguous() && b.is_contiguous(), ValueError, kernel,
            ": operands must be contiguous");
}

// index has other's rank and is no larger than `other` along every dim except `dim`.
void check_index_shape(const char* kernel, const Tensor& index, const Tensor& other, int64_t dim) {
  bool ok = index.dim() == other.dim();
  for (int64_t d = 0; ok && d < index.dim(); ++d) ok = d == dim || index.size(d) <= other.size(d);
  SKA_CHECK(ok, ShapeError, kernel, ": index ", shape_str(index.shape()), " does not fit ",
            shape_str(other.shape()), " along dims other than ", dim);
}

// Visits every element of a contiguous `shape`: fn(flat, offset) with offset = sum over d != dim
// of coord[d] * strides[d] (the position in another tensor, minus its `dim` coordinate).
template <typename F>
void for_each_coord(const Shape& shape, const Shape& strides, int64_t dim, F&& fn) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t total = shape_numel(shape);
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rem = flat, offset = 0;
    for (int64_t d = ndim - 1; d >= 0; --d) {
      const int64_t c = rem % shape[d];
      rem /= shape[d];
      if (d != dim) offset += c * strides[d];
    }
    fn(flat, offset);
  }
}

}  // namespace

void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  check_values("index_select", x, out);
  const DimSplit xs = split_at(x.shape(), dim), os = split_at(out.shape(), dim);
  SKA_CHECK(
      index.dim() == 1 && os.size == index.numel() && os.outer == xs.outer && os.inner == xs.inner,
      ShapeError, "index_select: out ", shape_str(out.shape()), " does not match x ",
      shape_str(x.shape()), " with index ", shape_str(index.shape()), " along dim ", dim);
  check_index_range("index_select", index, dim, xs.size);
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  const size_t row_bytes = static_cast<size_t>(xs.inner) * x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (out.numel() > 32768)
  for (int64_t r = 0; r < os.outer * os.size; ++r) {
    const int64_t o = r / os.size, i = r % os.size;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>(o * xs.size + ip[i]) * row_bytes, row_bytes);
  }
}

void index_add(const Tensor& src, int64_t dim, const Tensor& index, const Tensor& out) {
  check_values("index_add", src, out);
  if (is_16bit_float(out.dtype())) {
    const Tensor result = widen_f32(out);  // accumulates into the existing values
    index_add(widen_f32(src), dim, index, result);
    return round_into(result, out);
  }
  const DimSplit ss = split_at(src.shape(), dim), os = split_at(out.shape(), dim);
  SKA_CHECK(
      index.dim() == 1 && ss.size == index.numel() && os.outer == ss.outer && os.inner == ss.inner,
      ShapeError, "index_add: src ", shape_str(src.shape()), " does not match out ",
      shape_str(out.shape()), " with index ", shape_str(index.shape()), " along dim ", dim);
  check_index_range("index_add", index, dim, os.size);
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    const T* sp = static_cast<const T*>(src.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    // Repeated indices add into the same row, so threads split the outer dim only.
#pragma omp parallel for schedule(static) if (src.numel() > 32768 && ss.outer > 1)
    for (int64_t o = 0; o < ss.outer; ++o) {
      for (int64_t i = 0; i < ss.size; ++i) {
        const T* s = sp + (o * ss.size + i) * ss.inner;
        T* d = op + (o * os.size + ip[i]) * os.inner;
        for (int64_t j = 0; j < ss.inner; ++j) d[j] += s[j];
      }
    }
  });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  check_values("gather", x, out);
  if (is_16bit_float(out.dtype())) {
    const Tensor result = f32_output(out);
    gather(widen_f32(x), dim, index, result);
    return round_into(result, out);
  }
  SKA_CHECK(index.shape() == out.shape(), ShapeError, "gather: index ", shape_str(index.shape()),
            " and out ", shape_str(out.shape()), " must have the same shape");
  check_index_shape("gather", index, x, dim);
  check_index_range("gather", index, dim, x.size(dim));
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  const int64_t dim_stride = x.stride(dim);
  dispatch_floating(x.dtype(), "gather", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    for_each_coord(index.shape(), x.strides(), dim, [&](int64_t flat, int64_t offset) {
      op[flat] = xp[offset + ip[flat] * dim_stride];
    });
  });
}

void scatter_add(const Tensor& src, int64_t dim, const Tensor& index, const Tensor& out) {
  check_values("scatter_add", src, out);
  if (is_16bit_float(out.dtype())) {
    const Tensor result = widen_f32(out);  // accumulates into the existing values
    scatter_add(widen_f32(src), dim, index, result);
    return round_into(result, out);
  }
  SKA_CHECK(index.shape() == src.shape(), ShapeError, "scatter_add: index ",
            shape_str(index.shape()), " and src ", shape_str(src.shape()),
            " must have the same shape");
  check_index_shape("scatter_add", index, out, dim);
  check_index_range("scatter_add", index, dim, out.size(dim));
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  const int64_t dim_stride = out.stride(dim);
  dispatch_floating(out.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    const T* sp = static_cast<const T*>(src.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    // Serial: any two elements may target the same output position.
    for_each_coord(index.shape(), out.strides(), dim, [&](int64_t flat, int64_t offset) {
      op[offset + ip[flat] * dim_stride] += sp[flat];
    });
  });
}

}  // namespace ska::cpu
