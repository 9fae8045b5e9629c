// Scalar math of every UnaryOp and BinaryOp, forward and derivative, shared by the CPU kernels
// and the CUDA kernels (compiled for host and device), so both backends compute the same thing.
#pragma once

#include <math.h>

#include <type_traits>

#include "backend/kernel_types.h"
#include "core/random.h"  // SKA_HOST_DEVICE

namespace ska::pm {

SKA_HOST_DEVICE float exp_(float x) { return expf(x); }
SKA_HOST_DEVICE double exp_(double x) { return ::exp(x); }
SKA_HOST_DEVICE float log_(float x) { return logf(x); }
SKA_HOST_DEVICE double log_(double x) { return ::log(x); }
SKA_HOST_DEVICE float sqrt_(float x) { return sqrtf(x); }
SKA_HOST_DEVICE double sqrt_(double x) { return ::sqrt(x); }
SKA_HOST_DEVICE float tanh_(float x) { return tanhf(x); }
SKA_HOST_DEVICE double tanh_(double x) { return ::tanh(x); }
SKA_HOST_DEVICE float erf_(float x) { return erff(x); }
SKA_HOST_DEVICE double erf_(double x) { return ::erf(x); }
SKA_HOST_DEVICE float pow_(float x, float a) { return powf(x, a); }
SKA_HOST_DEVICE double pow_(double x, double a) { return ::pow(x, a); }

template <typename T>
SKA_HOST_DEVICE T sigmoid_(T x) {
  return T(1) / (T(1) + exp_(-x));
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluTanhCoef = 0.044715;
constexpr double kQuickGeluCoef = 1.702;

// y = op(x; a, b)
template <UnaryOp OP, typename T>
SKA_HOST_DEVICE T unary_forward(T x, T a, T b) {
  if constexpr (OP == UnaryOp::kNeg) return -x;
  if constexpr (OP == UnaryOp::kAbs) return x < T(0) ? -x : x;
  if constexpr (OP == UnaryOp::kExp) return exp_(x);
  if constexpr (OP == UnaryOp::kLog) return log_(x);
  if constexpr (OP == UnaryOp::kSqrt) return sqrt_(x);
  if constexpr (OP == UnaryOp::kRsqrt) return T(1) / sqrt_(x);
  if constexpr (OP == UnaryOp::kReciprocal) return T(1) / x;
  if constexpr (OP == UnaryOp::kSigmoid) return sigmoid_(x);
  if constexpr (OP == UnaryOp::kTanh) return tanh_(x);
  if constexpr (OP == UnaryOp::kRelu) return x > T(0) ? x : T(0);
  if constexpr (OP == UnaryOp::kGelu) return T(0.5) * x * (T(1) + erf_(x * T(kSqrt1_2)));
  if constexpr (OP == UnaryOp::kGeluTanh) {
    const T u = T(kSqrt2OverPi) * (x + T(kGeluTanhCoef) * x * x * x);
    return T(0.5) * x * (T(1) + tanh_(u));
  }
  if constexpr (OP == UnaryOp::kQuickGelu) return x * sigmoid_(T(kQuickGeluCoef) * x);
  if constexpr (OP == UnaryOp::kSquaredRelu) return x > T(0) ? x * x : T(0);
  if constexpr (OP == UnaryOp::kSilu) return x * sigmoid_(x);
  if constexpr (OP == UnaryOp::kAffine) return a * x + b;
  if constexpr (OP == UnaryOp::kPow) return pow_(x, a);
  return x;
}

// dy/dx at x
template <UnaryOp OP, typename T>
SKA_HOST_DEVICE T unary_derivative(T x, T a, T b) {
  (void)b;
  if constexpr (OP == UnaryOp::kNeg) return T(-1);
  if constexpr (OP == UnaryOp::kAbs) return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  if constexpr (OP == UnaryOp::kExp) return exp_(x);
  if constexpr (OP == UnaryOp::kLog) return T(1) / x;
  if constexpr (OP == UnaryOp::kSqrt) return T(0.5) / sqrt_(x);
  if constexpr (OP == UnaryOp::kRsqrt) return T(-0.5) / (x * sqrt_(x));
  if constexpr (OP == UnaryOp::kReciprocal) return T(-1) / (x * x);
  if constexpr (OP == UnaryOp::kSigmoid) {
    const T s = sigmoid_(x);
    return s * (T(1) - s);
  }
  if constexpr (OP == UnaryOp::kTanh) {
    const T t = tanh_(x);
    return T(1) - t * t;
  }
  if constexpr (OP == UnaryOp::kRelu) return x > T(0) ? T(1) : T(0);
  if constexpr (OP == UnaryOp::kGelu) {
    const T cdf = T(0.5) * (T(1) + erf_(x * T(kSqrt1_2)));
    const T pdf = T(kInvSqrt2Pi) * exp_(T(-0.5) * x * x);
    return cdf + x * pdf;
  }
  if constexpr (OP == UnaryOp::kGeluTanh) {
    const T x2 = x * x;
    const T u = T(kSqrt2OverPi) * (x + T(kGeluTanhCoef) * x2 * x);
    const T t = tanh_(u);
    const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCoef) * x2);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
  }
  if constexpr (OP == UnaryOp::kQuickGelu) {
    const T s = sigmoid_(T(kQuickGeluCoef) * x);
    return s + x * T(kQuickGeluCoef) * s * (T(1) - s);
  }
  if constexpr (OP == UnaryOp::kSquaredRelu) return x > T(0) ? T(2) * x : T(0);
  if constexpr (OP == UnaryOp::kSilu) {
    const T s = sigmoid_(x);
    return s + x * s * (T(1) - s);
  }
  if constexpr (OP == UnaryOp::kAffine) return a;
  if constexpr (OP == UnaryOp::kPow) return a * pow_(x, a - T(1));
  return T(1);
}

