// The elementwise kernels (cuda/kernels/pointwise.cu) built by the host compiler and run by
// tests/simt: launch_elementwise over the entry points' bodies, on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/pointwise.cu"
// clang-format on

#include "tests/simt/pointwise_host.h"

namespace ska::simt::pointwise {
namespace {

// Runs launch_elementwise<N> with the fast paths on or off, as set_cuda_elementwise_fast_paths.
template <size_t N, typename Body>
void launch(const Dims& shape, const std::array<Dims, N>& strides, const Body& body, bool fast) {
  const bool was = cuda::g_fast_paths.exchange(fast);
  cuda::launch_elementwise<N>(shape, strides, body, nullptr);
  cuda::g_fast_paths.store(was);
}

}  // namespace

template <typename A, typename B, typename O>
void add(const Dims& shape, O* out, const Dims& so, const A* a, const Dims& sa, const B* b,
         const Dims& sb, bool fast) {
  launch<3>(shape, {so, sa, sb}, cuda::BinaryBody<BinaryOp::kAdd, A, B, O>{out, a, b}, fast);
}

template <typename T>
void less(const Dims& shape, uint8_t* out, const Dims& so, const T* a, const Dims& sa, const T* b,
          const Dims& sb, bool fast) {
  launch<3>(shape, {so, sa, sb}, cuda::BinaryBody<BinaryOp::kLt, T, T, uint8_t>{out, a, b}, fast);
}

template <typename T>
void gelu(const Dims& shape, T* y, const Dims& sy, const T* x, const Dims& sx, bool fast) {
  launch<2>(shape, {sy, sx}, cuda::UnaryBody<UnaryOp::kGelu, T>{y, x, 0.0f, 0.0f}, fast);
}

template <typename T>
void gelu_backward(int64_t n, T* dx, const T* g, const T* x, bool fast) {
  launch<3>({n}, {Dims{1}, Dims{1}, Dims{1}},
            cuda::UnaryBackwardBody<UnaryOp::kGelu, T>{dx, g, x, 0.0f, 0.0f}, fast);
}

template <typename S, typename D>
void copy(const Dims& shape, D* d, const Dims& sd, const S* s, const Dims& ss, bool fast) {
  launch<2>(shape, {sd, ss}, cuda::CopyBody<S, D>{d, s}, fast);
}

template <typename T>
void fill(const Dims& shape, T* d, const Dims& sd, double value, bool fast) {
  launch<1>(shape, {sd}, cuda::FillBody<T>{d, value}, fast);
}

template <typename T>
void where(const Dims& shape, T* out, const Dims& so, const uint8_t* c, const Dims& sc, const T* a,
           const Dims& sa, const T* b, const Dims& sb, bool fast) {
  launch<4>(shape, {so, sc, sa, sb}, cuda::WhereBody<T>{out, c, a, b}, fast);
}

using bf16 = __nv_bfloat16;
template void add<float, float, float>(const Dims&, float*, const Dims&, const float*, const Dims&,
                                       const float*, const Dims&, bool);
template void add<bf16, bf16, bf16>(const Dims&, bf16*, const Dims&, const bf16*, const Dims&,
                                    const bf16*, const Dims&, bool);
template void add<float, bf16, float>(const Dims&, float*, const Dims&, const float*, const Dims&,
                                      const bf16*, const Dims&, bool);
template void less<float>(const Dims&, uint8_t*, const Dims&, const float*, const Dims&,
                          const float*, const Dims&, bool);
template void gelu<float>(const Dims&, float*, const Dims&, const float*, const Dims&, bool);
template void gelu<bf16>(const Dims&, bf16*, const Dims&, const bf16*, const Dims&, bool);
template void gelu_backward<float>(int64_t, float*, const float*, const float*, bool);
template void gelu_backward<bf16>(int64_t, bf16*, const bf16*, const bf16*, bool);
template void copy<float, bf16>(const Dims&, bf16*, const Dims&, const float*, const Dims&, bool);
template void copy<bf16, float>(const Dims&, float*, const Dims&, const bf16*, const Dims&, bool);
template void copy<float, float>(const Dims&, float*, const Dims&, const float*, const Dims&, bool);
template void fill<bf16>(const Dims&, bf16*, const Dims&, double, bool);
template void fill<float>(const Dims&, float*, const Dims&, double, bool);
template void where<float>(const Dims&, float*, const Dims&, const uint8_t*, const Dims&,
                           const float*, const Dims&, const float*, const Dims&, bool);

}  // namespace ska::simt::pointwise
