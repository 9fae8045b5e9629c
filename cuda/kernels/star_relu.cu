// CUDA kernels: StarReLU (scale * relu(x)^2 + bias) in one pass forward, and one pass backward
// that also leaves per-block partial sums of the parameter gradients, summed by a second kernel
// in a fixed order (no atomics: the same bits on every run). Twins of backend/cpu/star_relu.cpp.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinishThreads = 256;

template <typename X, typename P, typename Y>
__global__ void star_relu_forward_kernel(const X* __restrict__ x, const P* scale, const P* bias,
                                         Y* __restrict__ y, int64_t n) {
  const float s = to_float(*scale), b = to_float(*bias);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float r = fmaxf(to_float(x[i]), 0.0f);
    y[i] = from_float<Y>(s * (r * r) + b);
  }
}

// Block k covers elements [k * chunk, (k + 1) * chunk): writes grad_x there and its partial sums
// of grad_y * relu(x)^2 and grad_y.
template <typename X, typename P, typename G>
__global__ void star_relu_backward_kernel(const G* __restrict__ gy, const X* __restrict__ x,
                                          const P* scale, X* __restrict__ gx, float* part_s,
                                          float* part_b, int64_t n, int64_t chunk) {
  const float twice_s = 2.0f * to_float(*scale);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min(n, begin + chunk);
  float acc_s = 0.0f, acc_b = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = to_float(gy[i]), r = fmaxf(to_float(x[i]), 0.0f);
    gx[i] = from_float<X>(g * twice_s * r);
    acc_s += g * (r * r);
    acc_b += g;
  }
  acc_s = block_sum(acc_s);
  acc_b = block_sum(acc_b);
  if (threadIdx.x == 0) {
    part_s[blockIdx.x] = acc_s;
    part_b[blockIdx.x] = acc_b;
  }
}

template <typename P>
__global__ void star_relu_finish_kernel(const float* part_s, const float* part_b, int parts,
                                        P* grad_scale, P* grad_bias) {
  float s = 0.0f, b = 0.0f;
  for (int k = threadIdx.x; k < parts; k += blockDim.x) {
    s += part_s[k];
    b += part_b[k];
  }
  s = block_sum(s);
  b = block_sum(b);
  if (threadIdx.x == 0) {
    if (grad_scale) *grad_scale = from_float<P>(s);
    if (grad_bias) *grad_bias = from_float<P>(b);
  }
}

// Calls f(X{}, P{}) for x's and the parameters' element types: one floating dtype, or f32 with
// bf16/f16 either way round (a 16-bit x with f32 parameters under autocast).
template <typename F>
void dispatch_star_relu(DType x, DType p, const char* kernel, F&& f) {
  if (x == p) {
    dispatch_floating(x, kernel, [&](auto t) { f(t, t); });
    return;
  }
  const auto is_16bit = [](DType d) { return d == DType::kBF16 || d == DType::kF16; };
  SKA_CHECK((p == DType::kF32 && is_16bit(x)) || (x == DType::kF32 && is_16bit(p)), DTypeError,
            kernel, ": x of dtype ", dtype_name(x), " with parameters of dtype ", dtype_name(p),
            " (mixed only as f32 with bf16 or f16)");
  if (p == DType::kF32) {
    dispatch_floating(x, kernel, [&](auto t) { f(t, float{}); });
  } else {
    dispatch_floating(p, kernel, [&](auto t) { f(float{}, t); });
  }
}

// The wider of X and P: the output's element type.
template <typename X, typename P>
using Wider = std::conditional_t<(sizeof(P) > sizeof(X)), P, X>;

}  // namespace

