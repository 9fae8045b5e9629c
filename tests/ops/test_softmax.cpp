// Softmax and log-softmax: hand-computed values, masks (broadcast, -inf, fully masked rows),
// gradients of input and mask by finite differences, errors, and CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("softmax of a known row", "[cpu]") {
  const Tensor x = values({1, 2, 3}, {3});
  // exp(k) / (e + e^2 + e^3) for k = 1, 2, 3.
  const double total = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const Tensor expected = values({std::exp(1.0) / total, std::exp(2.0) / total,
                                  std::exp(3.0) / total}, {3});
  require_close(softmax(x), expected, tolerance_for(DType::kF64));
  require_close(softmax(x), values({0.09003057317038046, 0.24472847105479767,
                                    0.6652409557748219}, {3}), tolerance_for(DType::kF64));
  require_close(log_softmax(x), values({1 - std::log(total), 2 - std::log(total),
                                        3 - std::log(total)}, {3}), tolerance_for(DType::kF64));
  // scale 2 is softmax([2, 4, 6]).
  require_close(softmax(x, 2.0), values({0.015876239976466765, 0.11731042782619835,
                                         0.8668133321973348}, {3}), tolerance_for(DType::kF64));
  // f32 gives the same to f32 precision.
  require_close(softmax(x.to(DType::kF32)), expected, tolerance_for(DType::kF32));
  CHECK(softmax(x.to(DType::kF32)).dtype() == DType::kF32);
}

TEST_CASE("softmax is stable for large inputs and works on strided views", "[cpu]") {
  const Tensor big = values({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3});
  const Tensor small = values({0, 1, 2, 0, -1, -2}, {2, 3});
  require_close(softmax(big), softmax(small), tolerance_for(DType::kF64));
  require_close(log_softmax(big.to(DType::kF32)), log_softmax(small), tolerance_for(DType::kF32));
  // Rows of a transposed view.
  const Tensor x = uniform({4, 5}, 3);
  require_close(softmax(x.transpose(0, 1)), softmax(x.transpose(0, 1).contiguous()),
                tolerance_for(DType::kF64));
  // Every row of a 3-D softmax sums to 1.
  const Tensor rows = sum(softmax(uniform({2, 3, 7}, 4, -5.0, 5.0)), {-1});
  require_close(rows, Tensor::ones({2, 3}, DType::kF64), tolerance_for(DType::kF64));
}

TEST_CASE("softmax with an additive mask", "[cpu]") {
  SECTION("-inf entries get zero probability") {
    const Tensor x = values({1, 2, 3}, {1, 3});
    const Tensor mask = values({0, -kInf, 0}, {3});
    const double p0 = std::exp(1.0) / (std::exp(1.0) + std::exp(3.0));
    require_close(softmax(x, 1.0, mask), values({p0, 0.0, 1.0 - p0}, {1, 3}),
                  tolerance_for(DType::kF64));
    require_close(softmax(x, 1.0, mask), values({0.11920292202211755, 0.0, 0.8807970779778823},
                                                {1, 3}), tolerance_for(DType::kF64));
    const std::vector<double> logp = log_softmax(x, 1.0, mask).to_vector<double>();
    CHECK(logp[0] == Approx(std::log(p0)));
    CHECK(std::isinf(logp[1]));
    CHECK(logp[1] < 0);
  }
  SECTION("a fully masked row gives NaN, like PyTorch; other rows are unaffected") {
    const Tensor x = values({1, 2, 1, 2}, {2, 2});
    const Tensor mask = values({-kInf, -kInf, 0, 0}, {2, 2});
    const std::vector<double> y = softmax(x, 1.0, mask).to_vector<double>();
    CHECK(std::isnan(y[0]));
    CHECK(std::isnan(y[1]));
    CHECK(y[2] == Approx(1.0 / (1.0 + std::exp(1.0))));
  }
  SECTION("a broadcast mask equals the same mask materialised") {
    const Tensor x = uniform({2, 3, 4}, 5);
    const Tensor mask = uniform({2, 1, 4}, 6, -2.0, 0.0);
    const Tensor full = mask.expand({2, 3, 4}).contiguous();
    require_close(softmax(x, 0.5, mask), softmax(x, 0.5, full), tolerance_for(DType::kF64));
    const Tensor strided = uniform({4, 2}, 16).select(1, 0);  // [4] with stride 2
    require_close(log_softmax(x, 0.5, strided),
                  log_softmax(x, 0.5, strided.expand({2, 3, 4}).contiguous()),
                  tolerance_for(DType::kF64));
    // z = 0.5 * x + mask, written out.
    require_close(softmax(x, 0.5, mask), softmax(add(mul(x, 0.5), mask)),
                  tolerance_for(DType::kF64));
  }
}

