// Batch norm's kernels (cuda/kernels/batch_norm.cu) built by the host compiler and run by
// tests/simt: the entry points' launches (launch_train_stats, launch_apply, launch_grad_sums,
// launch_grad_x) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/batch_norm.cu"
// clang-format on

#include "tests/simt/batch_norm_host.h"

#include <vector>

namespace ska::simt::batch_norm {

template <typename T>
void forward(const T* x, const float* w, const float* b, int64_t n, int64_t c, int64_t s, float eps,
             float momentum, float* running_mean, float* running_var, T* y, float* save_mean,
             float* save_rstd, int64_t sms) {
  const cuda::Layout lay{n, c, s};
  const int sp = cuda::splits_for(lay, sms);
  std::vector<cuda::Welford> part(static_cast<size_t>(c * sp));
  cuda::launch_train_stats(x, lay, sp, part.data(), eps, momentum, save_mean, save_rstd,
                           running_mean, running_var, nullptr);
  cuda::launch_apply(x, w, b, save_mean, save_rstd, lay, y, nullptr);
}

template <typename T>
void backward(const T* gy, const T* x, const float* w, const float* save_mean,
              const float* save_rstd, int64_t n, int64_t c, int64_t s, T* gx, float* gw, float* gb,
              int64_t sms) {
  const cuda::Layout lay{n, c, s};
  const int sp = cuda::splits_for(lay, sms);
  std::vector<float2> sums(static_cast<size_t>(c * (sp + 1)));
  cuda::launch_grad_sums(gy, x, save_mean, save_rstd, lay, sp, sums.data() + c, sums.data(), gw, gb,
                         nullptr);
  cuda::launch_grad_x(gy, x, w, save_mean, save_rstd, static_cast<const float2*>(sums.data()), lay,
                      gx, nullptr);
}

int splits(int64_t n, int64_t c, int64_t s, int64_t sms) {
  return cuda::splits_for(cuda::Layout{n, c, s}, sms);
}

std::vector<int64_t> channel_offsets(int64_t n, int64_t c, int64_t s, int64_t ch, int64_t first,
                                     int64_t step, int count) {
  cuda::ChannelWalk walk(cuda::Layout{n, c, s}, ch, first, step);
  std::vector<int64_t> out;
  for (int k = 0; k < count; ++k, walk.next()) out.push_back(walk.offset());
  return out;
}

std::vector<int64_t> element_channels(int64_t n, int64_t c, int64_t s, int64_t first, int64_t step,
                                      int count) {
  cuda::ElementWalk walk(cuda::Layout{n, c, s}, first, step);
  std::vector<int64_t> out;
  for (int k = 0; k < count; ++k, walk.next()) out.push_back(walk.ch);
  return out;
}

template void forward<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                             float, float, float*, float*, float*, float*, float*, int64_t);
template void forward<__nv_bfloat16>(const __nv_bfloat16*, const float*, const float*, int64_t,
                                     int64_t, int64_t, float, float, float*, float*, __nv_bfloat16*,
                                     float*, float*, int64_t);
template void backward<float>(const float*, const float*, const float*, const float*, const float*,
                              int64_t, int64_t, int64_t, float*, float*, float*, int64_t);
template void backward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                      const float*, const float*, int64_t, int64_t, int64_t,
                                      __nv_bfloat16*, float*, float*, int64_t);

}  // namespace ska::simt::batch_norm
