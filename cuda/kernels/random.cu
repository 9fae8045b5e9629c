// CUDA kernels: uniform, normal and Bernoulli draws from Philox4x32-10. Twins of
// backend/cpu/random.cpp: element i uses counter offset + i / 4, word i % 4, and the same float
// formulas, evaluated with explicitly rounded operations (no FMA contraction), so uniform and
// Bernoulli draws are bit-identical to the CPU's; normal draws go through logf/cosf/sinf, whose
// CUDA and glibc implementations may differ in the last bit.
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "backend/dropout_checks.h"
#include "backend/pointwise_math.h"
#include "core/random.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/vector_io.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per Philox counter (4 elements).
template <typename T>
__global__ void uniform_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                               const int64_t* __restrict__ offset_base, double lo, double span) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int k = 0; k < 4 && g * 4 + k < n; ++k) {
      // lo + (hi - lo) * u in double, as on the CPU.
      const double u = static_cast<double>(philox_uniform(r.w[k]));
      out[g * 4 + k] = from_float<T>(static_cast<float>(__dadd_rn(lo, __dmul_rn(span, u))));
    }
  }
}

template <typename T>
__global__ void normal_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                              const int64_t* __restrict__ offset_base, double mean, double std) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int pair = 0; pair < 2; ++pair) {
      const float u1 = __fsub_rn(1.0f, philox_uniform(r.w[2 * pair]));  // (0, 1]: finite log
      const float u2 = philox_uniform(r.w[2 * pair + 1]);
      const float radius = sqrtf(__fmul_rn(-2.0f, logf(u1)));
      const float angle = __fmul_rn(6.28318530717958647692f, u2);
      // mean + std * radius * cos(angle), left to right in double, as on the CPU.
      const double scaled = __dmul_rn(std, static_cast<double>(radius));
      const int64_t i = g * 4 + 2 * pair;
      if (i < n) {
        const double v = __dadd_rn(mean, __dmul_rn(scaled, static_cast<double>(cosf(angle))));
        out[i] = from_float<T>(static_cast<float>(v));
      }
      if (i + 1 < n) {
        const double v = __dadd_rn(mean, __dmul_rn(scaled, static_cast<double>(sinf(angle))));
        out[i + 1] = from_float<T>(static_cast<float>(v));
      }
    }
  }
}

template <typename T>
__global__ void bernoulli_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                                 const int64_t* __restrict__ offset_base, float keep,
                                 float scale) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t groups = (n + 3) / 4;
  const T s = from_float<T>(scale), zero = from_float<T>(0.0f);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int k = 0; k < 4 && g * 4 + k < n; ++k) out[g * 4 + k] = philox_uniform(r.w[k]) < keep ? s : zero;
  }
}

// out = x * (draw < keep ? scale : 0), scale rounded to T as random_bernoulli's mask holds it.
template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n,
                               uint64_t seed, uint64_t offset,
                               const int64_t* __restrict__ offset_base, float keep, float scale) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t groups = (n + 3) / 4;
  const float s = to_float(from_float<T>(scale));
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int k = 0; k < 4 && g * 4 + k < n; ++k) {
      const int64_t i = g * 4 + k;
      out[i] = from_float<T>(__fmul_rn(to_float(x[i]), philox_uniform(r.w[k]) < keep ? s : 0.0f));
    }
  }
}

// What the dropout kernels apply before dropping (forward) and after (backward): nothing, for
// dropout itself...
struct NoActivation {
  static constexpr bool kReadsX = false;  // whether there is a backward, at the activation's input
  __device__ float forward(float v) const { return v; }
};

// ... or a unary activation, computed as the unary kernels compute it (pointwise.cu's UnaryBody
// and UnaryBackwardBody) and rounded to T where they store it: the same bits as the two kernels.
template <UnaryOp OP, typename T>
struct UnaryActivation {
  static constexpr bool kReadsX = true;
  float a, b;
  __device__ float forward(float v) const {
    return to_float(from_float<T>(pm::unary_forward<OP, float>(v, a, b)));
  }
  // g: the dropped gradient, already rounded to T.
  __device__ float backward(float g, float x) const {
    return g * pm::unary_derivative<OP, float>(x, a, b);
  }
};

