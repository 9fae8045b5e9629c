// The dropout kernels with a bit mask (cuda/kernels/random.cu) built by the host compiler and run
// by tests/simt: the entry points' launches (launch_bits_forward, launch_bits_backward,
// launch_bits_add_forward) on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/random.cu"
// clang-format on

#include "tests/simt/random_host.h"

namespace ska::simt::dropout {
namespace {

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
void forward(const T* x, T* out, int64_t n, const Dropout& d, bool gelu) {
  const bool vectors = aligned(x) && aligned(out);
  if (gelu) {
    cuda::launch_bits_forward(x, out, d.bits, n, d.seed, d.offset, d.offset_base, d.keep, d.scale,
                              vectors, cuda::UnaryActivation<UnaryOp::kGelu, T>{0.0f, 0.0f},
                              nullptr);
  } else {
    cuda::launch_bits_forward(x, out, d.bits, n, d.seed, d.offset, d.offset_base, d.keep, d.scale,
                              vectors, cuda::NoActivation{}, nullptr);
  }
}

template <typename T>
void backward(const T* grad, const uint8_t* bits, T* grad_x, int64_t n, float scale, const T* x) {
  const bool vectors = aligned(grad) && aligned(grad_x) && (x == nullptr || aligned(x));
  if (x != nullptr) {
    cuda::launch_bits_backward(grad, bits, grad_x, n, scale, vectors, x,
                               cuda::UnaryActivation<UnaryOp::kGelu, T>{0.0f, 0.0f}, nullptr);
  } else {
    cuda::launch_bits_backward(grad, bits, grad_x, n, scale, vectors, x, cuda::NoActivation{},
                               nullptr);
  }
}

template <typename TX, typename TY>
void add_forward(const TX* x, const TY* y, TX* out, int64_t n, const Dropout& d) {
  const bool vectors = aligned(x) && aligned(out) && aligned(y);
  cuda::launch_bits_add_forward(x, y, out, d.bits, n, d.seed, d.offset, d.offset_base, d.keep,
                                d.scale, vectors, nullptr);
}

template <typename TX, typename TY>
void add_backward(const TX* grad, const uint8_t* bits, TY* grad_y, int64_t n, float scale) {
  const bool vectors = aligned(grad) && aligned(grad_y);
  cuda::launch_bits_backward(grad, bits, grad_y, n, scale, vectors, static_cast<const TY*>(nullptr),
                             cuda::NoActivation{}, nullptr);
}

template void forward<float>(const float*, float*, int64_t, const Dropout&, bool);
template void forward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, const Dropout&,
                                     bool);
template void backward<float>(const float*, const uint8_t*, float*, int64_t, float, const float*);
template void backward<__nv_bfloat16>(const __nv_bfloat16*, const uint8_t*, __nv_bfloat16*, int64_t,
                                      float, const __nv_bfloat16*);
template void add_forward<float, float>(const float*, const float*, float*, int64_t,
                                        const Dropout&);
template void add_forward<float, __nv_bfloat16>(const float*, const __nv_bfloat16*, float*, int64_t,
                                                const Dropout&);
template void add_forward<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                        __nv_bfloat16*, int64_t, const Dropout&);
template void add_backward<float, float>(const float*, const uint8_t*, float*, int64_t, float);
template void add_backward<float, __nv_bfloat16>(const float*, const uint8_t*, __nv_bfloat16*,
                                                 int64_t, float);
template void add_backward<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, const uint8_t*,
                                                         __nv_bfloat16*, int64_t, float);

}  // namespace ska::simt::dropout
