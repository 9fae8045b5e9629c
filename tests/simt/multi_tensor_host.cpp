// The multi-tensor optimizer kernels (cuda/kernels/multi_tensor.cu) built by the host compiler
// and run by tests/simt: the launches on raw operands (launch_adam, launch_lamb, ...) over host
// memory, with the entries the entry points would build.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/multi_tensor.cu"
// clang-format on

#include "tests/simt/multi_tensor_host.h"

#include <tuple>

namespace ska::simt::multi_tensor {
namespace {

// The lists' i-th vectors as the kernels' entries (aux: the i-th update count where given).
template <int Depth, typename... L>
cuda::Entries<Depth> entries(const int64_t* aux, L&... lists) {
  static_assert(sizeof...(L) == Depth);
  const auto& lead = std::get<0>(std::forward_as_tuple(lists...));
  cuda::Entries<Depth> e(lead.size());
  for (size_t i = 0; i < lead.size(); ++i) {
    void* ptrs[Depth] = {const_cast<void*>(static_cast<const void*>(lists[i].data()))...};
    for (int d = 0; d < Depth; ++d) e[i].ptr[d] = ptrs[d];
    e[i].aux = aux != nullptr ? aux + i : nullptr;
    e[i].numel = static_cast<int64_t>(lead[i].size());
  }
  return e;
}

cuda::AdamScalars scalars(const double* lr, const Adam& a, double l2_decay) {
  return cuda::adam_scalars(lr, a.beta1, a.beta2, a.eps, l2_decay, a.decoupled_decay);
}

}  // namespace

template <typename T>
void adam(List<T>& p, const List<T>& g, List<T>& m, List<T>& v, const std::vector<int64_t>& steps,
          const uint8_t* skip, const double* lr, const Adam& a) {
  cuda::launch_adam<T>(entries<4>(steps.data(), p, g, m, v), skip, scalars(lr, a, a.l2_decay),
                       nullptr);
}

template <typename T>
void lamb(List<T>& p, const List<T>& g, List<T>& m, List<T>& v, const std::vector<int64_t>& steps,
          const uint8_t* skip, const float* divisor, const double* lr, const Adam& a, bool adapt,
          bool trust_clip) {
  List<T> updates;
  for (const auto& t : p) updates.emplace_back(t.size());
  const auto e = entries<5>(steps.data(), p, g, m, v, updates);
  std::vector<float> partials(2 * cuda::total_chunks(e) + 1);
  cuda::launch_lamb<T>(e, skip, divisor, lr, scalars(nullptr, a, 0.0), adapt, trust_clip,
                       partials.data(), nullptr);
}

template <typename T>
void sgd(List<T>& p, const List<T>& g, List<T>& bufs, const uint8_t* skip, const double* lr,
         float momentum, float weight_decay, bool nesterov) {
  const bool has_momentum = !bufs.empty();
  // Without momentum the third list is the grads again (never read), as multi_sgd_step passes.
  const auto e = has_momentum ? entries<3>(nullptr, p, g, bufs) : entries<3>(nullptr, p, g, g);
  cuda::launch_sgd<T>(e, has_momentum, skip, lr, momentum, weight_decay, nesterov, nullptr);
}

template <typename T>
void ema(List<T>& e, const List<T>& values, const uint8_t* skip, double decay) {
  cuda::launch_ema<T>(entries<2>(nullptr, e, values), skip, static_cast<float>(decay),
                      static_cast<float>(1.0 - decay), nullptr);
}

template <typename T>
void grad_stats(List<T>& x, double scale, float (&out)[2]) {
  const auto e = entries<1>(nullptr, x);
  std::vector<float> partials(2 * cuda::total_chunks(e) + 1);
  cuda::launch_grad_stats<T>(e, static_cast<float>(scale), scale != 1.0, partials.data(), out,
                             nullptr);
}

template <typename S, typename D>
void cast(const List<S>& src, List<D>& dst) {
  cuda::launch_cast<S, D>(entries<2>(nullptr, src, dst), nullptr);
}

#define SKA_SIMT_MULTI_TENSOR(T)                                                                   \
  template void adam<T>(List<T>&, const List<T>&, List<T>&, List<T>&, const std::vector<int64_t>&, \
                        const uint8_t*, const double*, const Adam&);                               \
  template void lamb<T>(List<T>&, const List<T>&, List<T>&, List<T>&, const std::vector<int64_t>&, \
                        const uint8_t*, const float*, const double*, const Adam&, bool, bool);     \
  template void sgd<T>(List<T>&, const List<T>&, List<T>&, const uint8_t*, const double*, float,   \
                       float, bool);                                                               \
  template void ema<T>(List<T>&, const List<T>&, const uint8_t*, double);                          \
  template void grad_stats<T>(List<T>&, double, float(&)[2]);
SKA_SIMT_MULTI_TENSOR(float)
SKA_SIMT_MULTI_TENSOR(__nv_bfloat16)
#undef SKA_SIMT_MULTI_TENSOR
template void cast<float, __nv_bfloat16>(const List<float>&, List<__nv_bfloat16>&);
template void cast<__nv_bfloat16, float>(const List<__nv_bfloat16>&, List<float>&);

}  // namespace ska::simt::multi_tensor
