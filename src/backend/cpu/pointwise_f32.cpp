// SIMD fast paths of the f32 unary kernels that need exp, erf or tanh (GELU, SiLU, sigmoid, ...)
// or select by sign (ReLU, squared ReLU: scalar code branches there and mispredicts).
// Each loop body is the formula of pointwise_math.h with vec_math.h's functions in place of libm.
// Built with -fno-trapping-math (src/CMakeLists.txt) so that GCC if-converts the selects.
#include "backend/cpu/pointwise_f32.h"

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/cpu/vec_math.h"
#include "backend/pointwise_math.h"

namespace ska::cpu {

namespace {

constexpr float kSqrt2OverPi = static_cast<float>(pm::kSqrt2OverPi);
constexpr float kGeluTanhCoef = static_cast<float>(pm::kGeluTanhCoef);
constexpr float kQuickGeluCoef = static_cast<float>(pm::kQuickGeluCoef);
constexpr float kInvSqrt2Pi = static_cast<float>(pm::kInvSqrt2Pi);

// One loop per op so that each compiles to its own vector loop; the switch runs once per span.
SKA_CPU_SIMD_CLONES
void forward_span(UnaryOp op, const float* x, float* y, int64_t n) {
  switch (op) {
    case UnaryOp::kExp:
      for (int64_t i = 0; i < n; ++i) y[i] = vm::exp_f32(x[i]);
      break;
    case UnaryOp::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = vm::sigmoid_f32(x[i]);
      break;
    case UnaryOp::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = vm::tanh_f32(x[i]);
      break;
    case UnaryOp::kGelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vm::normal_cdf_f32(x[i]);
      break;
    case UnaryOp::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float u = kSqrt2OverPi * (v + kGeluTanhCoef * v * v * v);
        y[i] = 0.5f * v * (1.0f + vm::tanh_f32(u));
      }
      break;
    case UnaryOp::kQuickGelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vm::sigmoid_f32(kQuickGeluCoef * x[i]);
      break;
    case UnaryOp::kSilu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vm::sigmoid_f32(x[i]);
      break;
    case UnaryOp::kRelu:  // selects, not branches: random signs would mispredict half the time
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
      break;
    case UnaryOp::kSquaredRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
      break;
    default:
      break;
  }
}

SKA_CPU_SIMD_CLONES
void backward_span(UnaryOp op, const float* g, const float* x, float* dx, int64_t n) {
  switch (op) {
    case UnaryOp::kExp:
      for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * vm::exp_f32(x[i]);
      break;
    case UnaryOp::kSigmoid:
      for (int64_t i = 0; i < n; ++i) {
        const float s = vm::sigmoid_f32(x[i]);
        dx[i] = g[i] * (s * (1.0f - s));
      }
      break;
    case UnaryOp::kTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float t = vm::tanh_f32(x[i]);
        dx[i] = g[i] * (1.0f - t * t);
      }
      break;
    case UnaryOp::kGelu:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float pdf = kInvSqrt2Pi * vm::exp_f32(-0.5f * v * v);
        dx[i] = g[i] * (vm::normal_cdf_f32(v) + v * pdf);
      }
      break;
    case UnaryOp::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i], v2 = v * v;
        const float t = vm::tanh_f32(kSqrt2OverPi * (v + kGeluTanhCoef * v2 * v));
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCoef * v2);
        dx[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
      }
      break;
    case UnaryOp::kQuickGelu:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i], s = vm::sigmoid_f32(kQuickGeluCoef * v);
        dx[i] = g[i] * (s + v * kQuickGeluCoef * s * (1.0f - s));
      }
      break;
    case UnaryOp::kSilu:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i], s = vm::sigmoid_f32(v);
        dx[i] = g[i] * (s + v * s * (1.0f - s));
      }
      break;
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * (x[i] > 0.0f ? 1.0f : 0.0f);
      break;
    case UnaryOp::kSquaredRelu:
      for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * (x[i] > 0.0f ? 2.0f * x[i] : 0.0f);
      break;
    default:
      break;
  }
}

// Splits [0, n) into one contiguous span per thread (a multiple of 16 elements, so vector loops
// have few remainders); small inputs stay on the calling thread.
template <typename F>
void parallel_spans(int64_t n, F&& span) {
  constexpr int64_t kGrain = 16384;
#pragma omp parallel if (n > kGrain)
  {
    int64_t begin = 0, end = n;
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((n + threads - 1) / threads + 15) / 16 * 16;
    begin = std::min(n, t * per);
    end = std::min(n, begin + per);
#endif
    if (end > begin) span(begin, end - begin);
  }
}

}  // namespace

bool has_unary_f32_fast_path(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: case UnaryOp::kSigmoid: case UnaryOp::kTanh: case UnaryOp::kGelu:
    case UnaryOp::kGeluTanh: case UnaryOp::kQuickGelu: case UnaryOp::kSilu: case UnaryOp::kRelu:
    case UnaryOp::kSquaredRelu:
      return true;
    default:
      return false;
  }
}

void unary_forward_f32(UnaryOp op, const float* x, float* y, int64_t n) {
  parallel_spans(n, [&](int64_t i, int64_t len) { forward_span(op, x + i, y + i, len); });
}

void unary_backward_f32(UnaryOp op, const float* g, const float* x, float* dx, int64_t n) {
  parallel_spans(n, [&](int64_t i, int64_t len) { backward_span(op, g + i, x + i, dx + i, len); });
}

}  // namespace ska::cpu