// dropout_kernel with the mask kept as bits: a thread per byte of `bits`, that is per 8 elements
// (counters offset + 2j and offset + 2j + 1), loaded and stored 16 bytes at a time where the
// pointers allow (`vectors`) and the 8 elements are all there. `act` is applied to x first.
template <typename T, typename Act = NoActivation>
__global__ void dropout_forward_kernel(const T* __restrict__ x, T* __restrict__ out,
                                       uint8_t* __restrict__ bits, int64_t n, uint64_t seed,
                                       uint64_t offset, const int64_t* __restrict__ offset_base,
                                       float keep, float scale, bool vectors, Act act = {}) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t bytes = (n + 7) / 8;
  const float s = to_float(from_float<T>(scale));
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = 8 * j;
    const PhiloxOut r0 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j));
    const PhiloxOut r1 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j + 1));
    uint32_t byte = 0;
    if (i0 + 8 <= n) {
      float v[8];
      load8(x + i0, v, vectors);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool kept = philox_uniform(k < 4 ? r0.w[k] : r1.w[k - 4]) < keep;
        v[k] = __fmul_rn(act.forward(v[k]), kept ? s : 0.0f);
        byte |= static_cast<uint32_t>(kept) << k;
      }
      store8(out + i0, v, vectors);
    } else {
      for (int k = 0; i0 + k < n; ++k) {
        const bool kept = philox_uniform(k < 4 ? r0.w[k] : r1.w[k - 4]) < keep;
        out[i0 + k] = from_float<T>(__fmul_rn(act.forward(to_float(x[i0 + k])), kept ? s : 0.0f));
        byte |= static_cast<uint32_t>(kept) << k;
      }
    }
    bits[j] = static_cast<uint8_t>(byte);
  }
}

// out = x + dropout(y) (TX: x's and out's dtype; TY: y's, TX or 16-bit with f32), the mask kept
// as bits: dropout_forward_kernel's pass over y, each dropped value rounded to TY as dropout's
// output holds it, then added to x as the binary add kernel adds (one f32 add, rounded to TX).
template <typename TX, typename TY>
__global__ void dropout_add_forward_kernel(const TX* __restrict__ x, const TY* __restrict__ y,
                                           TX* __restrict__ out, uint8_t* __restrict__ bits,
                                           int64_t n, uint64_t seed, uint64_t offset,
                                           const int64_t* __restrict__ offset_base, float keep,
                                           float scale, bool vectors) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t bytes = (n + 7) / 8;
  const float s = to_float(from_float<TY>(scale));
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = 8 * j;
    const PhiloxOut r0 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j));
    const PhiloxOut r1 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j + 1));
    const auto sum = [&](float xv, float yv, int k, uint32_t& byte) {
      const bool kept = philox_uniform(k < 4 ? r0.w[k] : r1.w[k - 4]) < keep;
      byte |= static_cast<uint32_t>(kept) << k;
      return __fadd_rn(xv, to_float(from_float<TY>(__fmul_rn(yv, kept ? s : 0.0f))));
    };
    uint32_t byte = 0;
    if (i0 + 8 <= n) {
      float xv[8], yv[8];
      load8(x + i0, xv, vectors);
      load8(y + i0, yv, vectors);
#pragma unroll
      for (int k = 0; k < 8; ++k) xv[k] = sum(xv[k], yv[k], k, byte);
      store8(out + i0, xv, vectors);
    } else {
      for (int k = 0; i0 + k < n; ++k)
        out[i0 + k] = from_float<TX>(sum(to_float(x[i0 + k]), to_float(y[i0 + k]), k, byte));
    }
    bits[j] = static_cast<uint8_t>(byte);
  }
}

