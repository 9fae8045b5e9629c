// The residual sums with per-channel scales (cuda/kernels/scaled_residual.cu) built by the host
// compiler and run by tests/simt: the entry points' launches (launch_forward, launch_backward) on
// host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/scaled_residual.cu"
// clang-format on

#include "tests/simt/scaled_residual_host.h"

#include <vector>

namespace ska::simt::scaled_residual {
namespace {

template <typename TX, typename TY, typename T>
cuda::Operands<TX, TY, T> operands(int64_t rows, int64_t cols, int64_t batch, const TX* x,
                                   const T* xs, const TY* y, const T* ys, const TY* yk) {
  const auto per_sample = static_cast<uint32_t>(yk != nullptr ? rows / batch : 1);
  return {{rows, cols, per_sample}, x, xs, y, ys, yk};
}

}  // namespace

template <typename TX, typename TY, typename T>
void forward(int64_t rows, int64_t cols, int64_t batch, const TX* x, const T* xs, const TY* y,
             const T* ys, const TY* yk, const Dropout& drop, T* out) {
  cuda::launch_forward(operands(rows, cols, batch, x, xs, y, ys, yk),
                       kernel_form<cuda::BranchDrop>(drop), out, nullptr);
}

template <typename TX, typename TY, typename T>
void backward(int64_t rows, int64_t cols, int64_t batch, const T* g, const TX* x, const T* xs,
              const TY* y, const T* ys, const TY* yk, const Dropout& drop, TX* gx, TY* gy, T* gxs,
              T* gys) {
  const auto a = operands(rows, cols, batch, x, xs, y, ys, yk);
  std::vector<float> part(2 * cuda::backward_chunks(a.geo) * cols);
  cuda::launch_backward(a, kernel_form<cuda::BranchDrop>(drop), g, gx, gy, gxs, gys, part.data(),
                        nullptr);
}

#define SKA_SIMT_SCALED_RESIDUAL(TX, TY, T)                                                       \
  template void forward<TX, TY, T>(int64_t, int64_t, int64_t, const TX*, const T*, const TY*,     \
                                   const T*, const TY*, const Dropout&, T*);                      \
  template void backward<TX, TY, T>(int64_t, int64_t, int64_t, const T*, const TX*, const T*,     \
                                    const TY*, const T*, const TY*, const Dropout&, TX*, TY*, T*, \
                                    T*);
SKA_SIMT_SCALED_RESIDUAL(float, float, float)
SKA_SIMT_SCALED_RESIDUAL(float, __nv_bfloat16, float)
SKA_SIMT_SCALED_RESIDUAL(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16)
SKA_SIMT_SCALED_RESIDUAL(__half, __half, __half)
#undef SKA_SIMT_SCALED_RESIDUAL

}  // namespace ska::simt::scaled_residual
