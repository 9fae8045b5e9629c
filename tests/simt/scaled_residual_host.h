// The residual sums with per-channel scales (cuda/kernels/scaled_residual.cu) on host memory, run
// by tests/simt (tests/simt/scaled_residual_host.cpp builds the kernel file for the host),
// launched as scaled_residual_forward / _backward launch them: out = x * xs + (dropout(y) * yk) *
// ys over [rows, cols], xs / ys [cols] or null, yk [batch] (drop path's factors, rows / batch
// rows a sample) or null. T: out's dtype (and the scales'); TX, TY: x's and y's (T, or bf16/f16
// with an f32 T).
#pragma once

#include <cstdint>

#include "tests/simt/values.h"

namespace ska::simt::scaled_residual {

template <typename TX, typename TY, typename T>
void forward(int64_t rows, int64_t cols, int64_t batch, const TX* x, const T* xs, const TY* y,
             const T* ys, const TY* yk, const Dropout& drop, T* out);

// gx, gy, gxs, gys: null where not wanted; x and y are read only for gxs and gys (null without).
template <typename TX, typename TY, typename T>
void backward(int64_t rows, int64_t cols, int64_t batch, const T* g, const TX* x, const T* xs,
              const TY* y, const T* ys, const TY* yk, const Dropout& drop, TX* gx, TY* gy, T* gxs,
              T* gys);

}  // namespace ska::simt::scaled_residual
