// The autograd engine: accumulation, shared subexpressions, freeing, no_grad and hooks.
#include <catch2/catch.hpp>

#include "support/test_util.h"

using namespace ska;
using ska::test::values;

TEST_CASE("gradients accumulate over uses and over backward calls", "[cpu]") {
  Tensor x = values({1, 2, 3}, {3}).set_requires_grad();
  Tensor y = sum(mul(x, x) + x);  // dy/dx = 2x + 1
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 5, 7});
  sum(mul(x, 2.0)).backward();  // accumulates 2
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("diamond graph: a value used by two branches gets both contributions", "[cpu]") {
  Tensor x = values({0.5, -1.0}, {2}).set_requires_grad();
  Tensor h = exp(x);
  Tensor y = sum(mul(h, h) + mul(h, 3.0));  // dy/dx = (2h + 3) h
  y.backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    const double hv = std::exp(i == 0 ? 0.5 : -1.0);
    CHECK(g[i] == Approx((2 * hv + 3) * hv).epsilon(1e-12));
  }
}

TEST_CASE("the graph is freed after backward", "[cpu]") {
  Tensor x = values({1, 2}, {2}).set_requires_grad();
  Tensor y = sum(exp(x));
  y.backward();
  CHECK_THROWS_AS(y.backward(), AutogradError);
}

TEST_CASE("no_grad records nothing, detach cuts history", "[cpu]") {
  Tensor x = values({1, 2}, {2}).set_requires_grad();
  {
    NoGradGuard guard;
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  Tensor d = mul(x, 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK_THROWS_AS(sum(d).backward(), AutogradError);
}

TEST_CASE("backward of a non-scalar needs an explicit gradient", "[cpu]") {
  Tensor x = values({1, 2}, {2}).set_requires_grad();
  Tensor y = mul(x, 3.0);
  CHECK_THROWS_AS(y.backward(), AutogradError);
  y.backward(values({1, 10}, {2}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 30});
}

TEST_CASE("grad-ready hooks fire once per leaf with the final gradient", "[cpu]") {
  Tensor a = values({1, 2}, {2}).set_requires_grad();
  Tensor b = values({3}, {1}).set_requires_grad();
  std::vector<std::pair<char, std::vector<double>>> fired;
  a.register_grad_ready_hook([&](const Tensor& g) { fired.push_back({'a', g.to_vector<double>()}); });
  b.register_grad_ready_hook([&](const Tensor& g) { fired.push_back({'b', g.to_vector<double>()}); });
  // a is used twice; its hook must see the summed gradient, once.
  Tensor y = sum(mul(a, b) + mul(a, a));
  y.backward();
  REQUIRE(fired.size() == 2);
  for (const auto& [name, g] : fired) {
    if (name == 'a') CHECK(g == std::vector<double>{3 + 2, 3 + 4});
    if (name == 'b') CHECK(g == std::vector<double>{3});
  }
  CHECK_THROWS_AS(mul(a, 2.0).register_grad_ready_hook([](const Tensor&) {}), AutogradError);
}

TEST_CASE("gradients flow through views and conversions", "[cpu]") {
  Tensor x = ska::test::uniform({2, 3, 4}, 1).set_requires_grad();
  ska::test::check_gradients(
      [](const TensorList& in) {
        const Tensor& t = in[0];
        Tensor v = t.permute({2, 0, 1}).narrow(0, 1, 2).reshape({2, 6}).expand({3, 2, 6});
        return mul(v, v) + sum(t.select(1, 2));
      },
      {x});
}

TEST_CASE("dtype conversion passes the gradient back in the input dtype", "[cpu]") {
  Tensor x = values({1, 2}, {2}).set_requires_grad();
  Tensor y = sum(mul(x.to(DType::kF32), 3.0));
  y.backward();
  CHECK(x.grad().dtype() == DType::kF64);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 3});
}
