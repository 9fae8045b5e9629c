// Shape ops that assemble or cut tensors: cat, stack, split/chunk, constant pad, roll, grid
// neighbourhoods.
#include "ops/shape_ops.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"

namespace ska {

namespace {

Tensor narrow_raw(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Shape shape = t.shape();
  shape[dim] = length;
  return Tensor::make_view(t.storage(), shape, t.strides(), t.offset() + start * t.strides()[dim],
                           t.dtype());
}

// Tap (ky, kx) of a k x k neighbourhood on an H x W grid: output rows [y0, y1) read grid rows
// [y0 + dy, y1 + dy), output columns [x0, x1) grid columns [x0 + dx, x1 + dx); the rest reads
// zeros.
struct TapRegion {
  int64_t y0, y1, x0, x1, dy, dx;
  bool empty() const { return y0 >= y1 || x0 >= x1; }
};

TapRegion tap_region(int64_t h, int64_t w, int64_t k, int64_t ky, int64_t kx) {
  const int64_t dy = ky - k / 2, dx = kx - k / 2;
  return {std::max<int64_t>(0, -dy), std::min(h, h - dy), std::max<int64_t>(0, -dx),
          std::min(w, w - dx), dy, dx};
}

// cols [..., H, W, k*k, C] -> tap `tap`'s [..., H, W, C] (a raw view: no autograd).
Tensor tap_of(const Tensor& cols, int64_t tap) {
  Shape shape = cols.shape(), strides = cols.strides();
  const auto d = static_cast<std::ptrdiff_t>(shape.size()) - 2;
  const int64_t offset = cols.offset() + tap * strides[static_cast<size_t>(d)];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor::make_view(cols.storage(), shape, strides, offset, cols.dtype());
}

// t [..., H, W, C] -> grid rows [r0, r0 + rows) and columns [c0, c0 + cols) (a raw view).
Tensor grid_window(const Tensor& t, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  const int64_t d = t.dim() - 3;
  return narrow_raw(narrow_raw(t, d, r0, rows), d + 1, c0, cols);
}

}  // namespace

Tensor cat(const TensorList& xs, int64_t dim) { return cat(xs, dim, Tensor()); }

Tensor cat(const TensorList& xs, int64_t dim, const Tensor& into) {
  SKA_CHECK(!xs.empty(), ValueError, "cat: no tensors given");
  if (auto cast = autocast_inputs("cat", xs)) return cat(*cast, dim, into);
  const Tensor& first = xs[0];
  dim = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[dim] = 0;
  for (const Tensor& x : xs) {
    detail::check_same_device_dtype("cat", first, x);
    bool compatible = x.dim() == first.dim();
    for (int64_t d = 0; compatible && d < x.dim(); ++d) {
      compatible = d == dim || x.shape()[d] == first.shape()[d];
    }
    SKA_CHECK(compatible, ShapeError, "cat along dim ", dim, ": shape ", shape_str(x.shape()),
              " does not match ", shape_str(first.shape()));
    shape[dim] += x.shape()[dim];
  }
  if (into.defined()) {
    SKA_CHECK(
        into.shape() == shape && into.dtype() == first.dtype() && into.device() == first.device(),
        ShapeError, "cat into ", into.str(), ": the pieces make ", shape_str(shape), " ",
        dtype_name(first.dtype()), " on ", first.device());
    SKA_CHECK(!into.requires_grad(), AutogradError, "cat into ", into.str(),
              ": it requires grad; it must be a fresh tensor the result is recorded into");
  }
  Tensor out = into.defined() ? into : Tensor::empty(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    Tensor place = narrow_raw(out, dim, offset, x.shape()[dim]);
    if (!x.same_view(place)) place.copy_(x);
    sizes.push_back(x.shape()[dim]);
    offset += x.shape()[dim];
  }
  autograd::record_op("cat", xs, {out}, [sizes, dim](const TensorList& g) {
    TensorList grads;
    int64_t start = 0;
    for (int64_t n : sizes) {
      grads.push_back(narrow_raw(g[0], dim, start, n));
      start += n;
    }
    return grads;
  });
  return out;
}

Tensor empty_aligned_rows(const Shape& shape, DType dtype, Device device) {
  if (shape.empty()) return Tensor::empty(shape, dtype, device);
  const int64_t cols = shape.back();
  const int64_t per_vector = std::max<int64_t>(16 / static_cast<int64_t>(dtype_size(dtype)), 1);
  const int64_t padded = (cols + per_vector - 1) / per_vector * per_vector;
  if (padded == cols) return Tensor::empty(shape, dtype, device);
  Shape wide = shape;
  wide.back() = padded;
  return Tensor::empty(wide, dtype, device).narrow(static_cast<int64_t>(shape.size()) - 1, 0, cols);
}

Tensor stack(const TensorList& xs, int64_t dim) {
  SKA_CHECK(!xs.empty(), ValueError, "stack: no tensors given");
  dim = wrap_dim(dim, xs[0].dim() + 1, "stack");
  for (const Tensor& x : xs) {
    SKA_CHECK(x.shape() == xs[0].shape(), ShapeError, "stack: shape ", shape_str(x.shape()),
              " differs from ", shape_str(xs[0].shape()));
  }
  TensorList expanded;
  for (const Tensor& x : xs) expanded.push_back(x.unsqueeze(dim));
  return cat(expanded, dim);
}

TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    SKA_CHECK(s >= 0, ShapeError, "split: negative piece size ", s);
    total += s;
  }
  SKA_CHECK(total == x.shape()[dim], ShapeError, "split: sizes add up to ", total, " but dim ", dim,
            " of ", shape_str(x.shape()), " has ", x.shape()[dim]);
  TensorList pieces;
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow_raw(x, dim, start, s));
    starts.push_back(start);
    start += s;
  }
  // One node for all pieces (an assembly: the pieces' producers may write their gradients into
  // it in place), its gradient laid out in x's order of dims as a slice's backward lays its
  // gradient out (the rows of heads split from a token-major projection come back token-major, so
  // undoing the split is a view).
  autograd::record_assembly(
      "split", x, pieces,
      [dim, starts, sizes](const Tensor& z, size_t i) {
        return narrow_raw(z, dim, starts[i], sizes[i]);
      },
      [shape = x.shape(), strides = x.strides()](DType dtype, Device device) {
        return detail::empty_in_stride_order(shape, strides, dtype, device,
                                             /*last_innermost=*/true);
      });
  return pieces;
}

