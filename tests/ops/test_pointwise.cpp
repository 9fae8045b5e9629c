// Pointwise ops: values against hand-computed cases, broadcasting, gradients by finite differences,
// errors, and CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>

#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::uniform;
using ska::test::values;

TEST_CASE("binary ops broadcast like NumPy", "[cpu]") {
  Tensor a = values({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = values({10, 20, 30}, {3});
  Tensor c = values({100, 200}, {2, 1});
  CHECK(add(a, b).to_vector<double>() == std::vector<double>{11, 22, 33, 14, 25, 36});
  CHECK(sub(a, c).to_vector<double>() == std::vector<double>{-99, -98, -97, -196, -195, -194});
  CHECK(mul(b, c).shape() == Shape{2, 3});
  CHECK(div(a, b).to_vector<double>()[5] == Approx(0.2));
  CHECK(maximum(a, values({3}, {1})).to_vector<double>() == std::vector<double>{3, 3, 3, 4, 5, 6});
  CHECK(minimum(a, values({3}, {1})).to_vector<double>() == std::vector<double>{1, 2, 3, 3, 3, 3});
  CHECK(gt(a, values({3}, {1})).to_vector<int>() == std::vector<int>{0, 0, 0, 1, 1, 1});
  CHECK(eq(a, a.transpose(0, 1).contiguous().transpose(0, 1)).to_vector<int>() ==
        std::vector<int>(6, 1));
  CHECK_THROWS_WITH(add(a, values({1, 2}, {2})),
                    Catch::Contains("add") && Catch::Contains("[2, 3]") && Catch::Contains("[2]"));
  CHECK_THROWS_AS(add(a, a.to(DType::kF32)), DTypeError);
}

TEST_CASE("scalar forms", "[cpu]") {
  Tensor a = values({1, -2, 4}, {3});
  CHECK((a + 1.0).to_vector<double>() == std::vector<double>{2, -1, 5});
  CHECK((a - 1.0).to_vector<double>() == std::vector<double>{0, -3, 3});
  CHECK(rsub(1.0, a).to_vector<double>() == std::vector<double>{0, 3, -3});
  CHECK((a * 2.0).to_vector<double>() == std::vector<double>{2, -4, 8});
  CHECK((a / 4.0).to_vector<double>() == std::vector<double>{0.25, -0.5, 1});
  CHECK(pow(values({2, 3}, {2}), 3.0).to_vector<double>() == std::vector<double>{8, 27});
}

TEST_CASE("activations against hand-computed values", "[cpu]") {
  const Tensor x = values({-2.0, -0.5, 0.0, 0.5, 2.0}, {5});
  auto at = [](const Tensor& t, int i) { return t.to_vector<double>()[static_cast<size_t>(i)]; };
  CHECK(at(relu(x), 0) == 0.0);
  CHECK(at(relu(x), 4) == 2.0);
  CHECK(at(gelu(x), 3) == Approx(0.5 * 0.5 * (1 + std::erf(0.5 / std::sqrt(2.0)))));
  CHECK(at(gelu(x), 0) == Approx(-0.04550026389635842));
  CHECK(at(gelu(x, true), 4) == Approx(1.9545976940877752));
  CHECK(at(quick_gelu(x), 4) == Approx(2.0 / (1.0 + std::exp(-3.404))));
  CHECK(at(squared_relu(x), 4) == 4.0);
  CHECK(at(squared_relu(x), 0) == 0.0);
  CHECK(at(silu(x), 3) == Approx(0.5 / (1 + std::exp(-0.5))));
  CHECK(at(sigmoid(x), 2) == 0.5);
  CHECK(at(tanh(x), 4) == Approx(std::tanh(2.0)));
  CHECK(at(exp(x), 0) == Approx(std::exp(-2.0)));
  CHECK(at(abs(x), 0) == 2.0);
  CHECK(at(neg(x), 4) == -2.0);
  const Tensor p = values({0.25, 4.0}, {2});
  CHECK(sqrt(p).to_vector<double>() == std::vector<double>{0.5, 2.0});
  CHECK(rsqrt(p).to_vector<double>() == std::vector<double>{2.0, 0.5});
  CHECK(reciprocal(p).to_vector<double>() == std::vector<double>{4.0, 0.25});
  CHECK(log(p).to_vector<double>()[1] == Approx(std::log(4.0)));
  // StarReLU: s * relu(x)^2 + b
  const Tensor s = values({0.8944}, {1}), b = values({-0.4472}, {1});
  CHECK(at(star_relu(x, s, b), 4) == Approx(0.8944 * 4 - 0.4472));
  CHECK(at(star_relu(x, s, b), 0) == Approx(-0.4472));
}

TEST_CASE("pointwise gradients match finite differences", "[cpu]") {
  // Inputs kept away from the kinks of relu-like ops (0) and in the domains of log/sqrt.
  Tensor a = uniform({3, 4}, 11, 0.2, 1.5).set_requires_grad();
  Tensor b = uniform({4}, 12, 0.5, 2.0).set_requires_grad();
  Tensor s = uniform({1}, 13, 0.5, 1.0).set_requires_grad();
  Tensor t = uniform({1}, 14, -0.5, 0.5).set_requires_grad();
  Tensor signed_x = uniform({3, 4}, 15, -2.0, 2.0).set_requires_grad();
  check_gradients([](const TensorList& in) { return add(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return sub(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return mul(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return div(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return maximum(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return minimum(in[0], in[1]); }, {a, b});
  check_gradients([](const TensorList& in) { return rsub(2.0, in[0]) / 3.0 + 1.0; }, {a});
  check_gradients([](const TensorList& in) { return pow(in[0], 2.5); }, {a});
  for (auto f : {&exp, &log, &sqrt, &rsqrt, &reciprocal}) {
    check_gradients([f](const TensorList& in) { return f(in[0]); }, {a});
  }
  ska::test::GradCheckOptions kinks;
  kinks.kink_range = 1e-3;
  for (auto f : {&neg, &abs, &sigmoid, &tanh, &relu, &quick_gelu, &squared_relu, &silu}) {
    check_gradients([f](const TensorList& in) { return f(in[0]); }, {signed_x}, kinks);
  }
  check_gradients([](const TensorList& in) { return gelu(in[0]); }, {signed_x});
  check_gradients([](const TensorList& in) { return gelu(in[0], true); }, {signed_x});
  check_gradients([](const TensorList& in) { return star_relu(in[0], in[1], in[2]); },
                  {signed_x, s, t}, kinks);
}

TEST_CASE("star_relu in one kernel equals its composition, also mixed with bf16", "[cpu]") {
  // 3 x 7000 elements: two chunks of the parameter-gradient sums.
  const Tensor x = uniform({3, 7000}, 31, -2.0, 2.0, DType::kF32);
  const Tensor s = uniform({1}, 32, 0.5, 1.0, DType::kF32);
  const Tensor b = uniform({1}, 33, -0.5, 0.5, DType::kF32);
  const Tensor w = uniform({3, 7000}, 34, -1.0, 1.0, DType::kF32);
  auto run = [&](bool fused, DType x_dtype) {
    const Tensor xi = x.to(x_dtype).detach().set_requires_grad();
    const Tensor si = s.clone().set_requires_grad(), bi = b.clone().set_requires_grad();
    const Tensor y = fused ? star_relu(xi, si, bi) : add(mul(squared_relu(xi), si), bi);
    sum(mul(y, w)).backward();
    return TensorList{y, xi.grad(), si.grad(), bi.grad()};
  };
  for (DType dt : {DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dt));
    const TensorList fused = run(true, dt), composed = run(false, dt);
    REQUIRE(fused[0].dtype() == DType::kF32);  // f32 parameters: f32 out, as the composition
    REQUIRE(fused[1].dtype() == dt);
    // The composition rounds relu(x)^2 to bf16 first; the fused op keeps it in f32.
    const ska::test::Tolerance tol = ska::test::tolerance_for(dt);
    ska::test::require_close(fused[0], composed[0], tol, "y");
    ska::test::require_close(fused[1], composed[1], tol, "grad x");
    ska::test::require_close(fused[2], composed[2], {1e-2, 2e-3}, "grad scale (21,000 terms)");
    ska::test::require_close(fused[3], composed[3], {1e-3, 1e-4}, "grad bias (21,000 terms)");
    const TensorList again = run(true, dt);
    CHECK(again[2].to_vector<float>() == fused[2].to_vector<float>());  // fixed order
  }
  CHECK_THROWS_WITH(star_relu(x, s.to(DType::kF64), b), Catch::Contains("star_relu"));
  CHECK_THROWS_WITH(star_relu(x, values({1, 2}, {2}).to(DType::kF32), b),
                    Catch::Contains("one element"));
}

TEST_CASE("star_relu writing x's 16-bit dtype: the f32 result rounded once, gradients alike",
          "[cpu]") {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    const Tensor x = uniform({3, 7000}, 41, -2.0, 2.0, DType::kF32).to(dt);
    const Tensor s = uniform({1}, 42, 0.5, 1.0, DType::kF32);
    const Tensor b = uniform({1}, 43, -0.5, 0.5, DType::kF32);
    const Tensor g = uniform({3, 7000}, 44, -1.0, 1.0, DType::kF32).to(dt);
    // The narrow output, its gradient arriving in that dtype...
    const Tensor x1 = x.detach().set_requires_grad(), s1 = s.clone().set_requires_grad(),
                 b1 = b.clone().set_requires_grad();
    const Tensor y1 = star_relu(x1, s1, b1, dt);
    REQUIRE(y1.dtype() == dt);
    sum(mul(y1, g)).backward();
    // ... against the f32 output cast after, as autocast's matrix product would cast it.
    const Tensor x2 = x.detach().set_requires_grad(), s2 = s.clone().set_requires_grad(),
                 b2 = b.clone().set_requires_grad();
    const Tensor y2 = star_relu(x2, s2, b2);
    REQUIRE(y2.dtype() == DType::kF32);
    sum(mul(y2.to(dt), g)).backward();
    CHECK(ska::test::bitwise_equal(y1, y2.to(dt)));
    CHECK(ska::test::bitwise_equal(x1.grad(), x2.grad()));
    CHECK(ska::test::bitwise_equal(s1.grad(), s2.grad()));
    CHECK(ska::test::bitwise_equal(b1.grad(), b2.grad()));
    CHECK_THROWS_WITH(star_relu(x, s, b, DType::kF64),
                      Catch::Contains("out_dtype") && Catch::Contains("f32"));
  }
}

TEST_CASE("where and masked_fill", "[cpu]") {
  const Tensor cond = gt(values({1, -1, 2}, {3}), values({0}, {1}));
  Tensor a = values({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad();
  Tensor b = values({-1}, {1}).set_requires_grad();
  Tensor y = where(cond, a, b);
  CHECK(y.to_vector<double>() == std::vector<double>{1, -1, 3, 4, -1, 6});
  sum(y).backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{1, 0, 1, 1, 0, 1});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{2});
  const Tensor diag = eq(Tensor::arange(3, DType::kF64).reshape({3, 1}),
                         Tensor::arange(3, DType::kF64).reshape({1, 3}));
  Tensor m = masked_fill(Tensor::ones({2, 3, 3}, DType::kF64), diag, -1e30);
  CHECK(m.to_vector<double>()[4] == -1e30);
  CHECK(m.to_vector<double>()[1] == 1.0);
  CHECK_THROWS_AS(masked_fill(Tensor::ones({3}, DType::kF64), diag, 0.0), ShapeError);
  CHECK_THROWS_WITH(where(a.detach(), a, b), Catch::Contains("condition must be u8"));
}

TEST_CASE("CUDA pointwise ops match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Tensor a = uniform({37, 65}, 1, -2.0, 2.0).set_requires_grad();
  Tensor b = uniform({65}, 2, 0.5, 2.0).set_requires_grad();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto f : {&exp, &sigmoid, &tanh, &relu, &quick_gelu, &squared_relu, &silu, &neg, &abs}) {
      ska::test::check_cuda_parity([f](const TensorList& in) { return f(in[0]); }, {a}, dt);
    }
    ska::test::check_cuda_parity([](const TensorList& in) { return gelu(in[0]); }, {a}, dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return gelu(in[0], true); }, {a}, dt);
    const Tensor s = uniform({1}, 3, 0.5, 1.0).set_requires_grad();
    const Tensor t = uniform({1}, 4, -0.5, 0.5).set_requires_grad();
    // The parameter gradients sum 37 x 65 products: an absolute bound of their scale in 16 bits.
    const ska::test::Tolerance sums = dt == DType::kF32 ? ska::test::tolerance_for(dt)
                                                        : ska::test::Tolerance{0.5, 2e-2};
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return star_relu(in[0], in[1], in[2]); }, {a, s, t}, dt, &sums);
    // b's gradient sums 37 rows of per-element products that were rounded to `dt` first, with
    // random signs: in 16 bits its error scales with the terms (|a / b^2| up to 8), not with the
    // (cancelled) sum, so it gets an absolute bound of that order (f16 has 3 more mantissa bits).
    const ska::test::Tolerance broadcast = dt == DType::kBF16  ? ska::test::Tolerance{8e-2, 2e-2}
                                           : dt == DType::kF16 ? ska::test::Tolerance{1e-2, 5e-3}
                                                               : ska::test::tolerance_for(dt);
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return div(in[0], in[1]) - 1.0; }, {a, b}, dt, &broadcast);
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return mul(in[0], in[1]) + in[1]; }, {a, b}, dt, &broadcast);
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return maximum(in[0], in[1]) * 2.0; }, {a, b}, dt, &broadcast);
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return masked_fill(in[0], gt(in[0], in[1]), 0.0); }, {a, b}, dt);
  }
}
