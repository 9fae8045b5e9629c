// StarReLU's kernels' own code (cuda/kernels/star_relu.cu), run on the host by tests/simt:
// y = scale * relu(x)^2 + bias and grad_x to the bit against the host's float arithmetic in the
// kernels' expressions, the parameters' gradients to the bit against the kernels' order (each
// thread's groups of 8, block_sum, the partials' block_sum) and against f64 within the error of
// that order, nothing past the last element written, 16-byte and element accesses alike, and
// the same bits whatever order a block's threads run in. Dtypes as the MetaFormers run it: f32,
// bf16, and bf16 with f32 parameters under autocast (y in f32 or in bf16).
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/simt/star_relu_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::Buffer;
using ska::simt::random_buffer;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace sr = ska::simt::star_relu;

constexpr int kThreads = 256, kGroup = 8;

struct Case {
  std::string name;
  int64_t n, sms;
  bool misalign;  // the operands one element past a 16-byte boundary: element accesses
};

std::vector<Case> cases() {
  return {
      {"CAFormer-S18's stage-1 MLP at batch 2: [2, 56, 56, 256] on 132 SMs", 2 * 56 * 56 * 256, 132,
       false},
      {"a tail of 5 past the last group of 8, 4 SMs", 3 * kThreads * kGroup * 8 + 5, 4, false},
      {"fewer elements than a group: 7", 7, 132, false},
      {"one element off a 16-byte boundary: element accesses", 40000, 8, true},
  };
}

// The parameter gradients in the kernels' order: block k's thread t folds its groups of 8
// (elements begin + 8 t + 2048 j + 0..7) in turn, block_sum over the block, then the finish
// kernel's 256 threads fold partials t, t + 256, ... and block_sum them.
void expected_sums(const std::vector<float>& g, const std::vector<float>& x, int64_t sms,
                   float* sum_s, float* sum_b) {
  const int64_t n = static_cast<int64_t>(g.size());
  const int64_t blocks = sr::backward_blocks(n, sms), chunk = sr::backward_chunk(n, blocks);
  std::vector<float> part_s(static_cast<size_t>(blocks)), part_b(static_cast<size_t>(blocks));
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * chunk, end = std::min(n, begin + chunk);
    std::vector<float> ts(kThreads, 0.0f), tb(kThreads, 0.0f);
    for (int t = 0; t < kThreads; ++t) {
      for (int64_t i0 = begin + int64_t{t} * kGroup; i0 < end; i0 += int64_t{kThreads} * kGroup) {
        for (int64_t i = i0; i < std::min(end, i0 + kGroup); ++i) {
          const float r = std::max(x[static_cast<size_t>(i)], 0.0f);
          ts[t] += g[static_cast<size_t>(i)] * (r * r);
          tb[t] += g[static_cast<size_t>(i)];
        }
      }
    }
    part_s[static_cast<size_t>(k)] = ska::simt::block_sum(ts);
    part_b[static_cast<size_t>(k)] = ska::simt::block_sum(tb);
  }
  std::vector<float> fs(kThreads, 0.0f), fb(kThreads, 0.0f);
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t k = t; k < blocks; k += kThreads) {
      fs[t] += part_s[static_cast<size_t>(k)];
      fb[t] += part_b[static_cast<size_t>(k)];
    }
  }
  *sum_s = ska::simt::block_sum(fs);
  *sum_b = ska::simt::block_sum(fb);
}

template <typename T>
double eps_of() {
  return std::is_same_v<T, bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
}

