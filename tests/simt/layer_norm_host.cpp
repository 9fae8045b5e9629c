// The fused residual add + layer norm's forward kernels (cuda/kernels/layer_norm.cu) built by the
// host compiler and run by tests/simt, launched as add_layer_norm_forward launches them.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/layer_norm.cu"
// clang-format on

#include "tests/simt/layer_norm_host.h"

namespace ska::cuda {
namespace {
// The fused backward's `extern __shared__ float red[]` (not launched here).
alignas(128) thread_local float red[227 * 1024 / sizeof(float)];
const bool registered =
    (simt::register_shared(reinterpret_cast<unsigned char*>(red), sizeof red), true);
}  // namespace
}  // namespace ska::cuda

namespace ska::simt::layer_norm {

template <typename T, typename TR, typename TY>
void add_layer_norm_forward(const T* x, const TR* y, const Dropout& drop, const T* ys,
                            const float* w, const float* b, T* sum, TY* normed, float* mean,
                            float* rstd, int64_t rows, int64_t cols, float eps, bool held) {
  const auto branch = kernel_form<cuda::BranchDrop>(drop);
  const auto args =
      std::make_tuple(x, y, branch, ys, w, b, sum, normed, mean, rstd, rows, cols, eps);
  const bool was = set_cuda_layer_norm_held_forward(held);
  const bool took_held = cuda::with_held_row(cols, [&](auto per_lane) {
    cuda::launch_rows(
        cuda::add_layer_norm_forward_held_kernel<T, TR, float, TY, decltype(per_lane)::value>, rows,
        0, args);
  });
  if (!took_held)
    cuda::launch_rows(cuda::add_layer_norm_forward_kernel<T, TR, float, TY>, rows, 0, args);
  set_cuda_layer_norm_held_forward(was);
}

template void add_layer_norm_forward<float, __nv_bfloat16, __nv_bfloat16>(
    const float*, const __nv_bfloat16*, const Dropout&, const float*, const float*, const float*,
    float*, __nv_bfloat16*, float*, float*, int64_t, int64_t, float, bool);
template void add_layer_norm_forward<float, float, float>(const float*, const float*,
                                                          const Dropout&, const float*,
                                                          const float*, const float*, float*,
                                                          float*, float*, float*, int64_t, int64_t,
                                                          float, bool);
template void add_layer_norm_forward<float, float, __nv_bfloat16>(
    const float*, const float*, const Dropout&, const float*, const float*, const float*, float*,
    __nv_bfloat16*, float*, float*, int64_t, int64_t, float, bool);
template void add_layer_norm_forward<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const Dropout&, const __nv_bfloat16*, const float*,
    const float*, __nv_bfloat16*, __nv_bfloat16*, float*, float*, int64_t, int64_t, float, bool);

template <typename TY>
void layer_norm_forward(const float* x, const float* w, const float* b, TY* y, float* mean,
                        float* rstd, int64_t rows, int64_t cols, float eps, bool held) {
  const auto args = std::make_tuple(x, w, b, y, mean, rstd, rows, cols, eps);
  const bool was = set_cuda_layer_norm_held_forward(held);
  const bool took_held = cuda::with_held_row(cols, [&](auto per_lane) {
    cuda::launch_rows(cuda::layer_norm_forward_held_kernel<float, TY, decltype(per_lane)::value>,
                      rows, 0, args);
  });
  if (!took_held) cuda::launch_rows(cuda::layer_norm_forward_kernel<float, TY>, rows, 0, args);
  set_cuda_layer_norm_held_forward(was);
}

template void layer_norm_forward<float>(const float*, const float*, const float*, float*, float*,
                                        float*, int64_t, int64_t, float, bool);
template void layer_norm_forward<__nv_bfloat16>(const float*, const float*, const float*,
                                                __nv_bfloat16*, float*, float*, int64_t, int64_t,
                                                float, bool);

template <typename T, typename TY, typename TB>
void add_layer_norm_backward(const TY* grad_y, const T* grad_sum, const T* x, const float* w,
                             const float* mean, const float* rstd, const Dropout& drop,
                             const void* y, bool low_branch, const T* ys, T* grad_x,
                             void* grad_branch, float* grad_w, float* grad_b, T* grad_scale,
                             int64_t rows, int64_t cols) {
  cuda::BranchGrad branch;
  branch.out = grad_branch;
  branch.low = low_branch;
  branch.scale = ys;
  branch.y = grad_scale != nullptr ? y : nullptr;
  branch.bits = drop.bits;
  branch.drop_scale = drop.scale;
  std::vector<float> partials(cuda::fused_partial_floats(rows, cols));
  const auto run = [&](auto scaled) {
    cuda::launch_fused_backward<T, float, TY, TB, decltype(scaled)::value>(
        grad_y, grad_sum, x, w, mean, rstd, grad_x, branch, grad_w, grad_b, grad_scale,
        partials.data(), rows, cols, nullptr);
  };
  if (ys != nullptr) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

template void add_layer_norm_backward<float, __nv_bfloat16, __nv_bfloat16>(
    const __nv_bfloat16*, const float*, const float*, const float*, const float*, const float*,
    const Dropout&, const void*, bool, const float*, float*, void*, float*, float*, float*, int64_t,
    int64_t);
template void add_layer_norm_backward<float, float, __nv_bfloat16>(
    const float*, const float*, const float*, const float*, const float*, const float*,
    const Dropout&, const void*, bool, const float*, float*, void*, float*, float*, float*, int64_t,
    int64_t);

}  // namespace ska::simt::layer_norm