// grad_x = grad * (bit ? scale : 0): a thread per byte of `bits`, as dropout_forward_kernel;
// with an activation, that rounded to T and then through act.backward at x (the activation's
// input; null without one).
// A gradient of a wider dtype TG (f32 for a 16-bit T: dropout_add's) is rounded to T first.
template <typename T, typename Act = NoActivation, typename TG = T>
__global__ void dropout_backward_kernel(const TG* __restrict__ grad,
                                        const uint8_t* __restrict__ bits, T* __restrict__ grad_x,
                                        int64_t n, float scale, bool vectors,
                                        const T* __restrict__ x = nullptr, Act act = {}) {
  const int64_t bytes = (n + 7) / 8;
  const float s = to_float(from_float<T>(scale));
  // g as the T tensor of a cast would hold it (nothing to do when TG is T).
  const auto narrow = [](float g) {
    if constexpr (std::is_same_v<TG, T>) {
      return g;
    } else {
      return to_float(from_float<T>(g));
    }
  };
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = 8 * j;
    const uint32_t byte = bits[j];
    if (i0 + 8 <= n) {
      float v[8];
      load8(grad + i0, v, vectors);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(narrow(v[k]), (byte >> k) & 1 ? s : 0.0f);
      if constexpr (Act::kReadsX) {
        float xv[8];
        load8(x + i0, xv, vectors);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = act.backward(to_float(from_float<T>(v[k])), xv[k]);
      }
      store8(grad_x + i0, v, vectors);
    } else {
      for (int k = 0; i0 + k < n; ++k) {
        float g = __fmul_rn(narrow(to_float(grad[i0 + k])), (byte >> k) & 1 ? s : 0.0f);
        if constexpr (Act::kReadsX)
          g = act.backward(to_float(from_float<T>(g)), to_float(x[i0 + k]));
        grad_x[i0 + k] = from_float<T>(g);
      }
    }
  }
}

// The bit-mask kernels' launches on raw operands (a thread per byte of the mask: 8 elements).
inline dim3 per_byte_grid(int64_t n) { return dim3(grid_for((n + 7) / 8, kThreads)); }

// out = dropout(act(x)) with the mask into bits: dropout_forward_kernel.
template <typename T, typename Act>
void launch_bits_forward(const T* x, T* out, uint8_t* bits, int64_t n, uint64_t seed,
                         uint64_t offset, const int64_t* offset_base, float keep, float scale,
                         bool vectors, Act act, cudaStream_t stream) {
  launch_kernel(dropout_forward_kernel<T, Act>, per_byte_grid(n), dim3(kThreads), 0, stream, x, out,
                bits, n, seed, offset, offset_base, keep, scale, vectors, act);
}

// grad_x from grad through the mask (and act's derivative at x, null without one):
// dropout_backward_kernel.
template <typename T, typename Act, typename TG>
void launch_bits_backward(const TG* grad, const uint8_t* bits, T* grad_x, int64_t n, float scale,
                          bool vectors, const T* x, Act act, cudaStream_t stream) {
  launch_kernel(dropout_backward_kernel<T, Act, TG>, per_byte_grid(n), dim3(kThreads), 0, stream,
                grad, bits, grad_x, n, scale, vectors, x, act);
}

