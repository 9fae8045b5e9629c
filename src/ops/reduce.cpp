// Reductions and their gradients.
#include "ops/reduce.h"

#include <cstdint>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/pointwise.h"

namespace ska {

namespace {

Tensor reduce_op(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const char* name = reduce_op_name(op);
  if (auto cast = autocast_inputs(name, {x})) return reduce_op(op, (*cast)[0], dims_in, keepdim);
  detail::check_floating(name, x);
  const std::vector<int64_t> dims = detail::normalize_dims(dims_in, x.dim(), name);
  const Shape keep = detail::keepdim_shape(x.shape(), dims);
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
    for (int64_t d : dims) {
      SKA_CHECK(x.shape()[d] > 0, ShapeError, name, ": reducing an empty dim ", d, " of shape ",
                shape_str(x.shape()));
    }
  }
  Tensor out_keep = Tensor::empty(keep, x.dtype(), x.device());
  SKA_KERNEL(x.device(), reduce)(op, x, dims, out_keep);
  const Shape out_shape = keepdim ? keep : detail::squeezed_shape(x.shape(), dims);
  Tensor out = Tensor::make_view(out_keep.storage(), out_shape, contiguous_strides(out_shape), 0,
                                 x.dtype());
  if (op == ReduceOp::kSum || op == ReduceOp::kMean) {  // x's shape, not its values
    const Shape in = x.shape();
    const double n = static_cast<double>(x.numel()) / static_cast<double>(shape_numel(keep));
    autograd::record_op(name, {x}, {out}, [=](const TensorList& g) {
      const Tensor gk = g[0].reshape(keep);
      return TensorList{(op == ReduceOp::kSum ? gk : gk / n).expand(in).contiguous()};
    });
    return out;
  }
  autograd::record_op(name, {x}, {out}, [=](const TensorList& g) {
    const Tensor gk = g[0].reshape(keep);
    // max/min: split the gradient equally among the elements equal to the result.
    const Tensor hit = eq(x, detail::broadcast_raw(out_keep, x.shape())).to(x.dtype());
    const Tensor count = sum(hit, dims, true);
    return TensorList{mul(hit, gk / count)};
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kSum, x, dims, keepdim);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kMean, x, dims, keepdim);
}
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kMax, x, dims, keepdim);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kMin, x, dims, keepdim);
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  SKA_CHECK(x.dim() >= static_cast<int64_t>(shape.size()), ShapeError, "sum_to_shape: cannot sum ",
            shape_str(x.shape()), " to ", shape_str(shape));
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  dim = wrap_dim(dim, x.dim(), "argmax");
  Shape keep = x.shape();
  keep[dim] = 1;
  Tensor out = Tensor::empty(keep, DType::kI64, x.device());
  SKA_KERNEL(x.device(), argmax)(x, dim, out);
  return keepdim ? out : out.squeeze(dim);
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "topk");
  SKA_CHECK(k >= 0 && k <= x.size(dim), ValueError, "topk: k = ", k, " for dim ", dim,
            " of size ", x.size(dim));
  const Tensor last = x.transpose(dim, -1).contiguous().detach();
  Shape out_shape = last.shape();
  out_shape.back() = k;
  Tensor values = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor indices = Tensor::empty(out_shape, DType::kI64, x.device());
  SKA_KERNEL(x.device(), topk)(last, k, values, indices);
  return {values.transpose(dim, -1), indices.transpose(dim, -1)};
}

}  // namespace ska
