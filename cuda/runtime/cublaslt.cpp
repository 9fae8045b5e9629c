// Loads cuBLASLt by its soname (the loader's usual search: LD_LIBRARY_PATH, the cache, the
// program's run path), then from the directory CMake found it in at configure time.
#include "cuda/runtime/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace ska::cuda {
namespace {

#define SKA_STRINGIFY_(x) #x
#define SKA_STRINGIFY(x) SKA_STRINGIFY_(x)
constexpr const char* kSoname = "libcublasLt.so." SKA_STRINGIFY(CUBLAS_VER_MAJOR);

void* open_library() {
  void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  std::string why = dlerror();
#ifdef SKA_CUBLASLT_DIR
  const std::string configured = std::string(SKA_CUBLASLT_DIR) + "/" + kSoname;
  lib = dlopen(configured.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  why += "; " + std::string(dlerror());
#endif
  SKA_FAIL(CudaError, "cannot load cuBLASLt (", why, "): install the CUDA toolkit's cuBLAS ",
           CUBLAS_VER_MAJOR, ".x or add the folder holding ", kSoname, " to LD_LIBRARY_PATH");
}

template <class F>
void bind(void* lib, F& entry, const char* name) {
  entry = reinterpret_cast<F>(dlsym(lib, name));
  if (entry) return;
  const std::string why = dlerror();
  dlclose(lib);
  SKA_FAIL(CudaError, kSoname, " has no entry point ", name, " (", why, ")");
}

CublasLt load() {
  void* lib = open_library();  // never closed: handles and plans live until the process ends
  CublasLt lt{};
  bind(lib, lt.create, "cublasLtCreate");
  bind(lib, lt.status_name, "cublasLtGetStatusName");
  bind(lib, lt.status_string, "cublasLtGetStatusString");
  bind(lib, lt.matmul_desc_create, "cublasLtMatmulDescCreate");
  bind(lib, lt.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  bind(lib, lt.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  bind(lib, lt.matrix_layout_set_attribute, "cublasLtMatrixLayoutSetAttribute");
  bind(lib, lt.preference_create, "cublasLtMatmulPreferenceCreate");
  bind(lib, lt.preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(lib, lt.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  bind(lib, lt.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(lib, lt.matmul, "cublasLtMatmul");
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();  // a throwing initialiser is retried by the next call
  return lt;
}

}  // namespace ska::cuda
