// StarReLU's kernels (cuda/kernels/star_relu.cu) built by the host compiler and run by
// tests/simt: the entry points' launches (launch_forward, launch_backward) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/star_relu.cu"
// clang-format on

#include "tests/simt/star_relu_host.h"

#include <vector>

namespace ska::simt::star_relu {

template <typename X, typename P, typename Y>
void forward(const X* x, const P* scale, const P* bias, Y* y, int64_t n) {
  cuda::launch_forward(x, scale, bias, y, n, nullptr);
}

template <typename X, typename P, typename G>
void backward(const G* gy, const X* x, const P* scale, X* gx, P* grad_scale, P* grad_bias,
              int64_t n, int64_t sms) {
  std::vector<float> partials(static_cast<size_t>(2 * cuda::backward_blocks(n, sms)));
  cuda::launch_backward(gy, x, scale, gx, grad_scale, grad_bias, n, sms, partials.data(), nullptr);
}

int64_t backward_blocks(int64_t n, int64_t sms) { return cuda::backward_blocks(n, sms); }
int64_t backward_chunk(int64_t n, int64_t blocks) { return cuda::backward_chunk(n, blocks); }

#define SKA_SIMT_STAR_RELU(X, P, Y)                                          \
  template void forward<X, P, Y>(const X*, const P*, const P*, Y*, int64_t); \
  template void backward<X, P, Y>(const Y*, const X*, const P*, X*, P*, P*, int64_t, int64_t);
SKA_SIMT_STAR_RELU(float, float, float)
SKA_SIMT_STAR_RELU(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16)
SKA_SIMT_STAR_RELU(__nv_bfloat16, float, float)
SKA_SIMT_STAR_RELU(__nv_bfloat16, float, __nv_bfloat16)
#undef SKA_SIMT_STAR_RELU

}  // namespace ska::simt::star_relu