void star_relu_forward(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& y) {
  constexpr const char* kKernel = "star_relu_forward";
  SKA_CHECK(x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(), ValueError, kKernel,
            ": x and y must be contiguous with one shape");
  SKA_CHECK(scale.dtype() == bias.dtype(), DTypeError, kKernel, ": scale and bias dtypes differ");
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(device_index(x));
  const cudaStream_t stream = current_stream(device_index(x));
  dispatch_star_relu(x.dtype(), scale.dtype(), kKernel, [&](auto x_tag, auto p_tag) {
    using X = decltype(x_tag);
    using P = decltype(p_tag);
    const DType wide = sizeof(P) > sizeof(X) ? scale.dtype() : x.dtype();
    SKA_CHECK(y.dtype() == wide || y.dtype() == x.dtype(), DTypeError, kKernel,
              ": y must have the wider of x's and scale's dtypes or x's, got ",
              dtype_name(y.dtype()));
    const auto launch = [&](auto y_tag) {
      using Y = decltype(y_tag);
      star_relu_forward_kernel<X, P, Y><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const X*>(x.data_ptr()), static_cast<const P*>(scale.data_ptr()),
          static_cast<const P*>(bias.data_ptr()), static_cast<Y*>(y.data_ptr()), n);
      SKA_CUDA_CHECK_LAUNCH();
    };
    if (y.dtype() == wide) {
      launch(Wider<X, P>{});
    } else {
      launch(X{});
    }
  });
}

void star_relu_backward(const Tensor& grad_y, const Tensor& x, const Tensor& scale,
                        const Tensor& grad_x, const Tensor& grad_scale, const Tensor& grad_bias) {
  constexpr const char* kKernel = "star_relu_backward";
  SKA_CHECK(grad_y.is_contiguous() && x.is_contiguous() && grad_x.is_contiguous(), ValueError,
            kKernel, ": operands must be contiguous");
  const int64_t n = x.numel();
  const int device = device_index(x);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  // Blocks of at least 8 elements per thread, up to 4 per multiprocessor.
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads * 8 - 1) / (kThreads * 8), 4 * sm_count(device)));
  const int64_t chunk = std::max<int64_t>(1, (n + blocks - 1) / blocks);
  Tensor partials = Tensor::empty({2 * blocks}, DType::kF32, x.device());
  float* part_s = partials.data<float>();
  float* part_b = part_s + blocks;
  dispatch_star_relu(x.dtype(), scale.dtype(), kKernel, [&](auto x_tag, auto p_tag) {
    using X = decltype(x_tag);
    using P = decltype(p_tag);
    const DType wide = sizeof(P) > sizeof(X) ? scale.dtype() : x.dtype();
    SKA_CHECK((grad_y.dtype() == wide || grad_y.dtype() == x.dtype()) &&
                  grad_x.dtype() == x.dtype() &&
                  (!grad_scale.defined() || grad_scale.dtype() == scale.dtype()) &&
                  (!grad_bias.defined() || grad_bias.dtype() == scale.dtype()),
              DTypeError, kKernel,
              ": grad_y must have y's dtype (the wider of x's and scale's, "
              "or x's), grad_x x's, the parameter gradients the parameters'");
    const auto launch = [&](auto g_tag) {
      using G = decltype(g_tag);
      star_relu_backward_kernel<X, P, G><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<const G*>(grad_y.data_ptr()), static_cast<const X*>(x.data_ptr()),
          static_cast<const P*>(scale.data_ptr()), static_cast<X*>(grad_x.data_ptr()), part_s,
          part_b, n, chunk);
      SKA_CUDA_CHECK_LAUNCH();
    };
    if (grad_y.dtype() == wide) {
      launch(Wider<X, P>{});
    } else {
      launch(X{});
    }
    if (!grad_scale.defined() && !grad_bias.defined()) return;
    star_relu_finish_kernel<P><<<1, kFinishThreads, 0, stream>>>(
        part_s, part_b, static_cast<int>(blocks),
        grad_scale.defined() ? static_cast<P*>(grad_scale.data_ptr()) : nullptr,
        grad_bias.defined() ? static_cast<P*>(grad_bias.data_ptr()) : nullptr);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ska::cuda
