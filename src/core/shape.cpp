// Shape helpers.
#include "core/shape.h"

#include <algorithm>
#include <cstdint>

#include "core/checked_math.h"
#include "core/error.h"

namespace ska {

int64_t shape_numel(const Shape& shape) { return checked_numel<ShapeError>(shape, "shape_numel"); }

// The last dim has stride 1; each stride is the product of the (non-zero) dims after it.
Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    if (i > 0) {
      s = checked_mul<ShapeError>(s, std::max<int64_t>(shape[i], 1), "contiguous_strides: shape ",
                                  ShapeText{shape});
    }
  }
  return strides;
}

bool non_overlapping_and_dense(const Shape& shape, const Shape& strides) {
  if (shape_numel(shape) == 0) return true;
  std::vector<size_t> dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1) dims.push_back(i);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expected = 1;
  for (const size_t i : dims) {
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool dense_with_padded_rows(const Shape& shape, const Shape& strides) {
  if (non_overlapping_and_dense(shape, strides)) return true;
  const size_t rank = shape.size();
  if (rank < 2 || shape[rank - 1] <= 1 || strides[rank - 1] != 1 ||
      strides[rank - 2] <= shape[rank - 1]) {
    return false;
  }
  Shape wide = shape;
  wide[rank - 1] = strides[rank - 2];
  return non_overlapping_and_dense(wide, strides);
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  SKA_CHECK(dim >= lo && dim <= hi, ShapeError, op, ": dim ", dim, " out of range for a ", ndim,
            "-d tensor");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    SKA_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", shape_str(a), " and ",
              shape_str(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace ska
