// Vectorisable f32 exp, erf, normal CDF and tanh for the CPU kernels' hot loops. The same
// functions as pointwise_math.h's expf/erff/tanhf to within a few ulp, written without calls,
// tables or branches so that GCC turns a loop over them into SIMD code (libm calls do not vectorise).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/simd_clones.h"  // SKA_CPU_SIMD_CLONES

namespace ska::cpu::vm {

inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// exp(hi + lo) within ~2 ulp, for |lo| much smaller than |hi| (an extra-precise argument; lo = 0
// for a plain exp). Includes denormal results, overflow to inf, exp(-inf) = 0 and NaN.
// x = n ln2 + r with |r| <= ln2 / 2; e^r by its degree-6 Taylor polynomial (error < 1.2e-7);
// 2^n built in the exponent bits, as 2^(n/2) * 2^(n - n/2) so that denormal results and n = 128
// need no special case.
inline float exp_f32(float hi, float lo) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t = v + kRound rounds v to an integer
  // Beyond these the result is 0 or inf anyway; the clamp keeps n small. NaN passes through.
  float xc = hi < -104.0f ? -104.0f : hi;
  xc = xc > 89.0f ? 89.0f : xc;
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;
  const int32_t ni = static_cast<int32_t>(bits_of(t) - bits_of(kRound));  // n as an integer
  const float r = ((xc - n * kLn2Hi) + lo) - n * kLn2Lo;
  const float p =
      1.0f +
      r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // each in [-75, 65]: a normal power of two
  const float s1 = float_from_bits(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = float_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

inline float exp_f32(float x) { return exp_f32(x, 0.0f); }

// erf(x) / x on |x| <= 1 as a polynomial in x^2 (minimax fit, relative error 4e-8).
inline float erf_small_over_x(float x2) {
  return 1.12837911f +
         x2 * (-0.376123250f +
               x2 * (0.112801798f +
                     x2 * (-0.0267113112f + x2 * (0.00491755083f + x2 * -0.000563141948f))));
}

// exp(-x^2 / 2) for the normal density and CDF. Squaring x itself rather than x / sqrt 2 keeps
// the rounding of x / sqrt 2 out of the exponent; the rounding of x^2 remains (relative error
// x^2 * 6e-8 of the result: 2e-6 at x = -6, where the CDF is 1e-9).
inline float exp_neg_half_square(float x) {
  const float a = std::fabs(x) > 16.0f ? 16.0f : std::fabs(x);  // exp(-128) is 0 in f32 anyway
  return exp_f32(-0.5f * a * a);
}

// erfc(z) exp(z^2) for z >= 1, as Q(t) with t = 2 / (2 + z): a minimax fit over z in [1, 10]
// (relative error 6e-8; beyond 10, erfc(z) underflows to 0 anyway).
inline float erfc_scaled(float z) {
  const float t = 2.0f / (2.0f + z);
  return -2.58693763e-05f +
         t * (0.282746971f +
              t * (0.275170147f +
                   t * (0.287108183f +
                        t * (0.0371301100f +
                             t * (0.370369941f + t * (-0.326563001f + t * 0.0735826120f))))));
}

// erfc(z) for z >= 1.
inline float erfc_tail(float z) {
  z = z > 10.5f ? 10.5f : z;  // erfc is 0 in f32 from 10.06 on; keeps z * z finite
  return exp_f32(-z * z) * erfc_scaled(z);
}

inline float erf_f32(float x) {
  const float z = std::fabs(x);
  const float small = x * erf_small_over_x(x * x);
  const float big = std::copysign(1.0f - erfc_tail(z), x);
  return z <= 1.0f ? small : big;
}

// The standard normal CDF, 0.5 * (1 + erf(x / sqrt 2)), computed through erfc for x < -sqrt 2 so
// that the lower tail keeps its relative accuracy (gelu(x) = x * cdf(x) for very negative x).
inline float normal_cdf_f32(float x) {
  constexpr float kSqrt1_2 = 0.707106781186547524f;
  const float s = x * kSqrt1_2;
  const float z = std::fabs(s);
  const float central = 0.5f + 0.5f * s * erf_small_over_x(s * s);
  const float half_tail = 0.5f * exp_neg_half_square(x) * erfc_scaled(z > 10.5f ? 10.5f : z);
  const float tail = x < 0.0f ? half_tail : 1.0f - half_tail;
  return z <= 1.0f ? central : tail;
}

// tanh(x): an odd polynomial (minimax, relative error 3e-8) for |x| <= 0.55, where
// 1 - 2 / (e^2x + 1) would cancel; that formula elsewhere (e^2x = inf gives exactly +-1).
inline float tanh_f32(float x) {
  const float a = std::fabs(x);
  const float x2 = x * x;
  const float small =
      x * (0.99999994f +
           x2 * (-0.333327949f + x2 * (0.133188769f + x2 * (-0.0525893159f + x2 * 0.0163154360f))));
  const float big = std::copysign(1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f), x);
  return a <= 0.55f ? small : big;
}

inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

}  // namespace ska::cpu::vm

namespace ska::cpu::vm {

// Reductions in kLanes independent partial results: GCC vectorises these loops as they are,
// whereas a single float accumulator would need -fassociative-math.
constexpr int64_t kLanes = 16;

// sum over j < n of term(j).
template <typename Term>
inline float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  }
  float total = 0.0f;
  for (; j < n; ++j) total += term(j);
  for (int64_t l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

// max over j < n of v[j], ignoring NaN like std::fmax; -inf when n == 0.
inline float lane_max(const float* v, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float acc[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) acc[l] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] = v[j + l] > acc[l] ? v[j + l] : acc[l];
  }
  float m = kNegInf;
  for (; j < n; ++j) m = v[j] > m ? v[j] : m;
  for (int64_t l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace ska::cpu::vm
