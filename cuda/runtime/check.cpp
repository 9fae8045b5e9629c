// Status checks for CUDA, cuBLAS(Lt), cuDNN and NCCL: a failed call throws CudaError naming the call,
// the library's error name and message, and the file:line of the check.
#include "cuda/runtime/check.h"

#include "core/error.h"
#include "cuda/runtime/cublaslt.h"

namespace ska::cuda {

void check_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return;
  // Clear the (non-sticky) error so that a later SKA_CUDA_CHECK_LAUNCH does not report it again.
  (void)cudaGetLastError();
  SKA_FAIL(CudaError, "CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
           ") from ", expr, " at ", file, ":", line);
}

void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  SKA_FAIL(CudaError, "cuBLAS error ", cublaslt().status_name(status), " (",
           cublaslt().status_string(status), ") from ", expr, " at ", file, ":", line);
}

void check_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  SKA_FAIL(CudaError, "cuDNN error ", cudnnGetErrorString(status),
           detail[0] ? std::string(" (") + detail + ")" : std::string(), " from ", expr, " at ",
           file, ":", line);
}

// ncclGetLastError adds what NCCL logged about the failure (a peer, a socket, a version).
void check_nccl(ncclResult_t status, const char* expr, const char* file, int line) {
  if (status == ncclSuccess) return;
  const char* detail = ncclGetLastError(nullptr);
  SKA_FAIL(CudaError, "NCCL error ", ncclGetErrorString(status),
           detail && *detail ? std::string(" (") + detail + ")" : std::string(), " from ", expr,
           " at ", file, ":", line);
}

}  // namespace ska::cuda
