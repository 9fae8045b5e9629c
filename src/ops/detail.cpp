// Helpers shared by the op implementations.
#include "ops/detail.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace ska::detail {

void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b) {
  SKA_CHECK(a.device() == b.device(), DeviceError, op, ": operands on different devices (",
            a.device(), " ", shape_str(a.shape()), " and ", b.device(), " ", shape_str(b.shape()),
            ")");
  SKA_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": operands of different dtypes (",
            dtype_name(a.dtype()), " ", shape_str(a.shape()), " and ", dtype_name(b.dtype()), " ",
            shape_str(b.shape()), ")");
}

void check_floating(const char* op, const Tensor& x) {
  SKA_CHECK(x.is_floating(), DTypeError, op, ": expected a floating tensor, got ",
            dtype_name(x.dtype()), " ", shape_str(x.shape()));
}

void check_dim(const char* op, const Tensor& x, int64_t ndim, const char* what) {
  SKA_CHECK(x.dim() == ndim, ShapeError, op, ": ", what, " must be ", ndim, "-d, got shape ",
            shape_str(x.shape()));
}

Tensor broadcast_raw(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  const size_t lead = shape.size() - t.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = lead; i < shape.size(); ++i) {
    strides[i] = t.shape()[i - lead] == 1 ? 0 : t.strides()[i - lead];
  }
  return Tensor::make_view(t.storage(), shape, strides, t.offset(), t.dtype());
}

Tensor empty_like_layout(const Shape& shape, const Tensor& like, DType dtype,
                         bool last_innermost) {
  SKA_CHECK(like.dim() == static_cast<int64_t>(shape.size()), ShapeError, "empty_like_layout: ",
            shape_str(shape), " and ", like.str(), " differ in rank");
  return empty_in_stride_order(shape, like.strides(), dtype, like.device(), last_innermost);
}

std::vector<int64_t> dims_by_stride(const Shape& strides, bool last_innermost) {
  const int64_t rank = static_cast<int64_t>(strides.size());
  if (rank == 0) return {};
  std::vector<int64_t> order(static_cast<size_t>(last_innermost ? rank - 1 : rank));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return strides[static_cast<size_t>(a)] > strides[static_cast<size_t>(b)];
  });
  if (last_innermost) order.push_back(rank - 1);
  return order;
}

Tensor empty_in_stride_order(const Shape& shape, const Shape& strides, DType dtype, Device device,
                             bool last_innermost) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) return Tensor::empty(shape, dtype, device);
  const std::vector<int64_t> order = dims_by_stride(strides, last_innermost);
  Shape stored(static_cast<size_t>(rank));
  std::vector<int64_t> inverse(static_cast<size_t>(rank));
  for (size_t j = 0; j < static_cast<size_t>(rank); ++j) {
    stored[j] = shape[static_cast<size_t>(order[j])];
    inverse[static_cast<size_t>(order[j])] = static_cast<int64_t>(j);
  }
  return Tensor::empty(stored, dtype, device).permute(inverse);
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  SKA_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), ShapeError, op,
            ": a dim is repeated");
  return out;
}

Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out = shape;
  for (int64_t d : dims) out[static_cast<size_t>(d)] = 1;
  return out;
}

Shape squeezed_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (!std::binary_search(dims.begin(), dims.end(), d)) out.push_back(shape[d]);
  }
  return out;
}

}  // namespace ska::detail
