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

void round_into(const Tensor& result, const Tensor& out) {
  if (!out.defined() || result.same_storage(out)) return;
  copy(result, out);
}

}  // namespace ska::cpu
