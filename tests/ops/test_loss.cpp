// Cross-entropy: hand-computed losses for class targets, label smoothing and soft targets,
// gradients by finite differences, errors, and CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>

#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {

// Logits [[1, 2, 3], [1, 1, 1]] and their log-sum-exps, written out.
const std::vector<double> kLogits = {1, 2, 3, 1, 1, 1};
const double kLse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
const double kLse1 = std::log(3.0) + 1.0;

// -sum_j q_j * log_softmax_j of row 0 / row 1 for a target distribution q.
double row0_loss(double q0, double q1, double q2) {
  return q0 * (kLse0 - 1) + q1 * (kLse0 - 2) + q2 * (kLse0 - 3);
}
double row1_loss(double q0, double q1, double q2) { return (q0 + q1 + q2) * (kLse1 - 1); }

}  // namespace

TEST_CASE("cross-entropy with class targets", "[cpu]") {
  const Tensor logits = values(kLogits, {2, 3});
  const Tensor target = values({2, 0}, {2}, DType::kI64);
  const Tensor loss = cross_entropy(logits, target);
  CHECK(loss.dim() == 0);
  CHECK(loss.dtype() == DType::kF64);
  // Row 0: lse - 3 = 0.40760596444438; row 1: log 3.
  const double expected = ((kLse0 - 3) + std::log(3.0)) / 2;
  CHECK(loss.item() == Approx(expected).epsilon(1e-12));
  CHECK(loss.item() == Approx((0.40760596444438013 + 1.0986122886681098) / 2).epsilon(1e-12));
  const Tensor loss32 = cross_entropy(logits.to(DType::kF32), target);
  CHECK(loss32.dtype() == DType::kF32);
  CHECK(loss32.dim() == 0);
  CHECK(loss32.item() == Approx(expected).epsilon(1e-6));
  // Stable for large logits: shifting a row changes nothing.
  CHECK(cross_entropy(add(logits, 1000.0), target).item() == Approx(expected).epsilon(1e-12));
}

TEST_CASE("cross-entropy with label smoothing 0.1", "[cpu]") {
  const Tensor logits = values(kLogits, {2, 3});
  const Tensor target = values({2, 0}, {2}, DType::kI64);
  // q = 0.9 * onehot + 0.1 / 3.
  const double e = 0.1 / 3;
  const double expected = (row0_loss(e, e, 0.9 + e) + row1_loss(0.9 + e, e, e)) / 2;
  CHECK(cross_entropy(logits, target, 0.1).item() == Approx(expected).epsilon(1e-12));
  // Smoothing 1 is the uniform target.
  CHECK(cross_entropy(logits, target, 1.0).item() ==
        Approx((row0_loss(1.0 / 3, 1.0 / 3, 1.0 / 3) + (kLse1 - 1)) / 2).epsilon(1e-12));
}

TEST_CASE("cross-entropy with soft targets", "[cpu]") {
  const Tensor logits = values(kLogits, {2, 3});
  const Tensor soft = values({0.2, 0.3, 0.5, 1, 0, 0}, {2, 3});
  const double plain = (row0_loss(0.2, 0.3, 0.5) + row1_loss(1, 0, 0)) / 2;
  CHECK(cross_entropy(logits, soft).item() == Approx(plain).epsilon(1e-12));
  // (1 - eps) * t + eps / C.
  const double e = 0.1 / 3;
  const double smoothed =
      (row0_loss(0.9 * 0.2 + e, 0.9 * 0.3 + e, 0.9 * 0.5 + e) + row1_loss(0.9 + e, e, e)) / 2;
  CHECK(cross_entropy(logits, soft, 0.1).item() == Approx(smoothed).epsilon(1e-12));
  // A one-hot soft target equals the class target.
  const Tensor onehot = values({0, 0, 1, 1, 0, 0}, {2, 3});
  CHECK(cross_entropy(logits, onehot, 0.1).item() ==
        Approx(cross_entropy(logits, values({2, 0}, {2}, DType::kI64), 0.1).item()));
}

