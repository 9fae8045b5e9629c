// CUDA kernels: fused in-place optimizer updates (Adam family, SGD), one grid-stride pass over a
// parameter. Twins of backend/cpu/optim.cpp; f32 math for f32, bf16 and f16 tensors.
#include <cstdint>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

struct AdamScalars {
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2_sqrt, l2_decay, decoupled_decay;
};

// `divisor` (device, may be null) is read on the device so that no host sync is needed.
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g,
                                 const float* __restrict__ divisor, T* __restrict__ m,
                                 T* __restrict__ v, T* __restrict__ u_out, int64_t n,
                                 AdamScalars s) {
  const float scale = divisor != nullptr ? 1.0f / *divisor : 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float pi = to_float(p[i]);
    const float gi = to_float(g[i]) * scale + s.l2_decay * pi;
    const float mi = s.beta1 * to_float(m[i]) + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * to_float(v[i]) + (1.0f - s.beta2) * gi * gi;
    m[i] = from_float<T>(mi);
    v[i] = from_float<T>(vi);
    const float u = (mi / s.bias_correction1) / (sqrtf(vi) / s.bias_correction2_sqrt + s.eps) +
                    s.decoupled_decay * pi;
    if (u_out != nullptr) {
      u_out[i] = from_float<T>(u);
    } else {
      p[i] = from_float<T>(pi - s.lr * u);
    }
  }
}

template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                                int64_t n, float lr, float momentum, float weight_decay,
                                bool nesterov) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float pi = to_float(p[i]);
    float d = to_float(g[i]) + weight_decay * pi;
    if (buf != nullptr) {
      const float b = momentum * to_float(buf[i]) + d;
      buf[i] = from_float<T>(b);
      d = nesterov ? d + momentum * b : b;
    }
    p[i] = from_float<T>(pi - lr * d);
  }
}

}  // namespace

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& grad_divisor,
               const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& update, double lr,
               double beta1, double beta2, double eps, double bias_correction1,
               double bias_correction2, double l2_decay, double decoupled_decay) {
  DeviceGuard guard(device_index(param));
  const float* divisor = nullptr;
  if (grad_divisor.defined()) {
    SKA_CHECK(grad_divisor.numel() == 1 && grad_divisor.dtype() == DType::kF32, DTypeError,
              "cuda adam_step: grad_divisor must be one f32 element, got ", grad_divisor.str());
    divisor = grad_divisor.data<float>();
  }
  const AdamScalars s{static_cast<float>(lr),
                      static_cast<float>(beta1),
                      static_cast<float>(beta2),
                      static_cast<float>(eps),
                      static_cast<float>(bias_correction1),
                      static_cast<float>(std::sqrt(bias_correction2)),
                      static_cast<float>(l2_decay),
                      static_cast<float>(decoupled_decay)};
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "adam_step", [&](auto tag) {
    using T = decltype(tag);
    T* u_out = update.defined() ? static_cast<T*>(update.data_ptr()) : nullptr;
    adam_step_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, current_stream(device_index(param))>>>(
            static_cast<T*>(param.data_ptr()), static_cast<const T*>(grad.data_ptr()), divisor,
            static_cast<T*>(exp_avg.data_ptr()), static_cast<T*>(exp_avg_sq.data_ptr()), u_out, n,
            s);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
              double momentum, double weight_decay, bool nesterov) {
  DeviceGuard guard(device_index(param));
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = decltype(tag);
    T* buf = momentum_buf.defined() ? static_cast<T*>(momentum_buf.data_ptr()) : nullptr;
    sgd_step_kernel<T><<<grid_for(n, kThreads), kThreads, 0, current_stream(device_index(param))>>>(
        static_cast<T*>(param.data_ptr()), static_cast<const T*>(grad.data_ptr()), buf, n,
        static_cast<float>(lr), static_cast<float>(momentum), static_cast<float>(weight_decay),
        nesterov);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ska::cuda
