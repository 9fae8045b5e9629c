// Shapes and strides: small helpers shared by the tensor, the ops and the kernels.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace ska {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// Whether elements of `shape` at `strides` cover a block of memory once each: a contiguous
// tensor seen through a permutation (torch's is_non_overlapping_and_dense). Empty: true.
bool non_overlapping_and_dense(const Shape& shape, const Shape& strides);
// Whether it is that, or the first shape[-1] columns of such a tensor whose rows (the last dim,
// of unit stride, innermost) are wider: rows padded, as empty_aligned_rows (ops/shape_ops.h)
// makes them. Either way no element twice.
bool dense_with_padded_rows(const Shape& shape, const Shape& strides);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"

// Wraps a possibly negative dim into [0, ndim); throws ShapeError naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting of two shapes; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << shape_str(s); }

}  // namespace ska