TEST_CASE("cross-entropy gradients match finite differences", "[cpu]") {
  Tensor logits = uniform({4, 5}, 80, -3.0, 3.0).set_requires_grad();
  const Tensor target = values({0, 4, 2, 2}, {4}, DType::kI64);
  check_gradients([&](const TensorList& in) { return cross_entropy(in[0], target); }, {logits});
  check_gradients([&](const TensorList& in) { return cross_entropy(in[0], target, 0.1); },
                  {logits});
  // Soft targets (mixup-like rows that sum to 1), with gradients for the targets too.
  const Tensor raw = uniform({4, 5}, 81, 0.1, 1.0);
  Tensor soft = div(raw, sum(raw, {1}, true)).set_requires_grad();
  check_gradients([](const TensorList& in) { return cross_entropy(in[0], in[1]); },
                  {logits, soft});
  check_gradients([](const TensorList& in) { return cross_entropy(in[0], in[1], 0.2); },
                  {logits, soft});
  // Targets that do not sum to 1 still get the exact gradient.
  Tensor loose = uniform({4, 5}, 82, 0.0, 1.0).set_requires_grad();
  check_gradients([](const TensorList& in) { return cross_entropy(in[0], in[1], 0.1); },
                  {logits, loose});
  // Through a transposed view of the logits.
  Tensor logits_t = uniform({5, 4}, 83, -3.0, 3.0).set_requires_grad();
  check_gradients([&](const TensorList& in) { return cross_entropy(in[0].transpose(0, 1), target); },
                  {logits_t});
}

TEST_CASE("cross-entropy gradient is softmax minus the target over the batch", "[cpu]") {
  Tensor logits = values(kLogits, {2, 3}).set_requires_grad();
  cross_entropy(logits, values({2, 0}, {2}, DType::kI64)).backward();
  const Tensor p = softmax(logits.detach());
  const Tensor onehot = values({0, 0, 1, 1, 0, 0}, {2, 3});
  require_close(logits.grad(), div(sub(p, onehot), 2.0), tolerance_for(DType::kF64));
}

TEST_CASE("cross-entropy rejects bad arguments", "[cpu]") {
  const Tensor logits = values(kLogits, {2, 3});
  CHECK_THROWS_AS(cross_entropy(logits, values({3, 0}, {2}, DType::kI64)), ValueError);
  CHECK_THROWS_WITH(cross_entropy(logits, values({0, 3}, {2}, DType::kI64)),
                    Catch::Contains("class 3") && Catch::Contains("3 classes"));
  CHECK_THROWS_WITH(cross_entropy(logits, values({-1, 0}, {2}, DType::kI64)),
                    Catch::Contains("-1") && Catch::Contains("3 classes"));
  CHECK_THROWS_AS(cross_entropy(logits, values({0, 1, 2}, {3}, DType::kI64)), ShapeError);
  CHECK_THROWS_AS(cross_entropy(logits, values({0.5, 0.5}, {1, 2})), ShapeError);
  CHECK_THROWS_AS(cross_entropy(logits, values({0, 1}, {2}, DType::kI32)), DTypeError);
  CHECK_THROWS_AS(cross_entropy(logits, uniform({2, 3}, 84, 0, 1, DType::kF32)), DTypeError);
  CHECK_THROWS_AS(cross_entropy(values({1, 2, 3}, {3}), values({0}, {1}, DType::kI64)),
                  ShapeError);
  CHECK_THROWS_AS(cross_entropy(logits, values({0, 1}, {2}, DType::kI64), 1.5), ValueError);
  CHECK_THROWS_AS(cross_entropy(logits, values({0, 1}, {2}, DType::kI64), -0.1), ValueError);
}

TEST_CASE("CUDA cross-entropy matches the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : {Shape{4, 10}, Shape{33, 100}, Shape{8, 1000}, Shape{2, 5000}}) {
      Tensor logits = uniform(shape, 90, -4.0, 4.0).set_requires_grad();
      std::vector<double> cls;
      for (int64_t n = 0; n < shape[0]; ++n) cls.push_back(static_cast<double>((n * 7) % shape[1]));
      const Tensor target = values(cls, {shape[0]}, DType::kI64);
      const Tensor raw = uniform(shape, 91, 0.1, 1.0);
      const Tensor soft = div(raw, sum(raw, {1}, true));
      for (double smoothing : {0.0, 0.1}) {
        ska::test::check_cuda_parity([smoothing](const TensorList& in) {
          return cross_entropy(in[0], in[1], smoothing);
        }, {logits, target}, dt);
        ska::test::check_cuda_parity([smoothing](const TensorList& in) {
          return cross_entropy(in[0], in[1], smoothing);
        }, {logits, soft}, dt);
      }
    }
  }
}
