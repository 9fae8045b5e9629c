// CPU kernel: batched GEMM on OpenBLAS (CBLAS), with transposed operands, batch broadcasting
// (batch stride 0), alpha/beta and an optional bias added to every row of the result.
#include <cblas.h>
#include <cstdint>

#include <algorithm>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"

namespace ska::cpu {

namespace {

// Below this many multiply-adds per GEMM, OpenBLAS runs single-threaded, so the batch is spread
// over OpenMP threads instead.
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
  SKA_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype(), DTypeError,
            "gemm: operands of different dtypes: ", dtype_name(a.dtype()), ", ",
            dtype_name(b.dtype()), ", ", dtype_name(c.dtype()));
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
}

// One call of the typed CBLAS GEMM (row-major C).
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                      const double* a, int lda, const double* b, int ldb, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
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
  auto one = [&](int64_t i) {
    T* ci = cp + i * m * n;
    if (k == 0) {  // BLAS leaves c untouched when k == 0; the product is zero
      for (int64_t e = 0; e < m * n; ++e) ci[e] = beta == T(0) ? T(0) : beta * ci[e];
    } else {
      blas_gemm(la.trans, lb.trans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                alpha, ap + i * a.stride(0), static_cast<int>(la.ld), bp + i * b.stride(0),
                static_cast<int>(lb.ld), beta, ci);
    }
    if (bias == nullptr) return;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) ci[r * n + j] += bias[j];
    }
  };
  const bool spread_batch = m * n * k < kSmallGemmFlops && batch * m * n * k > kParallelBatchFlops;
#pragma omp parallel for schedule(static) if (spread_batch && batch > 1)
  for (int64_t i = 0; i < batch; ++i) one(i);
}

}  // namespace

void gemm(const GemmArgs& args) {
  OperandLayout la{}, lb{};
  check_gemm_args(args, la, lb);
  if (args.c.numel() == 0) return;
  dispatch_floating(args.c.dtype(), "gemm",
                    [&](auto tag) { gemm_typed<decltype(tag)>(args, la, lb); });
}

}  // namespace ska::cpu
