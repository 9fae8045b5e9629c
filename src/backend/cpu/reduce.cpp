// CPU kernel: sum / mean / max / min over chosen dims.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"
#include "backend/elementwise.h"
#include "core/simd_clones.h"

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

// The fold of one value into a column's accumulator, as the row path folds it: sums in double,
// and the first NaN met (in row order) wins max / min.
template <typename T>
struct Fold {
  ReduceOp op;
  void operator()(double& acc, T v) const {
    if (op == ReduceOp::kSum || op == ReduceOp::kMean) {
      acc += static_cast<double>(v);
    } else if (acc == acc) {  // once NaN, kept
      if (v != v) {
        acc = static_cast<double>(v);
      } else {
        acc = op == ReduceOp::kMax ? std::max(acc, static_cast<double>(v))
                                   : std::min(acc, static_cast<double>(v));
      }
    }
  }
};

// acc[c] += row[c] for c < n, in double: the column sums' inner loop, vectorised (no branch on
// the op inside it).
SKA_CPU_SIMD_CLONES
void add_row_f64(double* __restrict acc, const float* __restrict row, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += static_cast<double>(row[c]);
}
SKA_CPU_SIMD_CLONES
void add_row_f64(double* __restrict acc, const double* __restrict row, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += row[c];
}

// Reduces the rows of a contiguous [rows, cols] x into out [cols] column by column, without
// packing x transposed first: each thread owns a band of columns and walks every row in order,
// so each column is folded in the order the row path folds it (the same bits).
template <typename T>
void reduce_columns(ReduceOp op, const T* x, int64_t rows, int64_t cols, T* out) {
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t band = std::max<int64_t>(16, (cols + threads - 1) / threads);
  const int64_t bands = (cols + band - 1) / band;
  const Fold<T> fold{op};
  const double init = op == ReduceOp::kMax   ? -std::numeric_limits<double>::infinity()
                      : op == ReduceOp::kMin ? std::numeric_limits<double>::infinity()
                                             : 0.0;
  parallel_for(bands, [&](int64_t b) {
    const int64_t c0 = b * band, c1 = std::min(cols, c0 + band);
    std::vector<double> acc(static_cast<size_t>(c1 - c0), init);
    const bool sums = op == ReduceOp::kSum || op == ReduceOp::kMean;
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * cols;
      if (sums) {
        add_row_f64(acc.data(), row + c0, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c) fold(acc[static_cast<size_t>(c - c0)], row[c]);
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      double v = acc[static_cast<size_t>(c - c0)];
      if (op == ReduceOp::kMean) v /= static_cast<double>(rows);
      out[c] = static_cast<T>(v);
    }
  }, 1);
}

}  // namespace

void dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && out.numel() == 1 &&
                out.dtype() == (a.dtype() == DType::kF64 ? DType::kF64 : DType::kF32),
            ValueError, "cpu dot: expected operands of one shape and dtype and a one-element",
            " f32 (f64) output, got ", a.str(), ", ", b.str(), ", ", out.str());
  // Contiguous f64 copies (the reference), summed in fixed chunks, the chunks in order.
  const Tensor ac = a.to(DType::kF64).contiguous(), bc = b.to(DType::kF64).contiguous();
  const double* ap = ac.data<double>();
  const double* bp = bc.data<double>();
  const int64_t n = ac.numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(
      chunks,
      [&](int64_t c) {
        double s = 0.0;
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += ap[i] * bp[i];
        partial[static_cast<size_t>(c)] = s;
      },
      1);
  double total = 0.0;
  for (double p : partial) total += p;
  if (out.dtype() == DType::kF64) {
    *out.data<double>() = total;
  } else {
    *out.data<float>() = static_cast<float>(total);
  }
}

void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  SKA_CHECK(out.dtype() == x.dtype() || (out.dtype() == DType::kF32 && is_16bit_float(x.dtype())),
            DTypeError,
            "reduce: output must be of the input's dtype or f32 for a 16-bit input, got ",
            out.str(), " for ", x.str());
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(out);
    reduce(op, widen_f32(x), dims, result);
    return round_into(result, out);
  }
  dispatch_floating(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows = out.numel();
    const int64_t len = rows == 0 ? 0 : x.numel() / rows;
    if (len > 0 && x.is_contiguous() && reduces_leading_dims(x.shape(), dims)) {
      reduce_columns<T>(op, static_cast<const T*>(x.data_ptr()), len, rows,
                        static_cast<T*>(out.data_ptr()));
      return;
    }
    const Tensor packed = reduced_dims_last(x, dims);
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
