// Status checks for CUDA, cuBLAS, cuDNN and NCCL calls: a failure throws CudaError with the call,
// the library's message and file:line.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

namespace ska::cuda {

void check_cuda(cudaError_t status, const char* expr, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line);
void check_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line);
void check_nccl(ncclResult_t status, const char* expr, const char* file, int line);

}  // namespace ska::cuda

#define SKA_CUDA_CHECK(expr) ::ska::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
#define SKA_CUBLAS_CHECK(expr) ::ska::cuda::check_cublas((expr), #expr, __FILE__, __LINE__)
#define SKA_CUDNN_CHECK(expr) ::ska::cuda::check_cudnn((expr), #expr, __FILE__, __LINE__)
#define SKA_NCCL_CHECK(expr) ::ska::cuda::check_nccl((expr), #expr, __FILE__, __LINE__)
// After every kernel launch: catches launch-configuration errors without synchronising.
#define SKA_CUDA_CHECK_LAUNCH() SKA_CUDA_CHECK(cudaGetLastError())
