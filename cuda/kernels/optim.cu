// CUDA kernels: fused in-place optimizer updates (Adam family, SGD), one grid-stride pass over a
// parameter. Twins of backend/cpu/optim.cpp; f32 math for f32, bf16 and f16 tensors. The update
// count and the skip flag are read on the device (no host sync decides an update). The launches
// take raw operands, so that tests/simt runs this file's own code on the host; the tensor entry
// points are left out there.
#include <cstdint>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/optim_math.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

// `divisor` (may be null), `step` and `skip` (may be null) are read on the device.
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g,
                                 const float* __restrict__ divisor, T* __restrict__ m,
                                 T* __restrict__ v, T* __restrict__ u_out,
                                 const int64_t* __restrict__ step,
                                 const uint8_t* __restrict__ skip, int64_t n, AdamScalars s) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (skip != nullptr && *skip != 0) {
    if (u_out != nullptr) {
      for (int64_t i = first; i < n; i += stride) u_out[i] = from_float<T>(0.0f);
    }
    return;
  }
  const AdamCorrections c = adam_corrections(s, *step);
  const float lr = u_out == nullptr ? static_cast<float>(*s.lr) : 0.0f;
  const float scale = divisor != nullptr ? 1.0f / *divisor : 1.0f;
  for (int64_t i = first; i < n; i += stride) {
    const float pi = to_float(p[i]);
    const float u = adam_direction(pi, g, m, v, i, scale, s, c);
    if (u_out != nullptr) {
      u_out[i] = from_float<T>(u);
    } else {
      p[i] = from_float<T>(pi - lr * u);
    }
  }
}

template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                                const uint8_t* __restrict__ skip, int64_t n,
                                const double* __restrict__ lr_ptr, float momentum,
                                float weight_decay, bool nesterov) {
  if (skip != nullptr && *skip != 0) return;
  const float lr = static_cast<float>(*lr_ptr);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    sgd_element(p, g, buf, i, lr, momentum, weight_decay, nesterov);
  }
}

__global__ void advance_counts_kernel(int64_t* __restrict__ counts, int64_t n,
                                      const uint8_t* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ++counts[i];
  }
}

// One thread: the five statistics of record_update.
__global__ void record_update_kernel(float* __restrict__ s, const float* __restrict__ loss,
                                     const uint8_t* __restrict__ skip) {
  if (*skip != 0) {
    s[2] += 1.0f;
    s[3] += 1.0f;
    s[4] = fmaxf(s[4], s[3]);
  } else {
    s[0] += *loss;
    s[1] += 1.0f;
    s[3] = 0.0f;
  }
}

template <typename T>
void launch_adam_step(T* p, const T* g, const float* divisor, T* m, T* v, T* u_out,
                      const int64_t* step, const uint8_t* skip, int64_t n, const AdamScalars& s,
                      cudaStream_t stream) {
  launch_kernel(adam_step_kernel<T>, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream, p, g,
                divisor, m, v, u_out, step, skip, n, s);
}

template <typename T>
void launch_sgd_step(T* p, const T* g, T* buf, const uint8_t* skip, int64_t n, const double* lr,
                     float momentum, float weight_decay, bool nesterov, cudaStream_t stream) {
  launch_kernel(sgd_step_kernel<T>, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream, p, g,
                buf, skip, n, lr, momentum, weight_decay, nesterov);
}

inline void launch_advance_counts(int64_t* counts, int64_t n, const uint8_t* skip,
                                  cudaStream_t stream) {
  launch_kernel(advance_counts_kernel, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream,
                counts, n, skip);
}