// out = x + dropout(y) with the mask into bits: dropout_add_forward_kernel.
template <typename TX, typename TY>
void launch_bits_add_forward(const TX* x, const TY* y, TX* out, uint8_t* bits, int64_t n,
                             uint64_t seed, uint64_t offset, const int64_t* offset_base, float keep,
                             float scale, bool vectors, cudaStream_t stream) {
  launch_kernel(dropout_add_forward_kernel<TX, TY>, per_byte_grid(n), dim3(kThreads), 0, stream, x,
                y, out, bits, n, seed, offset, offset_base, keep, scale, vectors);
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// Launches kernel(out, n, ...) over the counters of contiguous `out`, for its floating dtype.
template <typename Launch>
void launch_random(const Tensor& out, const char* name, Launch&& launch) {
  SKA_CHECK(out.is_contiguous(), ValueError, "cuda ", name, ": output must be contiguous, got ",
            out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(device_index(out));
  const cudaStream_t stream = current_stream(device_index(out));
  const unsigned grid = grid_for((n + 3) / 4, kThreads);
  dispatch_floating(out.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    launch(static_cast<T*>(out.data_ptr()), n, grid, stream);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

namespace {
// The device pointer of a capture's offset base (null when undefined), checked.
const int64_t* offset_base_ptr(const Tensor& offset_base, const Tensor& out, const char* kernel) {
  if (!offset_base.defined()) return nullptr;
  SKA_CHECK(offset_base.numel() == 1 && offset_base.dtype() == DType::kI64 &&
                offset_base.device() == out.device(),
            DTypeError, "cuda ", kernel, ": offset_base must be one i64 element on ", out.device(),
            ", got ", offset_base.str());
  return static_cast<const int64_t*>(offset_base.data_ptr());
}
}  // namespace

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                    const Tensor& offset_base) {
  const int64_t* base = offset_base_ptr(offset_base, out, "random_uniform");
  launch_random(out, "random_uniform", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    launch_kernel(uniform_kernel<T>, dim3(grid), dim3(kThreads), 0, s, p, n, seed, offset, base, lo,
                  hi - lo);
  });
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                   const Tensor& offset_base) {
  const int64_t* base = offset_base_ptr(offset_base, out, "random_normal");
  launch_random(out, "random_normal", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    launch_kernel(normal_kernel<T>, dim3(grid), dim3(kThreads), 0, s, p, n, seed, offset, base,
                  mean, std);
  });
}

void random_bernoulli(const Tensor& out, uint64_t seed, uint64_t offset, double keep_prob,
                      double scale, const Tensor& offset_base) {
  const int64_t* base = offset_base_ptr(offset_base, out, "random_bernoulli");
  launch_random(out, "random_bernoulli", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    launch_kernel(bernoulli_kernel<T>, dim3(grid), dim3(kThreads), 0, s, p, n, seed, offset, base,
                  static_cast<float>(keep_prob), static_cast<float>(scale));
  });
}

void dropout_apply(const Tensor& x, uint64_t seed, uint64_t offset, double keep_prob, double scale,
                   const Tensor& offset_base, const Tensor& out) {
  SKA_CHECK(x.is_contiguous() && x.dtype() == out.dtype() && x.numel() == out.numel(), ValueError,
            "cuda dropout_apply: x and out must be contiguous, of one dtype and size");
  const int64_t* base = offset_base_ptr(offset_base, out, "dropout_apply");
  const void* xp = x.data_ptr();
  launch_random(out, "dropout_apply", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    launch_kernel(dropout_kernel<T>, dim3(grid), dim3(kThreads), 0, s, static_cast<const T*>(xp), p,
                  n, seed, offset, base, static_cast<float>(keep_prob), static_cast<float>(scale));
  });
}

namespace {

void check_dropout(const char* kernel, const Tensor& x, const Tensor& out, const Tensor& bits) {
  SKA_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype() &&
                x.numel() == out.numel() && x.device() == out.device(),
            ValueError, "cuda ", kernel,
            ": input and output must be contiguous, of one dtype, size and device, got ", x.str(),
            " and ", out.str());
  SKA_CHECK(bits.dtype() == DType::kU8 && bits.is_contiguous() &&
                bits.numel() == (x.numel() + 7) / 8 && bits.device() == x.device(),
            ValueError, "cuda ", kernel, ": bits must be ", (x.numel() + 7) / 8,
            " contiguous u8 bytes on ", x.device(), ", got ", bits.str());
}

// Whether both pointers allow 16-byte accesses at every 8-element group.
bool vectors_fit(const Tensor& a, const Tensor& b) {
  const auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  return aligned(a) && aligned(b);
}

// Calls launch(tag, n, stream) for a kernel with a thread per byte of a bit mask over `like`'s n
// elements (T of `like`'s floating dtype), on its device's current stream.
template <typename Launch>
void launch_per_byte(const Tensor& like, const char* name, Launch&& launch) {
  const int64_t n = like.numel();
  if (n == 0) return;
  const int device = device_index(like);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_floating(like.dtype(), name, [&](auto tag) { launch(tag, n, stream); });
}

