// Cross-entropy's kernels (cuda/kernels/cross_entropy.cu) built by the host compiler and run by
// tests/simt: the entry points' launches (launch_forward, launch_backward) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/cross_entropy.cu"
// clang-format on

#include "tests/simt/cross_entropy_host.h"

namespace ska::simt::cross_entropy {

template <typename T>
void forward(const T* logits, const int64_t* index, const T* prob, float smoothing, int64_t rows,
             int64_t cols, float* loss, float* lse) {
  cuda::launch_forward(logits, cuda::Target<T>{index, prob, smoothing}, rows, cols, loss, lse,
                       nullptr);
}

template <typename T>
void backward(const T* logits, const float* lse, const int64_t* index, const T* prob,
              float smoothing, const float* grad_loss, int64_t rows, int64_t cols, T* grad) {
  cuda::launch_backward(logits, lse, cuda::Target<T>{index, prob, smoothing}, grad_loss, rows, cols,
                        grad, nullptr);
}

int threads_for(int64_t cols) { return cuda::threads_for(cols); }

template void forward<float>(const float*, const int64_t*, const float*, float, int64_t, int64_t,
                             float*, float*);
template void forward<__nv_bfloat16>(const __nv_bfloat16*, const int64_t*, const __nv_bfloat16*,
                                     float, int64_t, int64_t, float*, float*);
template void backward<float>(const float*, const float*, const int64_t*, const float*, float,
                              const float*, int64_t, int64_t, float*);
template void backward<__nv_bfloat16>(const __nv_bfloat16*, const float*, const int64_t*,
                                      const __nv_bfloat16*, float, const float*, int64_t, int64_t,
                                      __nv_bfloat16*);

}  // namespace ska::simt::cross_entropy
