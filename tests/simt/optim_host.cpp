// The single-tensor optimizer kernels (cuda/kernels/optim.cu) built by the host compiler and run
// by tests/simt: the entry points' launches on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/optim.cu"
// clang-format on

#include "tests/simt/optim_host.h"

namespace ska::simt::optim {

template <typename T>
void adam(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
          const int64_t* step, const uint8_t* skip, const double* lr, const multi_tensor::Adam& a) {
  const cuda::AdamScalars s =
      cuda::adam_scalars(lr, a.beta1, a.beta2, a.eps, a.l2_decay, a.decoupled_decay);
  cuda::launch_adam_step<T>(p.data(), g.data(), nullptr, m.data(), v.data(), nullptr, step, skip,
                            static_cast<int64_t>(p.size()), s, nullptr);
}

template <typename T>
void sgd(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& buf, const uint8_t* skip,
         const double* lr, float momentum, float weight_decay, bool nesterov) {
  cuda::launch_sgd_step<T>(p.data(), g.data(), buf.empty() ? nullptr : buf.data(), skip,
                           static_cast<int64_t>(p.size()), lr, momentum, weight_decay, nesterov,
                           nullptr);
}

void advance_counts(std::vector<int64_t>& counts, const uint8_t* skip) {
  cuda::launch_advance_counts(counts.data(), static_cast<int64_t>(counts.size()), skip, nullptr);
}

void record_update(float (&stats)[5], const float* loss, const uint8_t* skip) {
  cuda::launch_record_update(stats, loss, skip, nullptr);
}

template void adam<float>(std::vector<float>&, const std::vector<float>&, std::vector<float>&,
                          std::vector<float>&, const int64_t*, const uint8_t*, const double*,
                          const multi_tensor::Adam&);
template void adam<__nv_bfloat16>(std::vector<__nv_bfloat16>&, const std::vector<__nv_bfloat16>&,
                                  std::vector<__nv_bfloat16>&, std::vector<__nv_bfloat16>&,
                                  const int64_t*, const uint8_t*, const double*,
                                  const multi_tensor::Adam&);
template void sgd<float>(std::vector<float>&, const std::vector<float>&, std::vector<float>&,
                         const uint8_t*, const double*, float, float, bool);

}  // namespace ska::simt::optim
