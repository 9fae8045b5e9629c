// CUDA kernels: uniform, normal and Bernoulli draws from Philox4x32-10. Twins of
// backend/cpu/random.cpp: element i uses counter offset + i / 4, word i % 4, and the same float
// formulas, evaluated with explicitly rounded operations (no FMA contraction), so uniform and
// Bernoulli draws are bit-identical to the CPU's; normal draws go through logf/cosf/sinf, whose
// CUDA and glibc implementations may differ in the last bit.
#include <cstdint>

#include "backend/backend.h"
#include "core/random.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per Philox counter (4 elements).
template <typename T>
__global__ void uniform_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                               double lo, double span) {
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
                              double mean, double std) {
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

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  launch_random(out, "random_uniform", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    uniform_kernel<T><<<grid, kThreads, 0, s>>>(p, n, seed, offset, lo, hi - lo);
  });
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) {
  launch_random(out, "random_normal", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    normal_kernel<T><<<grid, kThreads, 0, s>>>(p, n, seed, offset, mean, std);
  });
}

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

void random_bernoulli(const Tensor& out, uint64_t seed, uint64_t offset, double keep_prob,
                      double scale, const Tensor& offset_base) {
  const int64_t* base = offset_base_ptr(offset_base, out, "random_bernoulli");
  launch_random(out, "random_bernoulli", [&](auto* p, int64_t n, unsigned grid, cudaStream_t s) {
    using T = std::remove_pointer_t<decltype(p)>;
    bernoulli_kernel<T><<<grid, kThreads, 0, s>>>(p, n, seed, offset, base,
                                                  static_cast<float>(keep_prob),
                                                  static_cast<float>(scale));
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
    dropout_kernel<T><<<grid, kThreads, 0, s>>>(static_cast<const T*>(xp), p, n, seed, offset,
                                                base, static_cast<float>(keep_prob),
                                                static_cast<float>(scale));
  });
}

}  // namespace ska::cuda
