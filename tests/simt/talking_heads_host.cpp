// CaiT's talking-heads softmax kernels (cuda/kernels/talking_heads.cu) built by the host compiler
// and run by tests/simt: the entry points' launches (launch_forward, launch_backward) on host
// memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/talking_heads.cu"
// clang-format on

#include "tests/simt/talking_heads_host.h"

#include <vector>

namespace ska::simt::talking_heads {

template <typename T>
void forward(const TalkingHeadsGeometry& geo, const T* logits, float scale, const float* w_pre,
             const float* w_post, T* out, float* lse) {
  cuda::check_supported("simt talking_heads forward", geo);
  cuda::launch_forward(geo, logits, scale, w_pre, w_post, out, lse, nullptr);
}

template <typename T>
void backward(const TalkingHeadsGeometry& geo, const T* grad_out, const T* logits, float scale,
              const float* w_pre, const float* w_post, const float* lse, T* grad_logits,
              float* grad_pre, float* grad_post) {
  cuda::check_supported("simt talking_heads backward", geo);
  std::vector<float> part(cuda::backward_partial_floats(geo));
  cuda::launch_backward(geo, grad_out, logits, scale, w_pre, w_post, lse, grad_logits, grad_pre,
                        grad_post, part.data(), nullptr);
}

#define SKA_SIMT_TALKING_HEADS(T)                                                                 \
  template void forward<T>(const TalkingHeadsGeometry&, const T*, float, const float*,            \
                           const float*, T*, float*);                                             \
  template void backward<T>(const TalkingHeadsGeometry&, const T*, const T*, float, const float*, \
                            const float*, const float*, T*, float*, float*);
SKA_SIMT_TALKING_HEADS(float)
SKA_SIMT_TALKING_HEADS(__nv_bfloat16)
SKA_SIMT_TALKING_HEADS(__half)
#undef SKA_SIMT_TALKING_HEADS

}  // namespace ska::simt::talking_heads
