// Widening 16-bit kernel operands to f32 and rounding results back (see widen.h).
#include "backend/cpu/widen.h"

#include "backend/backend.h"

namespace ska::cpu {

Tensor widen_f32(const Tensor& t) {
  if (!t.defined() || !is_16bit_float(t.dtype())) return t;
  Tensor wide = Tensor::empty(t.shape(), DType::kF32, t.device());
  copy(t, wide);
  return wide;
}

Tensor f32_output(const Tensor& out) {
  if (!out.defined() || !is_16bit_float(out.dtype())) return out;
  return Tensor::empty(out.shape(), DType::kF32, out.device());
}

namespace {

// An uninitialised tensor of t's shape, channels-last if t is (and not contiguous).
Tensor empty_like_layout(const Tensor& t, DType dtype) {
  if (t.is_contiguous() || !t.is_channels_last())
    return Tensor::empty(t.shape(), dtype, t.device());
  return Tensor::empty({t.size(0), t.size(2), t.size(3), t.size(1)}, dtype, t.device())
      .permute({0, 3, 1, 2});
}

}  // namespace

Tensor widen_f32_like(const Tensor& t) {
  if (!t.defined() || !is_16bit_float(t.dtype())) return t;
  Tensor wide = empty_like_layout(t, DType::kF32);
  copy(t, wide);
  return wide;
}

Tensor f32_output_like(const Tensor& out) {
  if (!out.defined() || !is_16bit_float(out.dtype())) return out;
  return empty_like_layout(out, DType::kF32);
}

void round_into(const Tensor& result, const Tensor& out) {
  if (!out.defined() || result.same_storage(out)) return;
  copy(result, out);
}

}  // namespace ska::cpu
