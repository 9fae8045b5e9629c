// CPU kernel: sum / mean / max / min over chosen dims.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

// x viewed with the reduced dims moved last, packed contiguous: [kept..., reduced...].
Tensor reduced_dims_last(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<char> is_reduced(static_cast<size_t>(x.dim()), 0);
  for (int64_t d : dims) is_reduced[static_cast<size_t>(d)] = 1;
  Shape shape, strides;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (is_reduced[static_cast<size_t>(d)] == pass) {
        shape.push_back(x.shape()[d]);
        strides.push_back(x.strides()[d]);
      }
    }
  }
  Tensor view = Tensor::make_view(x.storage(), shape, strides, x.offset(), x.dtype());
  if (view.is_contiguous()) return view;
  Tensor packed = Tensor::empty(shape, x.dtype(), x.device());
  copy(view, packed);
  return packed;
}

}  // namespace

void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(out);
    reduce(op, widen_f32(x), dims, result);
    return round_into(result, out);
  }
  dispatch_floating(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const Tensor packed = reduced_dims_last(x, dims);
    const int64_t rows = out.numel();
    const int64_t len = rows == 0 ? 0 : x.numel() / rows;
    const T* xp = static_cast<const T*>(packed.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    parallel_for(rows, [&](int64_t r) {
      const T* row = xp + r * len;
      if (op == ReduceOp::kSum || op == ReduceOp::kMean) {
        double acc = 0.0;
        for (int64_t j = 0; j < len; ++j) acc += static_cast<double>(row[j]);
        if (op == ReduceOp::kMean) acc /= static_cast<double>(len);
        yp[r] = static_cast<T>(acc);
      } else {
        const bool is_max = op == ReduceOp::kMax;
        T acc = is_max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < len; ++j) {
          const T v = row[j];
          if (v != v) {  // NaN propagates
            acc = v;
            break;
          }
          acc = is_max ? std::max(acc, v) : std::min(acc, v);
        }
        yp[r] = acc;
      }
    }, 64);
  });
}

}  // namespace ska::cpu
