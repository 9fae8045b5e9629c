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
// An uninitialised tensor of `shape` (of `like`'s rank) whose dims lie in memory in the order of
// `like`'s strides, the largest outermost (ties keep their order); with `last_innermost` the
// last dim is innermost whatever its stride. Gradients and outputs of views come out in the
// layout of the tensor they view, so that undoing the view is free.
Tensor empty_like_layout(const Shape& shape, const Tensor& like, DType dtype,
                         bool last_innermost = true);
// The same from `like`'s strides alone (for a backward that must not keep `like` alive).
Tensor empty_in_stride_order(const Shape& shape, const Shape& strides, DType dtype, Device device,
                             bool last_innermost);
// The dims in the order empty_in_stride_order lays them out: outermost (largest stride) first,
// ties in their order; with `last_innermost` the last dim last whatever its stride.
std::vector<int64_t> dims_by_stride(const Shape& strides, bool last_innermost);
// Sorted, unique, wrapped dims; empty `dims` means all dims.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// `shape` with every dim in `dims` set to 1.
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& dims);
// `shape` without the dims in `dims`.
Shape squeezed_shape(const Shape& shape, const std::vector<int64_t>& dims);

}  // namespace ska::detail
