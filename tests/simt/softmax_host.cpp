// Softmax's kernels (cuda/kernels/softmax.cu) built by the host compiler and run by tests/simt:
// the entry points' launches (launch_forward, launch_backward) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/softmax.cu"
// clang-format on

#include "tests/simt/softmax_host.h"

namespace ska::cuda {
namespace {
// The block kernel's `extern __shared__ float zs[]`.
alignas(128) thread_local float zs[227 * 1024 / sizeof(float)];
const bool registered =
    (simt::register_shared(reinterpret_cast<unsigned char*>(zs), sizeof zs), true);
}  // namespace
}  // namespace ska::cuda

namespace ska::simt::softmax {

template <typename T>
void forward(const T* x, const T* mask, int64_t mask_rows, T* y, int64_t rows, int cols,
             float scale, bool log) {
  cuda::ForwardArgs<T> a{};
  a.x = x;
  a.mask = mask;
  if (mask != nullptr) {  // [mask_rows, cols] broadcast over rows / mask_rows leading rows
    a.mv.rows.ndim = 2;
    a.mv.rows.sizes[0] = rows / mask_rows;
    a.mv.rows.sizes[1] = mask_rows;
    a.mv.rows.strides[0] = 0;
    a.mv.rows.strides[1] = cols;
    a.mv.col_stride = 1;
  }
  a.y = y;
  a.rows = rows;
  a.cols = cols;
  a.scale = scale;
  a.log = log;
  cuda::launch_forward(a, nullptr);
}

template <typename T>
void backward(const T* y, const T* gy, T* gx, int64_t rows, int cols, float scale, bool log) {
  cuda::BackwardArgs<T> a{};
  a.y = y;
  a.gy = gy;
  a.gx = gx;
  a.rows = rows;
  a.cols = cols;
  a.scale = scale;
  a.log = log;
  cuda::launch_backward(a, nullptr);
}

template void forward<float>(const float*, const float*, int64_t, float*, int64_t, int, float,
                             bool);
template void forward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                     __nv_bfloat16*, int64_t, int, float, bool);
template void backward<float>(const float*, const float*, float*, int64_t, int, float, bool);
template void backward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                      int64_t, int, float, bool);

}  // namespace ska::simt::softmax