template <typename X, typename P, typename Y>
void check(const Case& c) {
  const float s_value = 0.8944f, b_value = -0.4472f;  // StarReLU's initial scale and bias
  const P scale = round_to<P>(s_value), bias = round_to<P>(b_value);
  const float s = static_cast<float>(value(scale)), b = static_cast<float>(value(bias));
  const Buffer<X> x = random_buffer<X>(c.n, c.misalign, 31);
  const Buffer<Y> gy = random_buffer<Y>(c.n, c.misalign, 32);
  std::vector<float> xf(static_cast<size_t>(c.n)), gf(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.n; ++i) {
    xf[static_cast<size_t>(i)] = static_cast<float>(value(x.data[i]));
    gf[static_cast<size_t>(i)] = static_cast<float>(value(gy.data[i]));
  }

  Buffer<Y> y(c.n, c.misalign);
  sr::forward<X, P, Y>(x.data, &scale, &bias, y.data, c.n);
  CHECK(y.untouched_after());
  std::vector<Y> want_y(static_cast<size_t>(c.n));
  int64_t far = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    const float r = std::max(xf[static_cast<size_t>(i)], 0.0f);
    want_y[static_cast<size_t>(i)] = round_to<Y>(s * (r * r) + b);
    const double exact = static_cast<double>(s) * r * r + b;
    far += !(std::abs(value(y.data[i]) - exact) <= eps_of<Y>() * std::abs(exact) + 1e-6);
  }
  CHECK(same_bits(y.values(), want_y));
  CHECK(far == 0);

  Buffer<X> gx(c.n, c.misalign);
  P grad_scale = round_to<P>(NAN), grad_bias = round_to<P>(NAN);
  sr::backward<X, P, Y>(gy.data, x.data, &scale, gx.data, &grad_scale, &grad_bias, c.n, c.sms);
  CHECK(gx.untouched_after());
  std::vector<X> want_gx(static_cast<size_t>(c.n));
  double exact_s = 0.0, exact_b = 0.0, magnitude_s = 0.0, magnitude_b = 0.0;
  for (int64_t i = 0; i < c.n; ++i) {
    const float g = gf[static_cast<size_t>(i)], r = std::max(xf[static_cast<size_t>(i)], 0.0f);
    want_gx[static_cast<size_t>(i)] = round_to<X>(g * (2.0f * s) * r);
    exact_s += static_cast<double>(g) * r * r;
    exact_b += g;
    magnitude_s += std::abs(static_cast<double>(g) * r * r);
    magnitude_b += std::abs(g);
  }
  CHECK(same_bits(gx.values(), want_gx));
  float order_s = 0.0f, order_b = 0.0f;
  expected_sums(gf, xf, c.sms, &order_s, &order_b);
  CHECK(same_bits(std::vector<P>{grad_scale, grad_bias},
                  std::vector<P>{round_to<P>(order_s), round_to<P>(order_b)}));
  // Each term passes through at most its thread's groups, two block sums and the partials'.
  const int64_t blocks = sr::backward_blocks(c.n, c.sms);
  const double chain =
      static_cast<double>(sr::backward_chunk(c.n, blocks) / kThreads + 40 + blocks / kThreads);
  const double u = std::ldexp(1.0, -24);
  CHECK(std::abs(value(grad_scale) - exact_s) <=
        chain * u * magnitude_s + eps_of<P>() * std::abs(exact_s));
  CHECK(std::abs(value(grad_bias) - exact_b) <=
        chain * u * magnitude_b + eps_of<P>() * std::abs(exact_b));

  // The parameters' gradients may be left out, and a block's threads may run in any order.
  Buffer<X> gx_alone(c.n, c.misalign);
  sr::backward<X, P, Y>(gy.data, x.data, &scale, gx_alone.data, nullptr, nullptr, c.n, c.sms);
  CHECK(same_bits(gx_alone.values(), gx.values()));
  ska::simt::in_other_orders(33, [&](const char* order) {
    INFO(order);
    Buffer<Y> y2(c.n, c.misalign);
    Buffer<X> gx2(c.n, c.misalign);
    P s2 = round_to<P>(NAN), b2 = round_to<P>(NAN);
    sr::forward<X, P, Y>(x.data, &scale, &bias, y2.data, c.n);
    sr::backward<X, P, Y>(gy.data, x.data, &scale, gx2.data, &s2, &b2, c.n, c.sms);
    CHECK(same_bits(y2.values(), y.values()));
    CHECK(same_bits(gx2.values(), gx.values()));
    CHECK(same_bits(std::vector<P>{s2, b2}, std::vector<P>{grad_scale, grad_bias}));
  });
}

TEST_CASE("simt: StarReLU: values and gradients to the bit, the parameter sums in their order",
          "[cpu][simt][star_relu]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check<float, float, float>(c); }
    SECTION(c.name + ", bf16") { check<bf16, bf16, bf16>(c); }
    SECTION(c.name + ", bf16 with f32 parameters, f32 y") { check<bf16, float, float>(c); }
    SECTION(c.name + ", bf16 with f32 parameters, bf16 y") { check<bf16, float, bf16>(c); }
  }
}

TEST_CASE("simt: StarReLU: the backward's chunks are whole groups and fill the GPU",
          "[cpu][simt][star_relu]") {
  CHECK(sr::backward_chunk(1000003, sr::backward_blocks(1000003, 132)) % kGroup == 0);
  // CAFormer-S18's stage-1 MLP at batch 128: 4 blocks an SM; a small input, a block per 64
  // groups of 8 a thread's worth.
  CHECK(sr::backward_blocks(int64_t{128} * 56 * 56 * 256, 132) == 4 * 132);
  CHECK(sr::backward_blocks(2 * 56 * 56 * 256, 132) == 98);
  CHECK(sr::backward_blocks(7, 132) == 1);
}

}  // namespace
