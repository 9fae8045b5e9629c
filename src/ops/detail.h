// Helpers shared by the op implementations: argument checks and raw (history-free) views.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ska::detail {

// Throws DeviceError / DTypeError naming `op` and the shapes when a and b differ in device or dtype.
void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_floating(const char* op, const Tensor& x);
void check_dim(const char* op, const Tensor& x, int64_t ndim, const char* what);

// A stride-0 view of t broadcast to `shape`, recording no autograd history (for kernel inputs).
Tensor broadcast_raw(const Tensor& t, const Shape& shape);
// Sorted, unique, wrapped dims; empty `dims` means all dims.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// `shape` with every dim in `dims` set to 1.
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& dims);
// `shape` without the dims in `dims`.
Shape squeezed_shape(const Shape& shape, const std::vector<int64_t>& dims);

}  // namespace ska::detail