namespace {

// Index i of dim `dim` of t (a raw view, the dim dropped).
Tensor select_raw(const Tensor& t, int64_t dim, int64_t i) {
  Shape shape = t.shape(), strides = t.strides();
  const int64_t offset = t.offset() + i * strides[static_cast<size_t>(dim)];
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return Tensor::make_view(t.storage(), shape, strides, offset, t.dtype());
}

}  // namespace

TensorList unbind(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "unbind");
  TensorList pieces;
  const int64_t n = x.shape()[static_cast<size_t>(dim)];
  if (n == 0) return pieces;
  for (int64_t i = 0; i < n; ++i) pieces.push_back(select_raw(x, dim, i));
  autograd::record_assembly(
      "unbind", x, pieces,
      [dim](const Tensor& z, size_t i) { return select_raw(z, dim, static_cast<int64_t>(i)); },
      [shape = x.shape(), strides = x.strides()](DType dtype, Device device) {
        return detail::empty_in_stride_order(shape, strides, dtype, device, false);
      });
  return pieces;
}

TensorList split(const Tensor& x, int64_t piece, int64_t dim) {
  SKA_CHECK(piece > 0, ValueError, "split: piece size must be positive, got ", piece);
  const int64_t n = x.size(dim);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += piece) sizes.push_back(std::min(piece, n - start));
  return split(x, sizes, dim);
}

TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  SKA_CHECK(chunks > 0, ValueError, "chunk: number of chunks must be positive, got ", chunks);
  const int64_t n = x.size(dim);
  return split(x, std::max<int64_t>((n + chunks - 1) / chunks, 1), dim);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  SKA_CHECK(pads.size() % 2 == 0 && static_cast<int64_t>(pads.size()) <= 2 * x.dim(), ShapeError,
            "pad: ", pads.size(), " padding values for a ", x.dim(),
            "-d tensor; expected pairs (lo, hi) for at most every dim");
  Shape shape = x.shape();
  std::vector<int64_t> lo(static_cast<size_t>(x.dim()), 0);
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int64_t d = x.dim() - 1 - static_cast<int64_t>(i);
    SKA_CHECK(pads[2 * i] >= 0 && pads[2 * i + 1] >= 0, ValueError,
              "pad: negative padding is not supported (dim ", d, ")");
    lo[static_cast<size_t>(d)] = pads[2 * i];
    shape[d] += pads[2 * i] + pads[2 * i + 1];
  }
  Tensor out = Tensor::full(shape, value, x.dtype(), x.device());
  auto interior = [lo, in = x.shape()](const Tensor& t) {
    Tensor v = t;
    for (int64_t d = 0; d < t.dim(); ++d) v = narrow_raw(v, d, lo[static_cast<size_t>(d)], in[d]);
    return v;
  };
  interior(out).copy_(x);
  autograd::record_op("pad", {x}, {out}, [interior](const TensorList& g) {
    return TensorList{interior(g[0]).contiguous()};
  });
  return out;
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  SKA_CHECK(shifts.size() == dims.size(), ValueError, "roll: ", shifts.size(), " shifts for ",
            dims.size(), " dims");
  // Shifts of a dim given twice add up, as torch.roll's.
  std::vector<int64_t> total(static_cast<size_t>(x.dim()), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    total[static_cast<size_t>(wrap_dim(dims[i], x.dim(), "roll"))] += shifts[i];
  }
  // Each dim's shift in [0, n), and the shifts back.
  std::vector<int64_t> shift(static_cast<size_t>(x.dim()), 0), back = shift;
  bool moves = false;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t n = x.shape()[d];
    if (n == 0) continue;
    const size_t i = static_cast<size_t>(d);
    shift[i] = ((total[i] % n) + n) % n;
    back[i] = shift[i] == 0 ? 0 : n - shift[i];
    moves = moves || shift[i] != 0;
  }
  if (!moves) return x;
  // One pass each way (the roll kernel): the gradient of a roll is the roll back.
  const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  SKA_KERNEL(x.device(), roll)(x.detach(), shift, out);
  autograd::record_op("roll", {x}, {out}, [back](const TensorList& g) {
    const Tensor gx = Tensor::empty(g[0].shape(), g[0].dtype(), g[0].device());
    SKA_KERNEL(gx.device(), roll)(g[0], back, gx);
    return TensorList{gx};
  });
  return out;
}