// dropout_forward_kernel over x with the activation make_act(T{}) applied first.
template <typename MakeAct>
void launch_dropout_forward(const char* kernel, const Tensor& x, uint64_t seed, uint64_t offset,
                            double keep_prob, double scale, const Tensor& offset_base,
                            const Tensor& out, const Tensor& bits, MakeAct&& make_act) {
  check_dropout(kernel, x, out, bits);
  const int64_t* base = offset_base_ptr(offset_base, out, kernel);
  const bool vectors = vectors_fit(x, out);
  launch_per_byte(x, kernel, [&](auto tag, int64_t n, cudaStream_t s) {
    using T = decltype(tag);
    launch_bits_forward(static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()),
                        static_cast<uint8_t*>(bits.data_ptr()), n, seed, offset, base,
                        static_cast<float>(keep_prob), static_cast<float>(scale), vectors,
                        make_act(tag), s);
  });
}

// dropout_backward_kernel over grad, then the activation make_act(T{}) at x where it has one
// (x undefined for dropout itself).
template <typename MakeAct>
void launch_dropout_backward(const char* kernel, const Tensor& grad, const Tensor& bits,
                             double scale, const Tensor& x, const Tensor& grad_x,
                             MakeAct&& make_act) {
  check_dropout(kernel, grad, grad_x, bits);
  if (x.defined()) check_dropout(kernel, x, grad_x, bits);
  const bool vectors = vectors_fit(grad, grad_x) && (!x.defined() || vectors_fit(x, x));
  launch_per_byte(grad, kernel, [&](auto tag, int64_t n, cudaStream_t s) {
    using T = decltype(tag);
    launch_bits_backward(static_cast<const T*>(grad.data_ptr()),
                         static_cast<const uint8_t*>(bits.data_ptr()),
                         static_cast<T*>(grad_x.data_ptr()), n, static_cast<float>(scale), vectors,
                         data_or_null<T>(x), make_act(tag), s);
  });
}

// Calls f(std::integral_constant<UnaryOp, op>) for an activation the fused dropout kernels take.
template <typename F>
void visit_dropout_activation(UnaryOp op, const char* kernel, F&& f) {
  switch (op) {
    case UnaryOp::kGelu:
      return f(std::integral_constant<UnaryOp, UnaryOp::kGelu>{});
    case UnaryOp::kGeluTanh:
      return f(std::integral_constant<UnaryOp, UnaryOp::kGeluTanh>{});
    case UnaryOp::kQuickGelu:
      return f(std::integral_constant<UnaryOp, UnaryOp::kQuickGelu>{});
    case UnaryOp::kRelu:
      return f(std::integral_constant<UnaryOp, UnaryOp::kRelu>{});
    case UnaryOp::kSilu:
      return f(std::integral_constant<UnaryOp, UnaryOp::kSilu>{});
    default:
      SKA_CHECK(false, ValueError, "cuda ", kernel, ": ", unary_op_name(op),
                " is not an activation it fuses (gelu, gelu_tanh, quick_gelu, relu, silu)");
  }
}

}  // namespace

void dropout_forward(const Tensor& x, uint64_t seed, uint64_t offset, double keep_prob,
                     double scale, const Tensor& offset_base, const Tensor& out,
                     const Tensor& bits) {
  launch_dropout_forward("dropout_forward", x, seed, offset, keep_prob, scale, offset_base, out,
                         bits, [](auto) { return NoActivation{}; });
}

void dropout_backward(const Tensor& grad, const Tensor& bits, double scale, const Tensor& grad_x) {
  launch_dropout_backward("dropout_backward", grad, bits, scale, Tensor(), grad_x,
                          [](auto) { return NoActivation{}; });
}

