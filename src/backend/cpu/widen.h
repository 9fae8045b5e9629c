// bf16 and f16 in the CPU kernels that mixed precision needs (GEMM, convolution, pointwise,
// reductions, indexing, random): the f32 path runs on widened copies of the 16-bit operands and
// each output is rounded once, as the CUDA kernels load 16-bit values, compute in f32 and round
// at the store. A reference for parity and CPU autocast, not a fast path.
#pragma once

#include "core/tensor.h"

namespace ska::cpu {

inline bool is_16bit_float(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

// A contiguous f32 copy of t's values; t itself when undefined or not a 16-bit float.
Tensor widen_f32(const Tensor& t);
// An uninitialised contiguous f32 tensor of out's shape for a kernel to write; out itself when
// out is not a 16-bit float.
Tensor f32_output(const Tensor& out);
// The same, keeping a channels-last layout ([N, C, H, W] laid out as a contiguous [N, H, W, C]);
// any other layout gives a contiguous tensor, as above.
Tensor widen_f32_like(const Tensor& t);
Tensor f32_output_like(const Tensor& out);
// Rounds `result` (from f32_output or widen_f32) into `out` (to nearest even); nothing when they
// are the same tensor.
void round_into(const Tensor& result, const Tensor& out);

}  // namespace ska::cpu