namespace {

void check_grid(const Tensor& x, int64_t kernel, const char* op) {
  SKA_CHECK(kernel >= 1 && kernel % 2 == 1, ValueError, op,
            ": the kernel must be odd and positive, got ", kernel);
  SKA_CHECK(x.dim() >= 3, ShapeError, op, ": expected [..., H, W, C], got ", shape_str(x.shape()));
}

// Copies x's k x k neighbourhoods into `taps` [..., H, W, k*k, C] (a raw view, zeros before).
void gather_neighbourhoods(const Tensor& x, int64_t kernel, const Tensor& taps) {
  const int64_t h = x.size(-3), w = x.size(-2);
  for (int64_t ky = 0; ky < kernel; ++ky) {
    for (int64_t kx = 0; kx < kernel; ++kx) {
      const TapRegion r = tap_region(h, w, kernel, ky, kx);
      if (r.empty()) continue;
      const int64_t rows = r.y1 - r.y0, cols = r.x1 - r.x0;
      grid_window(tap_of(taps, ky * kernel + kx), r.y0, rows, r.x0, cols)
          .copy_(grid_window(x, r.y0 + r.dy, rows, r.x0 + r.dx, cols));
    }
  }
}

// The gradient of gather_neighbourhoods: each tap's gradient in g_taps [..., H, W, k*k, C] added
// onto the positions it read, into a new [..., H, W, C] tensor of shape `in`.
Tensor scatter_neighbourhoods(const Tensor& g_taps, int64_t kernel, const Shape& in) {
  const Tensor gx = Tensor::zeros(in, g_taps.dtype(), g_taps.device());
  const int64_t h = in[in.size() - 3], w = in[in.size() - 2];
  for (int64_t ky = 0; ky < kernel; ++ky) {
    for (int64_t kx = 0; kx < kernel; ++kx) {
      const TapRegion r = tap_region(h, w, kernel, ky, kx);
      if (r.empty()) continue;
      const int64_t rows = r.y1 - r.y0, cols = r.x1 - r.x0;
      const Tensor dst = grid_window(gx, r.y0 + r.dy, rows, r.x0 + r.dx, cols);
      const Tensor src = grid_window(tap_of(g_taps, ky * kernel + kx), r.y0, rows, r.x0, cols);
      SKA_KERNEL(gx.device(), binary)(BinaryOp::kAdd, dst, src, dst);  // in place, elementwise
    }
  }
  return gx;
}

// The first k*k*C columns of contiguous rows [..., H, W, width], seen as [..., H, W, k*k, C].
Tensor taps_of_rows(const Tensor& rows, int64_t kernel, int64_t channels) {
  Shape shape = rows.shape(), strides = rows.strides();
  shape.back() = kernel * kernel;
  shape.push_back(channels);
  strides.back() = channels;
  strides.push_back(1);
  return Tensor::make_view(rows.storage(), shape, strides, rows.offset(), rows.dtype());
}

}  // namespace

Tensor with_zero_grads(const Tensor& y, const TensorList& unused) {
  Tensor out = Tensor::make_view(y.storage(), y.shape(), y.strides(), y.offset(), y.dtype());
  struct Like {
    Shape shape;
    DType dtype;
    Device device;
  };
  std::vector<Like> likes;  // what each zero gradient looks like (the tensors are not kept)
  TensorList inputs = {y};
  for (const Tensor& t : unused) {
    inputs.push_back(t);
    likes.push_back({t.shape(), t.dtype(), t.device()});
  }
  autograd::record_op("with_zero_grads", inputs, {out}, [likes](const TensorList& g) {
    TensorList grads = {g[0]};
    for (const Like& l : likes) grads.push_back(Tensor::zeros(l.shape, l.dtype, l.device));
    return grads;
  });
  return out;
}

Tensor grid_neighbourhoods(const Tensor& x, int64_t kernel) {
  check_grid(x, kernel, "grid_neighbourhoods");
  Shape shape = x.shape();
  shape.insert(shape.end() - 1, kernel * kernel);
  Tensor out = Tensor::zeros(shape, x.dtype(), x.device());
  gather_neighbourhoods(x, kernel, out);
  autograd::record_op("grid_neighbourhoods", {x}, {out}, [=, in = x.shape()](const TensorList& g) {
    return TensorList{scatter_neighbourhoods(g[0], kernel, in)};
  });
  return out;
}

Tensor grid_neighbourhood_rows(const Tensor& x, int64_t kernel, int64_t width) {
  check_grid(x, kernel, "grid_neighbourhood_rows");
  const int64_t channels = x.size(-1), taps = kernel * kernel * channels;
  SKA_CHECK(width > taps, ValueError, "grid_neighbourhood_rows: rows of ", width,
            " columns cannot hold ", taps, " neighbourhood values and the column of ones");
  Shape shape = x.shape();
  shape.back() = width;
  Tensor out = Tensor::zeros(shape, x.dtype(), x.device());
  narrow_raw(out, out.dim() - 1, taps, 1).fill_(1.0);
  gather_neighbourhoods(x, kernel, taps_of_rows(out, kernel, channels));
  autograd::record_op("grid_neighbourhood_rows", {x}, {out},
                      [=, in = x.shape()](const TensorList& g) {
                        const Tensor gc = g[0].contiguous();
                        return TensorList{
                            scatter_neighbourhoods(taps_of_rows(gc, kernel, channels), kernel, in)};
                      });
  return out;
}

}  // namespace ska