template <BinaryOp OP, typename T>
SKA_HOST_DEVICE T binary_forward(T x, T y) {
  if constexpr (OP == BinaryOp::kAdd) return x + y;
  if constexpr (OP == BinaryOp::kSub) return x - y;
  if constexpr (OP == BinaryOp::kMul) return x * y;
  if constexpr (OP == BinaryOp::kDiv) return x / y;
  if constexpr (OP == BinaryOp::kMaximum) return x > y ? x : y;
  if constexpr (OP == BinaryOp::kMinimum) return x < y ? x : y;
  return T(0);
}

template <BinaryOp OP, typename T>
SKA_HOST_DEVICE bool compare(T x, T y) {
  if constexpr (OP == BinaryOp::kEq) return x == y;
  if constexpr (OP == BinaryOp::kNe) return x != y;
  if constexpr (OP == BinaryOp::kLt) return x < y;
  if constexpr (OP == BinaryOp::kLe) return x <= y;
  if constexpr (OP == BinaryOp::kGt) return x > y;
  if constexpr (OP == BinaryOp::kGe) return x >= y;
  return false;
}

// Calls f(std::integral_constant<UnaryOp, op>) for the runtime `op`.
template <typename F>
void visit_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define SKA_UNARY_CASE(name) \
  case UnaryOp::name: f(std::integral_constant<UnaryOp, UnaryOp::name>{}); break;
    SKA_UNARY_CASE(kNeg) SKA_UNARY_CASE(kAbs) SKA_UNARY_CASE(kExp) SKA_UNARY_CASE(kLog)
    SKA_UNARY_CASE(kSqrt) SKA_UNARY_CASE(kRsqrt) SKA_UNARY_CASE(kReciprocal)
    SKA_UNARY_CASE(kSigmoid) SKA_UNARY_CASE(kTanh) SKA_UNARY_CASE(kRelu) SKA_UNARY_CASE(kGelu)
    SKA_UNARY_CASE(kGeluTanh) SKA_UNARY_CASE(kQuickGelu) SKA_UNARY_CASE(kSquaredRelu)
    SKA_UNARY_CASE(kSilu) SKA_UNARY_CASE(kAffine) SKA_UNARY_CASE(kPow)
#undef SKA_UNARY_CASE
  }
}

template <typename F>
void visit_binary_op(BinaryOp op, F&& f) {
  switch (op) {
#define SKA_BINARY_CASE(name) \
  case BinaryOp::name: f(std::integral_constant<BinaryOp, BinaryOp::name>{}); break;
    SKA_BINARY_CASE(kAdd) SKA_BINARY_CASE(kSub) SKA_BINARY_CASE(kMul) SKA_BINARY_CASE(kDiv)
    SKA_BINARY_CASE(kMaximum) SKA_BINARY_CASE(kMinimum) SKA_BINARY_CASE(kEq) SKA_BINARY_CASE(kNe)
    SKA_BINARY_CASE(kLt) SKA_BINARY_CASE(kLe) SKA_BINARY_CASE(kGt) SKA_BINARY_CASE(kGe)
#undef SKA_BINARY_CASE
  }
}

}  // namespace ska::pm
