// CSKA's direct conv-logit kernels (cuda/kernels/conv_logits.cu) built by the host compiler and
// run by tests/simt: the entry points' launches (launch_forward, launch_backward) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/conv_logits.cu"
// clang-format on

#include "tests/simt/conv_logits_host.h"

#include <vector>

namespace ska::cuda {
namespace {
// The kernels' `extern __shared__ smem[]`: one block's dynamic shared memory at a time.
alignas(128) thread_local unsigned char smem[227 * 1024];
const bool registered = (simt::register_shared(smem, sizeof smem), true);
bool g_async_loads = true;
}  // namespace

namespace attn {
bool async_loads_enabled() { return g_async_loads; }
}  // namespace attn

}  // namespace ska::cuda

namespace ska::simt::conv_logits {

template <typename T>
void forward(const ConvLogitsGeometry& geo, const T* q, Strides qs, const T* w, const T* bias,
             T* logits, Strides ls) {
  SKA_CHECK(conv_logits_direct_fits(geo.d, geo.width, geo.kernel), ShapeError,
            "simt conv_logits: a problem the kernels do not take");
  auto a = cuda::args_of<T>(geo, q, qs.b, qs.h, qs.p, w);
  a.bias = bias;
  a.out = logits;
  a.ob = ls.b;
  a.oh = ls.h;
  a.op = ls.p;
  // conv_logits_even_layout: the base and the strides of the dims longer than one even.
  a.pairs = reinterpret_cast<uintptr_t>(logits) % 4 == 0 && (geo.batch == 1 || ls.b % 2 == 0) &&
            (geo.heads == 1 || ls.h % 2 == 0) && (geo.height * geo.width == 1 || ls.p % 2 == 0);
  cuda::launch_forward(a, nullptr);
}

template <typename T>
void backward(const ConvLogitsGeometry& geo, const T* grad, Strides gs, const T* q, Strides qs,
              const T* w, T* grad_q, Strides gqs, T* grad_w, T* grad_bias) {
  SKA_CHECK(conv_logits_direct_fits(geo.d, geo.width, geo.kernel), ShapeError,
            "simt conv_logits: a problem the kernels do not take");
  auto a = cuda::args_of<T>(geo, q, qs.b, qs.h, qs.p, w);
  a.g = grad;
  a.gb = gs.b;
  a.gh = gs.h;
  a.gp = gs.p;
  std::vector<float> partials(cuda::partial_floats(geo, grad_w != nullptr, grad_bias != nullptr) +
                              1);
  cuda::launch_backward(a, geo, cuda::GradQ<T>{grad_q, gqs.b, gqs.h, gqs.p}, grad_w, grad_bias,
                        partials.data(), nullptr);
}

void set_async_loads(bool enabled) { cuda::g_async_loads = enabled; }

template void forward<__nv_bfloat16>(const ConvLogitsGeometry&, const __nv_bfloat16*, Strides,
                                     const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                     Strides);
template void forward<__half>(const ConvLogitsGeometry&, const __half*, Strides, const __half*,
                              const __half*, __half*, Strides);
template void backward<__nv_bfloat16>(const ConvLogitsGeometry&, const __nv_bfloat16*, Strides,
                                      const __nv_bfloat16*, Strides, const __nv_bfloat16*,
                                      __nv_bfloat16*, Strides, __nv_bfloat16*, __nv_bfloat16*);
template void backward<__half>(const ConvLogitsGeometry&, const __half*, Strides, const __half*,
                               Strides, const __half*, __half*, Strides, __half*, __half*);

}  // namespace ska::simt::conv_logits
