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
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"

// Wraps a possibly negative dim into [0, ndim); throws ShapeError naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting of two shapes; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << shape_str(s); }

}  // namespace ska
