// CUDA kernels: StarReLU (scale * relu(x)^2 + bias) in one pass forward, and one pass backward
// that also leaves per-block partial sums of the parameter gradients, summed by a second kernel
// in a fixed order (no atomics: the same bits on every run). Twins of backend/cpu/star_relu.cpp.
// A thread takes 8 neighbouring elements at a time, by 16-byte loads and stores where the
// pointers allow. The launches take raw operands (launch_forward, launch_backward), so that
// tests/simt runs this file's own code on the host; the tensor entry points are left out there.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/vector_io.cuh"

namespace ska::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinishThreads = 256;
constexpr int kGroup = 8;  // elements a thread takes at a time

template <typename X, typename P, typename Y>
__global__ void star_relu_forward_kernel(const X* __restrict__ x, const P* scale, const P* bias,
                                         Y* __restrict__ y, int64_t n, bool vectors) {
  const float s = to_float(*scale), b = to_float(*bias);
  const auto out = [&](float v) {
    const float r = fmaxf(v, 0.0f);
    return s * (r * r) + b;
  };
  const int64_t groups = (n + kGroup - 1) / kGroup;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = g * kGroup;
    if (i0 + kGroup <= n) {
      float v[kGroup];
      load8(x + i0, v, vectors);
#pragma unroll
      for (int k = 0; k < kGroup; ++k) v[k] = out(v[k]);
      store8(y + i0, v, vectors);
    } else {
      for (int64_t i = i0; i < n; ++i) y[i] = from_float<Y>(out(to_float(x[i])));
    }
  }
}

// Block k covers elements [k * chunk, (k + 1) * chunk) (chunk a multiple of kGroup): writes
// grad_x there and its partial sums of grad_y * relu(x)^2 and grad_y.
template <typename X, typename P, typename G>
__global__ void star_relu_backward_kernel(const G* __restrict__ gy, const X* __restrict__ x,
                                          const P* scale, X* __restrict__ gx, float* part_s,
                                          float* part_b, int64_t n, int64_t chunk, bool vectors) {
  const float twice_s = 2.0f * to_float(*scale);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = std::min(n, begin + chunk);
  float acc_s = 0.0f, acc_b = 0.0f;
  const auto step = [&](float g, float xv) {
    const float r = fmaxf(xv, 0.0f);
    acc_s += g * (r * r);
    acc_b += g;
    return g * twice_s * r;
  };
  for (int64_t i0 = begin + static_cast<int64_t>(threadIdx.x) * kGroup; i0 < end;
       i0 += static_cast<int64_t>(blockDim.x) * kGroup) {
    if (i0 + kGroup <= end) {
      float g[kGroup], xv[kGroup];
      load8(gy + i0, g, vectors);
      load8(x + i0, xv, vectors);
#pragma unroll
      for (int k = 0; k < kGroup; ++k) g[k] = step(g[k], xv[k]);
      store8(gx + i0, g, vectors);
    } else {
      for (int64_t i = i0; i < end; ++i)
        gx[i] = from_float<X>(step(to_float(gy[i]), to_float(x[i])));
    }
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

// Whether pointers allow 16-byte accesses at every group of 8 elements.
inline bool vectors_at(const void* a, const void* b, const void* c = nullptr) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(a) && aligned(b) && (c == nullptr || aligned(c));
}

// y = scale * relu(x)^2 + bias over n elements.
template <typename X, typename P, typename Y>
void launch_forward(const X* x, const P* scale, const P* bias, Y* y, int64_t n,
                    cudaStream_t stream) {
  launch_kernel(star_relu_forward_kernel<X, P, Y>,
                dim3(grid_for((n + kGroup - 1) / kGroup, kThreads)), dim3(kThreads), 0, stream, x,
                scale, bias, y, n, vectors_at(x, y));
}

// The backward's blocks on a GPU of `sms` multiprocessors: at least 8 groups of 8 elements a
// thread, up to 4 blocks an SM; and each block's elements (a multiple of kGroup).
int64_t backward_blocks(int64_t n, int64_t sms) {
  constexpr int64_t kPerBlock = int64_t{kThreads} * kGroup * 8;
  return std::max<int64_t>(1, std::min<int64_t>((n + kPerBlock - 1) / kPerBlock, 4 * sms));
}
int64_t backward_chunk(int64_t n, int64_t blocks) {
  const int64_t chunk = std::max<int64_t>(1, (n + blocks - 1) / blocks);
  return (chunk + kGroup - 1) / kGroup * kGroup;
}

// grad_x, and (either null: not wanted) grad_scale and grad_bias, from grad_y over n elements,
// with partials of 2 * backward_blocks(n, sms) floats.
template <typename X, typename P, typename G>
void launch_backward(const G* gy, const X* x, const P* scale, X* gx, P* grad_scale, P* grad_bias,
                     int64_t n, int64_t sms, float* partials, cudaStream_t stream) {
  const int64_t blocks = backward_blocks(n, sms);
  float* part_s = partials;
  float* part_b = partials + blocks;
  launch_kernel(star_relu_backward_kernel<X, P, G>, dim3(static_cast<unsigned>(blocks)),
                dim3(kThreads), 0, stream, gy, x, scale, gx, part_s, part_b, n,
                backward_chunk(n, blocks), vectors_at(gy, x, gx));
  if (grad_scale == nullptr && grad_bias == nullptr) return;
  launch_kernel(star_relu_finish_kernel<P>, dim3(1), dim3(kFinishThreads), 0, stream,
                static_cast<const float*>(part_s), static_cast<const float*>(part_b),
                static_cast<int>(blocks), grad_scale, grad_bias);
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

#if !defined(SKA_SIMT_KERNELS_ONLY)
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
      launch_forward(static_cast<const X*>(x.data_ptr()), static_cast<const P*>(scale.data_ptr()),
                     static_cast<const P*>(bias.data_ptr()), static_cast<Y*>(y.data_ptr()), n,
                     stream);
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
  const int64_t sms = sm_count(device);
  const Tensor partials = Tensor::empty({2 * backward_blocks(n, sms)}, DType::kF32, x.device());
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
      launch_backward(static_cast<const G*>(grad_y.data_ptr()), static_cast<const X*>(x.data_ptr()),
                      static_cast<const P*>(scale.data_ptr()), static_cast<X*>(grad_x.data_ptr()),
                      mutable_or_null<P>(grad_scale), mutable_or_null<P>(grad_bias), n, sms,
                      partials.data<float>(), stream);
    };
    if (grad_y.dtype() == wide) {
      launch(Wider<X, P>{});
    } else {
      launch(X{});
    }
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
