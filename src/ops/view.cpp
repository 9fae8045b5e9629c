// Tensor view methods (no data copied) and copies/conversions, with their backward passes.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "autograd/node.h"
#include "ops/detail.h"
#include "ops/reduce.h"

namespace ska {

namespace {

Tensor raw_view(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  return Tensor::make_view(t.storage(), std::move(shape), std::move(strides), offset, t.dtype());
}

// Strides for viewing `t` as `shape` without copying, or empty when impossible (PyTorch rule:
// each run of merged dims must be contiguous within itself).
Shape view_strides(const Tensor& t, const Shape& shape) {
  if (t.numel() == 0 || t.is_contiguous()) return contiguous_strides(shape);
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  Shape out(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return {};
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return {};
  return out;
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      SKA_CHECK(infer < 0, ShapeError, op, ": more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    SKA_CHECK(known > 0 && numel % known == 0, ShapeError, op, ": cannot infer -1 in ",
              shape_str(shape), " for ", numel, " elements");
    out[infer] = numel / known;
  }
  SKA_CHECK(shape_numel(out) == numel, ShapeError, op, ": shape ", shape_str(shape),
            " is invalid for ", numel, " elements");
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), "view");
  const Shape strides = view_strides(*this, shape);
  SKA_CHECK(!strides.empty() || shape.empty(), ShapeError, "view: cannot view a tensor of shape ",
            shape_str(this->shape()), " with strides ", shape_str(this->strides()), " as ",
            shape_str(shape), "; use reshape()");
  Tensor out = raw_view(*this, shape, strides, offset());
  autograd::record_op("view", {*this}, {out}, [in = this->shape()](const TensorList& g) {
    return TensorList{g[0].reshape(in)};
  });
  return out;
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), "reshape");
  if (!view_strides(*this, shape).empty() || shape.empty()) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  Shape s(shape().begin(), shape().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= shape()[d];
  s.push_back(merged);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  SKA_CHECK(static_cast<int64_t>(dims.size()) == dim(), ShapeError, "permute: ", dims.size(),
            " dims given for a ", dim(), "-d tensor");
  Shape s(dims.size()), st(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    SKA_CHECK(inverse[d] < 0, ShapeError, "permute: dim ", d, " repeated");
    inverse[d] = static_cast<int64_t>(i);
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  Tensor out = raw_view(*this, s, st, offset());
  autograd::record_op("permute", {*this}, {out}, [inverse](const TensorList& g) {
    return TensorList{g[0].permute(inverse)};
  });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> dims(static_cast<size_t>(dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, this->dim(), "slice");
  SKA_CHECK(step > 0, ValueError, "slice: step must be positive, got ", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] *= step;
  Tensor out = raw_view(*this, s, st, offset() + start * strides()[d]);
  // Its backward scatters the gradient into zeros of the input's shape, laid out in the input's
  // order of dims (the rows of heads split from a token-major projection come back token-major,
  // so undoing the split is a view, not a copy): an assembly of one piece, which the gradient's
  // producer may write in place.
  autograd::record_assembly(
      "slice", *this, {out},
      [d, start, end, step](const Tensor& z, size_t) { return z.slice(d, start, end, step); },
      [in_shape = shape(), in_strides = strides()](DType dtype, Device device) {
        return detail::empty_in_stride_order(in_shape, in_strides, dtype, device,
                                             /*last_innermost=*/true);
      },
      /*partial=*/true);
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  SKA_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], ShapeError, "narrow: [",
            start, ", ", start + length, ") out of range for dim ", d, " of shape ",
            shape_str(shape()));
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  SKA_CHECK(index >= -shape()[d] && index < shape()[d], ShapeError, "select: index ", index,
            " out of range for dim ", d, " of shape ", shape_str(shape()));
  if (index < 0) index += shape()[d];
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape_in) const {
  SKA_CHECK(shape_in.size() >= shape().size(), ShapeError, "expand: cannot expand ",
            shape_str(shape()), " to fewer dims ", shape_str(shape_in));
  const size_t lead = shape_in.size() - shape().size();
  Shape s(shape_in.size()), st(shape_in.size());
  for (size_t i = 0; i < shape_in.size(); ++i) {
    if (i < lead) {
      SKA_CHECK(shape_in[i] >= 0, ShapeError, "expand: -1 not allowed in new leading dims");
      s[i] = shape_in[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = shape()[i - lead];
    const int64_t want = shape_in[i] == -1 ? have : shape_in[i];
    SKA_CHECK(have == want || have == 1, ShapeError, "expand: cannot expand ", shape_str(shape()),
              " to ", shape_str(shape_in));
    s[i] = want;
    st[i] = have == want ? strides()[i - lead] : 0;
  }
  if (s == shape()) return *this;
  Tensor out = raw_view(*this, s, st, offset());
  autograd::record_op("expand", {*this}, {out}, [in = shape()](const TensorList& g) {
    return TensorList{sum_to_shape(g[0], in)};
  });
  return out;
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape s = shape();
  s.erase(s.begin() + d);
  return view(s);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  s.insert(s.begin() + d, 1);
  return view(s);
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  out.copy_(*this);
  autograd::record_op("clone", {*this}, {out}, [](const TensorList& g) { return g; });
  return out;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(Device device, DType dtype) const {
  if (device == this->device() && dtype == this->dtype()) return *this;
  // A cast on the device keeps a channels-last layout, as PyTorch's .to() keeps the memory
  // format: autocast's cast of a token grid seen as [N, C, H, W] then feeds the convolution
  // channels-last, with no copy to NCHW before it and none back after.
  const bool keep_channels_last =
      device == this->device() && is_channels_last() && !is_contiguous();
  Tensor out =
      keep_channels_last
          ? Tensor::empty({size(0), size(2), size(3), size(1)}, dtype, device).permute({0, 3, 1, 2})
          : Tensor::empty(shape(), dtype, device);
  out.copy_(*this);
  autograd::record_op("to", {*this}, {out},
                      [dev = this->device(), dt = this->dtype()](const TensorList& g) {
                        return TensorList{g[0].to(dev, dt)};
                      });
  return out;
}
Tensor Tensor::to(Device device) const { return to(device, dtype()); }
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

}  // namespace ska
