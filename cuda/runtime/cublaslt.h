// cuBLASLt, loaded when the first matrix product needs it rather than when the program starts.
// Linking libcublasLt.so directly costs every process that starts about 0.4 s and 200 MB of
// touched pages (its load-time registration), whether or not it ever multiplies on a GPU: `train`
// on the CPU, `--help`, and each of the test suite's hundreds of processes. The entry points keep
// the header's exact types; calling ::cublasLt* directly does not link, by design.
#pragma once

#include <cublasLt.h>

namespace ska::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtGetStatusName) status_name;
  decltype(&::cublasLtGetStatusString) status_string;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutSetAttribute) matrix_layout_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&::cublasLtMatmul) matmul;
};

// The library's entry points, loaded (dlopen) once on the first call, thread-safe. Throws CudaError
// naming the library and what the loader said when it cannot be loaded or lacks an entry point.
const CublasLt& cublaslt();

}  // namespace ska::cuda
