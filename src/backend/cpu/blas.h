// The CBLAS calls the CPU kernels share: row-major GEMM overloads for f32 and f64, and the switch
// that keeps OpenBLAS single-threaded (the kernels spread work over OpenMP threads themselves).
#pragma once

#include <cblas.h>

#include <cstdint>

namespace ska::cpu {

// A size or leading dimension as CBLAS takes it.
inline int blas_int(int64_t v) { return static_cast<int>(v); }

// c = alpha * op(a) op(b) + beta * c, row-major, [m, k] x [k, n].
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                      const double* a, int lda, const double* b, int ldb, double beta, double* c,
                      int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// OpenBLAS runs single-threaded and each kernel splits its GEMMs over OpenMP threads instead. The
// pthread build of OpenBLAS keeps its worker threads spinning after a call, where they compete
// with the OpenMP threads of the next kernel (and those with BLAS's): on a busy 2-core machine
// a convolution (im2col regions between GEMMs) ran 15x slower with 2 threads than with 1. One
// thread pool for everything avoids that.
inline void use_single_threaded_blas() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

}  // namespace ska::cpu
