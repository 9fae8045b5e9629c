// The CPU's SIMD f32 math (backend/cpu/vec_math.h) and the fast unary kernels built on it, against
// libm in double over a dense grid, extreme values, infinities, NaN and denormals.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/pointwise_f32.h"
#include "backend/cpu/vec_math.h"
#include "backend/pointwise_math.h"
#include "support/test_util.h"

using namespace ska;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kDenormUlp = 1.401298464324817e-45;  // 2^-149, the spacing of f32 denormals

// Dense grid over [lo, hi] plus values at the edges of f32: zeros, denormals, FLT_MIN/MAX, inf.
std::vector<float> test_inputs(float lo, float hi, int points) {
  std::vector<float> xs;
  for (int i = 0; i <= points; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / points);
  for (float v : {0.0f, 1e-30f, 1e-38f, 1e-40f, 1e-45f, std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), 1e-4f, 0.55f, 1.0f, 1.4142135f, 88.7f, 88.8f,
                  -87.3f, -103.0f, -103.9f, -104.5f, 200.0f, kInf}) {
    xs.push_back(v);
    xs.push_back(-v);
  }
  return xs;
}

// Requires |fast(x) - exact(x)| <= rtol |exact(x)| + atol for every x, with matching NaN and
// infinities; `exact` runs in double and its result is rounded to f32 first.
template <typename Fast, typename Exact>
void require_matches(const char* what, const std::vector<float>& xs, Fast fast, Exact exact,
                     double rtol, double atol = 2 * kDenormUlp) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x : xs) {
    const float got = fast(x);
    const double want = static_cast<float>(exact(static_cast<double>(x)));
    if (std::isnan(want) || std::isnan(got)) {
      INFO(what << "(" << x << ") = " << got << ", want " << want);
      REQUIRE(std::isnan(want) == std::isnan(got));
      continue;
    }
    if (std::isinf(want) || std::isinf(got)) {
      INFO(what << "(" << x << ") = " << got << ", want " << want);
      REQUIRE(static_cast<double>(got) == want);
      continue;
    }
    const double excess = std::fabs(got - want) - (rtol * std::fabs(want) + atol);
    if (excess > worst) worst = excess, worst_x = x;
  }
  INFO(what << ": worst excess over tolerance " << worst << " at x = " << worst_x);
  CHECK(worst == 0.0);
}

}  // namespace

TEST_CASE("vec_math: exp, erf, normal cdf, tanh, sigmoid match libm", "[cpu]") {
  const std::vector<float> xs = test_inputs(-120.0f, 120.0f, 1 << 20);
  std::vector<float> with_nan = xs;
  with_nan.push_back(kNaN);
  require_matches("exp", with_nan, [](float x) { return cpu::vm::exp_f32(x); },
                  [](double x) { return std::exp(x); }, 4e-7);
  require_matches("erf", with_nan, cpu::vm::erf_f32, [](double x) { return std::erf(x); }, 4e-7);
  require_matches("tanh", with_nan, cpu::vm::tanh_f32, [](double x) { return std::tanh(x); }, 4e-7);
  // 1 / (1 + e^-x), like the libm form of pointwise_math.h, flushes results below FLT_MIN.
  require_matches("sigmoid", with_nan, cpu::vm::sigmoid_f32,
                  [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 5e-7,
                  std::numeric_limits<float>::min());
  // The lower tail keeps relative accuracy down to underflow (cdf(-13) ~ 6e-39), to within the
  // rounding of x^2 in exp(-x^2 / 2): 6e-8 x^2 relative, 1e-5 at x = -13.
  require_matches("normal_cdf", with_nan, cpu::vm::normal_cdf_f32,
                  [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }, 1.2e-5);
}

TEST_CASE("fast f32 unary kernels match the f64 definitions, forward and derivative", "[cpu]") {
  const std::vector<float> xs = test_inputs(-30.0f, 30.0f, 1 << 18);
  std::vector<float> grads(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) grads[i] = 1.0f - 0.5f * static_cast<float>(i % 3);
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<float> y(xs.size()), dx(xs.size());
  auto check_op = [&](auto op_c) {
    constexpr UnaryOp kOp = decltype(op_c)::value;
    if (!cpu::has_unary_f32_fast_path(kOp)) return;
    cpu::unary_forward_f32(kOp, xs.data(), y.data(), n);
    cpu::unary_backward_f32(kOp, grads.data(), xs.data(), dx.data(), n);
    for (size_t i = 0; i < xs.size(); ++i) {
      const double x = xs[i];
      // References in double, rounded to f32 (exp(88.8) is inf in f32).
      const double want_y = static_cast<float>(pm::unary_forward<kOp, double>(x, 0.0, 0.0));
      const double want_dx =
          static_cast<float>(grads[i] * pm::unary_derivative<kOp, double>(x, 0.0, 0.0));
      // Forward within 4e-6 relative, or 6e-8 |x| absolute: half an f32 ulp of 1 + tanh (or
      // 1 + erf) times x, the cancellation that the f32 definitions share (vec_math's
      // normal_cdf keeps the GELU tail and is tested above). The derivatives sum terms that
      // cancel, so they get an absolute 1e-6.
      INFO("op " << static_cast<int>(kOp) << " at x = " << x << ": y " << y[i] << " want "
                 << want_y << ", dx " << dx[i] << " want " << want_dx);
      if (std::isnan(want_y)) {
        REQUIRE(std::isnan(y[i]));
      } else if (std::isinf(want_y)) {
        REQUIRE(static_cast<double>(y[i]) == want_y);
      } else {
        REQUIRE(std::fabs(y[i] - want_y) <= 4e-6 * std::fabs(want_y) + 6e-8 * std::fabs(x));
      }
      // Beyond 1e4 (or where y overflows) the f32 intermediates overflow, as in pointwise_math.h.
      if (std::isfinite(want_dx) && std::isfinite(want_y) && std::fabs(x) < 1e4) {
        REQUIRE(std::fabs(dx[i] - want_dx) <= 4e-6 * std::fabs(want_dx) + 1e-6);
      }
    }
  };
  for (UnaryOp op : {UnaryOp::kExp, UnaryOp::kSigmoid, UnaryOp::kTanh, UnaryOp::kGelu,
                     UnaryOp::kGeluTanh, UnaryOp::kQuickGelu, UnaryOp::kSilu}) {
    CHECK(cpu::has_unary_f32_fast_path(op));
    pm::visit_unary_op(op, check_op);
  }
}

TEST_CASE("f32 gelu and silu through the ops agree with f64, gradients included", "[cpu]") {
  for (int which = 0; which < 2; ++which) {
    auto f = [which](const Tensor& x) { return which == 0 ? gelu(x) : silu(x); };
    Tensor x64 = test::uniform({3, 1000}, 7, -8.0, 8.0).set_requires_grad();
    Tensor x32 = x64.detach().to(DType::kF32).set_requires_grad();
    const Tensor y64 = f(x64), y32 = f(x32);
    test::require_close(y32, y64, test::tolerance_for(DType::kF32), "forward");
    sum(y64 * y64).backward();
    sum(y32 * y32).backward();
    test::require_close(x32.grad(), x64.grad(), test::tolerance_for(DType::kF32), "gradient");
  }
}