TEST_CASE("softmax gradients match finite differences", "[cpu]") {
  Tensor x = uniform({2, 3, 4}, 7, -2.0, 2.0).set_requires_grad();
  Tensor bias = uniform({3, 4}, 8, -1.0, 1.0).set_requires_grad();  // e.g. relative position bias
  Tensor head_bias = uniform({2, 1, 4}, 9, -1.0, 1.0).set_requires_grad();
  check_gradients([](const TensorList& in) { return softmax(in[0]); }, {x});
  check_gradients([](const TensorList& in) { return log_softmax(in[0]); }, {x});
  check_gradients([](const TensorList& in) { return softmax(in[0], 0.7); }, {x});
  check_gradients([](const TensorList& in) { return log_softmax(in[0], -1.3); }, {x});
  check_gradients([](const TensorList& in) { return softmax(in[0], 0.7, in[1]); }, {x, bias});
  check_gradients([](const TensorList& in) { return log_softmax(in[0], 0.7, in[1]); }, {x, bias});
  check_gradients([](const TensorList& in) { return softmax(in[0], 1.5, in[1]); }, {x, head_bias});
  // Only the mask requires grad.
  const Tensor x_const = x.detach();
  check_gradients([](const TensorList& in) { return softmax(in[0], 0.7, in[1]); },
                  {x_const, bias});
  // Through a transposed input.
  check_gradients([](const TensorList& in) { return softmax(in[0].transpose(1, 2), 0.5); }, {x});
}

TEST_CASE("softmax gradient ignores masked-out entries", "[cpu]") {
  Tensor x = values({0.5, -0.2, 0.9}, {1, 3}).set_requires_grad();
  const Tensor mask = values({0, -kInf, 0}, {3});
  sum(mul(softmax(x, 1.0, mask), values({1, 2, 3}, {3}))).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  CHECK(g[1] == 0.0);
  CHECK(g[0] + g[2] == Approx(0.0).margin(1e-12));  // the probabilities still sum to 1
}

TEST_CASE("softmax rejects bad arguments", "[cpu]") {
  const Tensor x = uniform({2, 3}, 10);
  CHECK_THROWS_AS(softmax(x, 1.0, uniform({2}, 11)), ShapeError);
  CHECK_THROWS_WITH(softmax(x, 1.0, uniform({4, 2, 3}, 11)),
                    Catch::Contains("softmax") && Catch::Contains("[4, 2, 3]") &&
                        Catch::Contains("[2, 3]"));
  CHECK_THROWS_AS(softmax(x, 1.0, uniform({3}, 12, -1.0, 1.0, DType::kF32)), DTypeError);
  CHECK_THROWS_AS(log_softmax(Tensor::scalar(1.0, DType::kF64)), ShapeError);
  CHECK_THROWS_AS(softmax(Tensor::zeros({2, 3}, DType::kI64)), DTypeError);
}

TEST_CASE("CUDA softmax matches the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 33}, Shape{3, 1024}, Shape{2, 4097}}) {
      Tensor x = uniform(shape, 20, -3.0, 3.0).set_requires_grad();
      ska::test::check_cuda_parity([](const TensorList& in) { return softmax(in[0]); }, {x}, dt);
      ska::test::check_cuda_parity([](const TensorList& in) { return log_softmax(in[0], 0.125); },
                                   {x}, dt);
    }
    Tensor x = uniform({2, 3, 16, 16}, 21, -3.0, 3.0).set_requires_grad();
    Tensor bias = uniform({3, 16, 16}, 22, -1.0, 1.0).set_requires_grad();
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return softmax(in[0], 0.25, in[1]); }, {x, bias}, dt);
    Tensor causal = uniform({16, 16}, 23);
    ska::test::check_cuda_parity(
        [](const TensorList& in) {
          const Tensor upper = gt(in[1], Tensor::full({}, 0.5, in[1].dtype(), in[1].device()));
          const Tensor mask = masked_fill(Tensor::zeros({16, 16}, in[0].dtype(), in[0].device()),
                                          upper, -1e4);
          return softmax(in[0], 1.0, mask);
        },
        {x, causal}, dt);
  }
}