void unary_dropout_forward(UnaryOp op, const Tensor& x, double a, double b, uint64_t seed,
                           uint64_t offset, double keep_prob, double scale,
                           const Tensor& offset_base, const Tensor& out, const Tensor& bits) {
  visit_dropout_activation(op, "unary_dropout_forward", [&](auto op_c) {
    launch_dropout_forward("unary_dropout_forward", x, seed, offset, keep_prob, scale, offset_base,
                           out, bits, [&](auto tag) {
                             return UnaryActivation<decltype(op_c)::value, decltype(tag)>{
                                 static_cast<float>(a), static_cast<float>(b)};
                           });
  });
}

void unary_dropout_backward(UnaryOp op, const Tensor& grad, const Tensor& bits, double scale,
                            const Tensor& x, double a, double b, const Tensor& grad_x) {
  SKA_CHECK(x.defined(), ValueError, "cuda unary_dropout_backward: x, the activation's input, ",
            "is required");
  visit_dropout_activation(op, "unary_dropout_backward", [&](auto op_c) {
    launch_dropout_backward("unary_dropout_backward", grad, bits, scale, x, grad_x, [&](auto tag) {
      return UnaryActivation<decltype(op_c)::value, decltype(tag)>{static_cast<float>(a),
                                                                   static_cast<float>(b)};
    });
  });
}

namespace {

// Calls f(TX{}, TY{}) for a wide dtype (x's, grad's) and a narrow one (y's, grad_y's): both f32,
// bf16 or f16, or f32 with bf16/f16 (the checks have ruled out the rest).
template <typename F>
void dispatch_dropout_add(DType wide, DType narrow, F&& f) {
  const auto of = [&](DType d, auto&& then) {
    if (d == DType::kBF16) return then(__nv_bfloat16{});
    if (d == DType::kF16) return then(__half{});
    return then(float{});
  };
  of(wide, [&](auto tx) {
    if (narrow == wide) return f(tx, tx);
    of(narrow, [&](auto ty) {
      if constexpr (std::is_same_v<decltype(tx), float>) f(tx, ty);
    });
  });
}

}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& y, uint64_t seed, uint64_t offset,
                         double keep_prob, double scale, const Tensor& offset_base,
                         const Tensor& out, const Tensor& bits) {
  const char* kKernel = "dropout_add_forward";
  check_dropout_add_forward(kKernel, x, y, out, bits);
  const int64_t* base = offset_base_ptr(offset_base, out, kKernel);
  const bool vectors = vectors_fit(x, out) && vectors_fit(y, y);
  const int64_t n = out.numel();
  if (n == 0) return;
  const int device = device_index(out);
  DeviceGuard guard(device);
  dispatch_dropout_add(x.dtype(), y.dtype(), [&](auto tx, auto ty) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    launch_bits_add_forward(static_cast<const TX*>(x.data_ptr()),
                            static_cast<const TY*>(y.data_ptr()), static_cast<TX*>(out.data_ptr()),
                            static_cast<uint8_t*>(bits.data_ptr()), n, seed, offset, base,
                            static_cast<float>(keep_prob), static_cast<float>(scale), vectors,
                            current_stream(device));
  });
}

void dropout_add_backward(const Tensor& grad, const Tensor& bits, double scale,
                          const Tensor& grad_y) {
  const char* kKernel = "dropout_add_backward";
  check_dropout_add_backward(kKernel, grad, bits, grad_y);
  const bool vectors = vectors_fit(grad, grad_y);
  const int64_t n = grad.numel();
  if (n == 0) return;
  const int device = device_index(grad);
  DeviceGuard guard(device);
  dispatch_dropout_add(grad.dtype(), grad_y.dtype(), [&](auto tg, auto ty) {
    using TG = decltype(tg);
    using TY = decltype(ty);
    launch_bits_backward(static_cast<const TG*>(grad.data_ptr()),
                         static_cast<const uint8_t*>(bits.data_ptr()),
                         static_cast<TY*>(grad_y.data_ptr()), n, static_cast<float>(scale), vectors,
                         static_cast<const TY*>(nullptr), NoActivation{}, current_stream(device));
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
