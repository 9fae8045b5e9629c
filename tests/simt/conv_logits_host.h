// CSKA's direct conv-logit kernels (cuda/kernels/conv_logits.cu) on host memory, every launch run
// by tests/simt (tests/simt/conv_logits_host.cpp builds the kernel file for the host). The
// operands as the CUDA entry points take them, as pointers and strides in elements:
// q [B, heads, H*W, d] at q + b * qb + h * qh + p * qp + c; w [heads, k*k, keys, d] and bias
// [heads, keys] contiguous; the logits and their gradient [B, heads, H*W, keys] with strides
// (b, h, p) and a unit last stride; grad_q like q with its own strides (null: not wanted);
// grad_w and grad_bias contiguous (null: not wanted).
#pragma once

#include <cstdint>

#include "backend/conv_logits_geometry.h"

namespace ska::simt::conv_logits {

struct Strides {
  int64_t b, h, p;
};

template <typename T>
void forward(const ConvLogitsGeometry& geo, const T* q, Strides qs, const T* w, const T* bias,
             T* logits, Strides ls);

template <typename T>
void backward(const ConvLogitsGeometry& geo, const T* grad, Strides gs, const T* q, Strides qs,
              const T* w, T* grad_q, Strides gqs, T* grad_w, T* grad_bias);

// What attn::async_loads_enabled answers (train.attention_loads: async, the default, or sync).
void set_async_loads(bool enabled);

}  // namespace ska::simt::conv_logits
