// CPU kernel: batched GEMM on OpenBLAS (CBLAS), with transposed operands, batch broadcasting
// (batch stride 0), alpha/beta and an optional bias added to every row of the result.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/widen.h"
#include "backend/gemm_checks.h"

namespace ska::cpu {

namespace {

// No thread gets a part of a GEMM smaller than this many multiply-adds.
constexpr int64_t kSmallGemmFlops = 64 * 64 * 64;
// Below this many multiply-adds in the whole batch, starting threads costs more than it saves.
constexpr int64_t kParallelBatchFlops = 1 << 16;

// How BLAS reads one [rows, cols] operand: row-major (no transpose) or column-major (transposed).
struct OperandLayout {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

// Dims of size 1 may carry any stride, so each layout is checked only where it matters.
bool layout_of(const Tensor& t, OperandLayout& layout) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t row_stride = t.stride(-2), col_stride = t.stride(-1);
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= cols)) {
    layout = {CblasNoTrans, rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride};
    return true;
  }
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= rows)) {
    layout = {CblasTrans, cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride};
    return true;
  }
  return false;
}

void check_gemm_args(const GemmArgs& args, OperandLayout& la, OperandLayout& lb) {
  const Tensor &a = args.a, &b = args.b, &c = args.c;
  SKA_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, ShapeError,
            "gemm: a, b, c must be 3-d, got ", shape_str(a.shape()), ", ", shape_str(b.shape()),
            ", ", shape_str(c.shape()));
  const int64_t batch = c.size(0), m = c.size(1), n = c.size(2), k = a.size(2);
  SKA_CHECK(a.size(0) == batch && b.size(0) == batch && a.size(1) == m && b.size(1) == k &&
                b.size(2) == n,
            ShapeError, "gemm: shapes do not match: a ", shape_str(a.shape()), " b ",
            shape_str(b.shape()), " c ", shape_str(c.shape()));
  SKA_CHECK(a.dtype() == b.dtype() &&
                (a.dtype() == c.dtype() || (c.dtype() == DType::kF32 && is_16bit_float(a.dtype()))),
            DTypeError, "gemm: a and b must share c's dtype, or a 16-bit one for an f32 c; got ",
            dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), ", ", dtype_name(c.dtype()));
  SKA_CHECK(c.is_contiguous(), ValueError, "gemm: c must be contiguous, got strides ",
            shape_str(c.strides()));
  SKA_CHECK(layout_of(a, la) && layout_of(b, lb), ValueError,
            "gemm: operands must be row- or column-major in their last two dims, got a strides ",
            shape_str(a.strides()), " b strides ", shape_str(b.strides()));
  if (args.bias.defined()) {
    SKA_CHECK(args.bias.numel() == n && args.bias.is_contiguous() && args.bias.dtype() == c.dtype(),
              ShapeError, "gemm: bias must be a contiguous [", n, "] tensor of c's dtype, got ",
              args.bias.str());
  }
  check_gemm_row_sums("gemm", args);
}

// How many parts each of `batch` GEMMs of m * n * k multiply-adds is split into: enough parts
// for every thread when the batch alone does not divide evenly over them, but none smaller than
// kSmallGemmFlops; 1 inside a parallel region (a caller that already spreads work over threads).
int64_t gemm_splits(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int64_t threads = omp_get_max_threads();
  if (threads <= 1 || batch % threads == 0 || omp_in_parallel()) return 1;
  const int64_t by_size = std::max<int64_t>(1, m * n * k / kSmallGemmFlops);
  return std::min(threads, by_size);
}

template <typename T>
void gemm_typed(const GemmArgs& args, const OperandLayout& la, const OperandLayout& lb) {
  const Tensor &a = args.a, &b = args.b, &c = args.c;
  const int64_t batch = c.size(0), m = c.size(1), n = c.size(2), k = a.size(2);
  const T* ap = static_cast<const T*>(a.data_ptr());
  const T* bp = static_cast<const T*>(b.data_ptr());
  T* cp = static_cast<T*>(c.data_ptr());
  const T* bias = args.bias.defined() ? static_cast<const T*>(args.bias.data_ptr()) : nullptr;
  const T alpha = static_cast<T>(args.alpha), beta = static_cast<T>(args.beta);
  // Part `part` of `parts` of item i: a band of C's rows or columns (the longer dim), a multiple
  // of 16 wide, from the matching band of A's rows or B's columns.
  auto run_part = [&](int64_t i, int64_t part, int64_t parts) {
    const bool by_rows = m >= n;
    const int64_t len = by_rows ? m : n;
    const int64_t step = ((len + parts - 1) / parts + 15) / 16 * 16;
    const int64_t lo = std::min(len, part * step), hi = std::min(len, lo + step);
    if (hi <= lo) return;
    const T* ai = ap + i * a.stride(0);
    const T* bi = bp + i * b.stride(0);
    T* ci = cp + i * m * n;
    int64_t rows = m, cols = n, col0 = 0;
    if (by_rows) {
      ai += la.trans == CblasNoTrans ? lo * la.ld : lo;
      ci += lo * n;
      rows = hi - lo;
    } else {
      bi += lb.trans == CblasNoTrans ? lo : lo * lb.ld;
      ci += lo;
      cols = hi - lo;
      col0 = lo;
    }
    if (k == 0) {  // BLAS leaves c untouched when k == 0; the product is zero
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          T& e = ci[r * n + j];
          e = beta == T(0) ? T(0) : beta * e;
        }
      }
    } else {
      blas_gemm(la.trans, lb.trans, static_cast<int>(rows), static_cast<int>(cols),
                static_cast<int>(k), alpha, ai, static_cast<int>(la.ld), bi,
                static_cast<int>(lb.ld), beta, ci, static_cast<int>(n));
    }
    if (bias == nullptr) return;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) ci[r * n + j] += bias[col0 + j];
    }
  };
  const int64_t parts = gemm_splits(batch, m, n, k);
  const int64_t tasks = batch * parts;
#pragma omp parallel for schedule(static) if (tasks > 1 && batch * m * n * k > kParallelBatchFlops)
  for (int64_t t = 0; t < tasks; ++t) run_part(t / parts, t % parts, parts);
}

}  // namespace

void gemm(const GemmArgs& args) {
  OperandLayout la{}, lb{};
  check_gemm_args(args, la, lb);
  if (args.a_row_sums.defined()) {  // as reduce sums them: a[0]'s rows over k
    const Tensor& a = args.a;
    const Tensor rows = Tensor::make_view(a.storage(), {a.size(1), a.size(2)},
                                          {a.stride(1), a.stride(2)}, a.offset(), a.dtype());
    reduce(ReduceOp::kSum, rows, std::vector<int64_t>{1},
           args.a_row_sums.view({args.a_row_sums.numel(), 1}));
    GemmArgs product = args;
    product.a_row_sums = Tensor();
    gemm(product);
    return;
  }
  if (args.c.numel() == 0) return;
  if (is_16bit_float(args.a.dtype())) {  // f32 products and sums, one rounding per 16-bit output
    GemmArgs wide = args;
    wide.a = widen_f32(args.a);
    wide.b = widen_f32(args.b);
    wide.c = widen_f32(args.c);
    wide.bias = widen_f32(args.bias);
    gemm(wide);
    round_into(wide.c, args.c);
    return;
  }
  use_single_threaded_blas();
  dispatch_floating(args.c.dtype(), "gemm",
                    [&](auto tag) { gemm_typed<decltype(tag)>(args, la, lb); });
}

}  // namespace ska::cpu
