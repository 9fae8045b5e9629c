// cuBLASLt for the emulated device (tests/emu/device.h), in place of cuda/runtime/cublaslt.cpp's
// loader: the entry points cuda/kernels/gemm.cpp calls, on host memory. A product is column-major
// as cuBLASLt's: D = alpha op(A) op(B) + beta C per batch entry, f32, bf16 or f16 operands, summed
// in f64 (f32 inputs first rounded to TF32 under CUBLAS_COMPUTE_32F_FAST_TF32) and rounded once
// to D's type, with the BIAS (a value per row of D) and BGRADB (the sums
// of op(B) over k, a value per column of D) epilogues. The descriptors' values are read when the
// call is made, as a captured call keeps them.
#include "cuda/runtime/cublaslt.h"

#include <cblas.h>
#include <cublasLt.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "tests/emu/device.h"
#include "tests/emu/values.h"

struct cublasLtContext {};

namespace ska::cuda {
namespace {

struct Desc {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  bool bias_type_set = false;
  int64_t bias_batch_stride = 0;
  bool tf32 = false;  // CUBLAS_COMPUTE_32F_FAST_TF32: f32 inputs rounded to TF32
};
struct Layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t batch_stride = 0;
};

Desc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }

emu::Element element_of(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return emu::Element::kF32;
    case CUDA_R_16BF:
      return emu::Element::kBF16;
    case CUDA_R_16F:
      return emu::Element::kF16;
    default:
      throw std::logic_error("emulated cuBLASLt: an unsupported data type");
  }
}
double load(const void* p, cudaDataType_t t, int64_t i) { return emu::load(p, element_of(t), i); }
void store(void* p, cudaDataType_t t, int64_t i, double v) { emu::store(p, element_of(t), i, v); }
using emu::tf32;
bool supported(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

cublasStatus_t create(cublasLtHandle_t* h) {
  *h = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}
const char* status_name(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated)";
}
const char* status_string(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "an error of the emulated cuBLASLt";
}
cublasStatus_t desc_create(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                           cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  Desc* desc = new Desc();
  desc->tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
template <typename T>
T value_of(const void* buf, size_t size) {
  if (size != sizeof(T)) throw std::invalid_argument("emulated cuBLASLt: an attribute's size");
  T v;
  std::memcpy(&v, buf, sizeof v);
  return v;
}
cublasStatus_t desc_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                        const void* buf, size_t size) {
  Desc& desc = *desc_of(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      desc.trans_a = value_of<cublasOperation_t>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      desc.trans_b = value_of<cublasOperation_t>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      desc.epilogue = value_of<uint32_t>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      desc.bias = value_of<const void*>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      desc.bias_type = static_cast<cudaDataType_t>(value_of<int32_t>(buf, size));
      desc.bias_type_set = true;
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      desc.bias_batch_stride = value_of<int64_t>(buf, size);
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_create(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                             uint64_t cols, int64_t ld) {
  if (!supported(type) || ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_set(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                          const void* buf, size_t size) {
  Layout& layout = *layout_of(l);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      layout.batch = value_of<int32_t>(buf, size);
      break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      layout.batch_stride = value_of<int64_t>(buf, size);
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_create(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_set(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                        const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_destroy(cublasLtMatmulPreference_t p) {
  delete reinterpret_cast<int*>(p);
  return CUBLAS_STATUS_SUCCESS;
}

// The problem's sizes, or a status when the layouts do not fit together.
struct Sizes {
  uint64_t m = 0, n = 0, k = 0;
};
cublasStatus_t sizes_of(const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                        const Layout& dl, Sizes* s) {
  const uint64_t am = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t ak = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t bk = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t bn = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (ak != bk || dl.rows != am || dl.cols != bn || c.rows != dl.rows || c.cols != dl.cols ||
      a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *s = {am, bn, ak};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t heuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                         cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t, int requested,
                         cublasLtMatmulHeuristicResult_t results[], int* count) {
  Sizes s;
  const cublasStatus_t st =
      sizes_of(*desc_of(d), *layout_of(a), *layout_of(b), *layout_of(c), *layout_of(dl), &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  *count = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].workspaceSize = 0;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha_p,
                      const void* A, cublasLtMatrixLayout_t adesc, const void* B,
                      cublasLtMatrixLayout_t bdesc, const void* beta_p, const void* C,
                      cublasLtMatrixLayout_t cdesc, void* D, cublasLtMatrixLayout_t ddesc,
                      const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  const Desc d = *desc_of(desc);  // the values at the call
  const Layout a = *layout_of(adesc), b = *layout_of(bdesc), c = *layout_of(cdesc),
               dl = *layout_of(ddesc);
  Sizes s;
  const cublasStatus_t st = sizes_of(d, a, b, c, dl, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const bool bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS;
  const bool bgrad = d.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  if (!bias && !bgrad && d.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((bias || bgrad) && d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const cudaDataType_t bias_type = d.bias_type_set ? d.bias_type : dl.type;
  float alpha = 0.0f, beta = 0.0f;
  std::memcpy(&alpha, alpha_p, sizeof alpha);
  std::memcpy(&beta, beta_p, sizeof beta);
  const cudaError_t e = emu::submit(stream, [=] {
    std::vector<double> sums(bgrad ? s.n : 0);
    for (int32_t batch = 0; batch < dl.batch; ++batch) {
      const int64_t ao = batch * a.batch_stride, bo = batch * b.batch_stride,
                    co = batch * c.batch_stride, d_o = batch * dl.batch_stride;
      const bool round_a = d.tf32 && a.type == CUDA_R_32F, round_b = d.tf32 && b.type == CUDA_R_32F;
      // op(A) [m, k] and op(B) [k, n] widened to f64, row-major, then one f64 product.
      std::vector<double> opa(s.m * s.k), opb(s.k * s.n), out(s.m * s.n);
      for (uint64_t i = 0; i < s.m; ++i) {
        for (uint64_t kk = 0; kk < s.k; ++kk) {
          const double v = d.trans_a == CUBLAS_OP_N ? load(A, a.type, ao + i + kk * a.ld)
                                                    : load(A, a.type, ao + kk + i * a.ld);
          opa[i * s.k + kk] = round_a ? tf32(v) : v;
        }
      }
      for (uint64_t kk = 0; kk < s.k; ++kk) {
        for (uint64_t j = 0; j < s.n; ++j) {
          const double v = d.trans_b == CUBLAS_OP_N ? load(B, b.type, bo + kk + j * b.ld)
                                                    : load(B, b.type, bo + j + kk * b.ld);
          opb[kk * s.n + j] = round_b ? tf32(v) : v;
          if (bgrad) sums[j] += opb[kk * s.n + j];
        }
      }
      if (s.m > 0 && s.n > 0 && s.k > 0) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.m),
                    static_cast<int>(s.n), static_cast<int>(s.k), 1.0, opa.data(),
                    static_cast<int>(s.k), opb.data(), static_cast<int>(s.n), 0.0, out.data(),
                    static_cast<int>(s.n));
      }
      for (uint64_t j = 0; j < s.n; ++j) {
        for (uint64_t i = 0; i < s.m; ++i) {
          double v = static_cast<double>(alpha) * out[i * s.n + j];
          if (beta != 0.0f) v += static_cast<double>(beta) * load(C, c.type, co + i + j * c.ld);
          if (bias) v += load(d.bias, bias_type, batch * d.bias_batch_stride + i);
          store(D, dl.type, d_o + i + j * dl.ld, v);
        }
      }
      if (bgrad) {
        for (uint64_t j = 0; j < s.n; ++j) {
          store(const_cast<void*>(d.bias), bias_type, batch * d.bias_batch_stride + j, sums[j]);
          sums[j] = 0.0;
        }
      }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt{create,   status_name,   status_string, desc_create,
                           desc_set, layout_create, layout_set,    pref_create,
                           pref_set, pref_destroy,  heuristic,     matmul};
  return lt;
}

}  // namespace ska::cuda
