// Differentiable index_select and gather; their gradients scatter back with index_add and
// scatter_add into zeros (repeated indices accumulate).
#include "ops/index.h"

#include <cstdint>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/detail.h"

namespace ska {

namespace {

// The index as a contiguous i64 tensor on x's device (i32 indices are widened).
Tensor checked_index(const char* op, const Tensor& x, const Tensor& index) {
  SKA_CHECK(index.dtype() == DType::kI64 || index.dtype() == DType::kI32, DTypeError, op,
            ": index must be i64 or i32, got ", dtype_name(index.dtype()), " ",
            shape_str(index.shape()));
  SKA_CHECK(index.device() == x.device(), DeviceError, op, ": index on ", index.device(),
            " but x on ", x.device());
  return index.detach().to(DType::kI64).contiguous();
}

void check_x(const char* op, const Tensor& x) {
  detail::check_floating(op, x);
  SKA_CHECK(x.dim() >= 1, ShapeError, op, ": x must be at least 1-d, got ", shape_str(x.shape()));
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_x("index_select", x);
  dim = wrap_dim(dim, x.dim(), "index_select");
  SKA_CHECK(index.dim() == 1, ShapeError, "index_select: index must be 1-d, got ",
            shape_str(index.shape()), " for x ", shape_str(x.shape()));
  const Tensor idx = checked_index("index_select", x, index);
  Shape out_shape = x.shape();
  out_shape[dim] = idx.numel();
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  SKA_KERNEL(x.device(), index_select)(x.detach().contiguous(), dim, idx, out);
  const Shape x_shape = x.shape();
  autograd::record_op("index_select", {x}, {out}, [=](const TensorList& g) {
    Tensor gx = Tensor::zeros(x_shape, g[0].dtype(), g[0].device());
    SKA_KERNEL(gx.device(), index_add)(g[0].contiguous(), dim, idx, gx);
    return TensorList{gx};
  });
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_x("gather", x);
  dim = wrap_dim(dim, x.dim(), "gather");
  bool fits = index.dim() == x.dim();
  for (int64_t d = 0; fits && d < x.dim(); ++d) fits = d == dim || index.size(d) <= x.size(d);
  SKA_CHECK(fits, ShapeError, "gather: index ", shape_str(index.shape()), " does not fit x ",
            shape_str(x.shape()), " along dims other than ", dim);
  const Tensor idx = checked_index("gather", x, index);
  Tensor out = Tensor::empty(idx.shape(), x.dtype(), x.device());
  SKA_KERNEL(x.device(), gather)(x.detach().contiguous(), dim, idx, out);
  const Shape x_shape = x.shape();
  autograd::record_op("gather", {x}, {out}, [=](const TensorList& g) {
    Tensor gx = Tensor::zeros(x_shape, g[0].dtype(), g[0].device());
    SKA_KERNEL(gx.device(), scatter_add)(g[0].contiguous(), dim, idx, gx);
    return TensorList{gx};
  });
  return out;
}

}  // namespace ska