inline void launch_record_update(float* stats, const float* loss, const uint8_t* skip,
                                 cudaStream_t stream) {
  launch_kernel(record_update_kernel, dim3(1), dim3(1), 0, stream, stats, loss, skip);
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& grad_divisor,
               const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& update,
               const Tensor& step, const Tensor& skip, const Tensor& lr, double beta1,
               double beta2, double eps, double l2_decay, double decoupled_decay) {
  DeviceGuard guard(device_index(param));
  const float* divisor = nullptr;
  if (grad_divisor.defined()) {
    SKA_CHECK(grad_divisor.numel() == 1 && grad_divisor.dtype() == DType::kF32, DTypeError,
              "cuda adam_step: grad_divisor must be one f32 element, got ", grad_divisor.str());
    divisor = grad_divisor.data<float>();
  }
  SKA_CHECK(step.numel() == 1 && step.dtype() == DType::kI64 && step.device() == param.device(),
            DTypeError, "cuda adam_step: step must be one i64 element on ", param.device(),
            ", got ", step.str());
  const uint8_t* skip_flag = skip_pointer(skip, param, "adam_step");
  const double* lr_ptr = update.defined() ? nullptr : lr_pointer(lr, param, "adam_step");
  const AdamScalars s = adam_scalars(lr_ptr, beta1, beta2, eps, l2_decay, decoupled_decay);
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "adam_step", [&](auto tag) {
    using T = decltype(tag);
    T* u_out = update.defined() ? static_cast<T*>(update.data_ptr()) : nullptr;
    launch_adam_step(static_cast<T*>(param.data_ptr()), static_cast<const T*>(grad.data_ptr()),
                     divisor, static_cast<T*>(exp_avg.data_ptr()),
                     static_cast<T*>(exp_avg_sq.data_ptr()), u_out,
                     static_cast<const int64_t*>(step.data_ptr()), skip_flag, n, s,
                     current_stream(device_index(param)));
  });
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const Tensor& skip, const Tensor& lr, double momentum, double weight_decay,
              bool nesterov) {
  DeviceGuard guard(device_index(param));
  const uint8_t* skip_flag = skip_pointer(skip, param, "sgd_step");
  const double* lr_ptr = lr_pointer(lr, param, "sgd_step");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = decltype(tag);
    T* buf = momentum_buf.defined() ? static_cast<T*>(momentum_buf.data_ptr()) : nullptr;
    launch_sgd_step(static_cast<T*>(param.data_ptr()), static_cast<const T*>(grad.data_ptr()), buf,
                    skip_flag, n, lr_ptr, static_cast<float>(momentum),
                    static_cast<float>(weight_decay), nesterov,
                    current_stream(device_index(param)));
  });
}

void advance_counts(const Tensor& counts, const Tensor& skip) {
  DeviceGuard guard(device_index(counts));
  SKA_CHECK(counts.dtype() == DType::kI64 && counts.is_contiguous(), DTypeError,
            "cuda advance_counts: counts must be a contiguous i64 tensor, got ", counts.str());
  const int64_t n = counts.numel();
  if (n == 0) return;
  launch_advance_counts(static_cast<int64_t*>(counts.data_ptr()), n,
                        skip_pointer(skip, counts, "advance_counts"),
                        current_stream(device_index(counts)));
}

void record_update(const Tensor& stats, const Tensor& loss, const Tensor& skip) {
  DeviceGuard guard(device_index(stats));
  SKA_CHECK(stats.dtype() == DType::kF32 && stats.numel() == 5 && stats.is_contiguous(),
            DTypeError, "cuda record_update: stats must be 5 contiguous f32 values, got ",
            stats.str());
  SKA_CHECK(loss.dtype() == DType::kF32 && loss.numel() == 1 && loss.device() == stats.device(),
            DTypeError, "cuda record_update: loss must be one f32 element on ", stats.device(),
            ", got ", loss.str());
  SKA_CHECK(skip.defined(), ValueError, "cuda record_update: skip must be defined");
  launch_record_update(
      static_cast<float*>(stats.data_ptr()), static_cast<const float*>(loss.data_ptr()),
      skip_pointer(skip, stats, "record_update"), current_stream(device_index(stats)));
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
