// Helpers shared by the op implementations.
#include "ops/detail.h"

#include <algorithm>
#include <cstdint>

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
