// The per-element math of the optimizer kernels, shared by the single-tensor kernels (optim.cu)
// and the multi-tensor ones (multi_tensor.cu), in f32 for f32, bf16 and f16 tensors, and the
// host-side helpers both use.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace ska::cuda {

// Adam's scalars; the bias corrections come from the update count and the learning rate from
// device memory, both read on the device.
struct AdamScalars {
  double beta1_d, beta2_d;  // for the bias corrections, as the CPU twin computes them
  const double* lr;         // null when the kernel outputs the update instead (LAMB)
  float beta1, beta2, eps, l2_decay, decoupled_decay;
};

inline AdamScalars adam_scalars(const double* lr, double beta1, double beta2, double eps,
                                double l2_decay, double decoupled_decay) {
  return {beta1,
          beta2,
          lr,
          static_cast<float>(beta1),
          static_cast<float>(beta2),
          static_cast<float>(eps),
          static_cast<float>(l2_decay),
          static_cast<float>(decoupled_decay)};
}

// The learning rate's device pointer: `lr` must be one f64 element on `like`'s device.
inline const double* lr_pointer(const Tensor& lr, const Tensor& like, const char* who) {
  SKA_CHECK(lr.defined() && lr.numel() == 1 && lr.dtype() == DType::kF64 &&
                lr.device() == like.device(),
            DTypeError, "cuda ", who, ": lr must be one f64 element on ", like.device(), ", got ",
            lr.defined() ? lr.str() : "an undefined tensor");
  return static_cast<const double*>(lr.data_ptr());
}

// The skip flag's device pointer (one u8 element on `like`'s device), or null when undefined.
inline const uint8_t* skip_pointer(const Tensor& skip, const Tensor& like, const char* who) {
  if (!skip.defined()) return nullptr;
  SKA_CHECK(skip.numel() == 1 && skip.dtype() == DType::kU8 && skip.device() == like.device(),
            DTypeError, "cuda ", who, ": skip must be one u8 element on ", like.device(), ", got ",
            skip.str());
  return static_cast<const uint8_t*>(skip.data_ptr());
}

struct AdamCorrections {
  float bias_correction1, bias_correction2_sqrt;
};

__device__ __forceinline__ AdamCorrections adam_corrections(const AdamScalars& s, int64_t step) {
  const double t = static_cast<double>(step);
  return {static_cast<float>(1.0 - pow(s.beta1_d, t)),
          static_cast<float>(sqrt(1.0 - pow(s.beta2_d, t)))};
}

// Moments of element j updated in place; returns the update direction u (param -= lr * u).
template <typename T>
__device__ __forceinline__ float adam_direction(float pj, const T* __restrict__ g,
                                                T* __restrict__ m, T* __restrict__ v, int64_t j,
                                                float grad_scale, const AdamScalars& s,
                                                const AdamCorrections& c) {
  const float gj = to_float(g[j]) * grad_scale + s.l2_decay * pj;
  const float mj = s.beta1 * to_float(m[j]) + (1.0f - s.beta1) * gj;
  const float vj = s.beta2 * to_float(v[j]) + (1.0f - s.beta2) * gj * gj;
  m[j] = from_float<T>(mj);
  v[j] = from_float<T>(vj);
  return (mj / c.bias_correction1) / (sqrtf(vj) / c.bias_correction2_sqrt + s.eps) +
         s.decoupled_decay * pj;
}

// One SGD element (torch.optim.SGD with dampening 0); buf is null without momentum.
template <typename T>
__device__ __forceinline__ void sgd_element(T* __restrict__ p, const T* __restrict__ g,
                                            T* __restrict__ buf, int64_t j, float lr,
                                            float momentum, float weight_decay, bool nesterov) {
  const float pj = to_float(p[j]);
  float d = to_float(g[j]) + weight_decay * pj;
  if (buf != nullptr) {
    const float b = momentum * to_float(buf[j]) + d;
    buf[j] = from_float<T>(b);
    d = nesterov ? d + momentum * b : b;
  }
  p[j] = from_float<T>(pj - lr * d);
}

}  // namespace ska::cuda
