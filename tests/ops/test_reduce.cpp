// Reductions: values, keepdim, gradients, strided inputs, CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::uniform;
using ska::test::values;

TEST_CASE("sum, mean, amax, amin over chosen dims", "[cpu]") {
  const Tensor x = Tensor::arange(24, DType::kF64).reshape({2, 3, 4});
  CHECK(sum(x).item() == 276.0);
  CHECK(sum(x).dim() == 0);
  CHECK(sum(x, {0, 2}).to_vector<double>() == std::vector<double>{60, 92, 124});
  CHECK(sum(x, {-1}, true).shape() == Shape{2, 3, 1});
  CHECK(mean(x, {1}).to_vector<double>() ==
        std::vector<double>{4, 5, 6, 7, 16, 17, 18, 19});
  CHECK(amax(x, {0, 1}).to_vector<double>() == std::vector<double>{20, 21, 22, 23});
  CHECK(amin(x, {2}).to_vector<double>() == std::vector<double>{0, 4, 8, 12, 16, 20});
  // Strided input (a transposed view).
  CHECK(sum(x.transpose(0, 2), {2}).to_vector<double>() == sum(x, {0}).transpose(0, 1).contiguous().to_vector<double>());
  CHECK_THROWS_AS(sum(x, {3}), ShapeError);
  CHECK_THROWS_AS(sum(x, {1, 1}), ShapeError);
}

TEST_CASE("argmax and topk", "[cpu]") {
  const Tensor x = values({3, 9, 9, 1, 7, 2, 8, 8}, {2, 4});
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 2});  // first of ties
  CHECK(argmax(x, 0, true).shape() == Shape{1, 4});
  auto [v, i] = topk(x, 3);
  CHECK(v.to_vector<double>() == std::vector<double>{9, 9, 3, 8, 8, 7});
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 0, 2, 3, 0});
  auto [v0, i0] = topk(x, 1, 0);
  CHECK(v0.to_vector<double>() == std::vector<double>{7, 9, 9, 8});
  CHECK(i0.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1});
  CHECK_THROWS_AS(topk(x, 5), ValueError);
}

TEST_CASE("reduction gradients", "[cpu]") {
  Tensor x = uniform({3, 4, 5}, 21).set_requires_grad();
  check_gradients([](const TensorList& in) { return sum(in[0], {1}); }, {x});
  check_gradients([](const TensorList& in) { return mean(in[0], {0, 2}, true); }, {x});
  check_gradients([](const TensorList& in) { return amax(in[0], {2}); }, {x});
  check_gradients([](const TensorList& in) { return amin(in[0], {0, 1}); }, {x});
  check_gradients([](const TensorList& in) { return sum_to_shape(in[0], {4, 1}); }, {x});
  // Tied maxima share the gradient equally.
  Tensor t = values({1, 5, 5, 2}, {4}).set_requires_grad();
  amax(t).backward();
  CHECK(t.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0});
}

TEST_CASE("CPU column reductions (leading dims) give the packed path's bits", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const Shape& shape : {Shape{3000, 7}, Shape{257, 384}, Shape{5, 2, 33}}) {
      Tensor x = uniform(shape, 41, -2.0, 2.0).to(dt);
      x.flatten().narrow(0, 100, 1).fill_(NAN);
      // The same values as a non-contiguous view: reduced through a packed transposed copy.
      const Tensor strided = x.transpose(0, 1).contiguous().transpose(0, 1);
      REQUIRE_FALSE(strided.is_contiguous());
      const std::vector<int64_t> dims = shape.size() == 3 ? std::vector<int64_t>{0, 1}
                                                          : std::vector<int64_t>{0};
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
        INFO(dtype_name(dt) << " " << shape_str(shape) << " " << reduce_op_name(op));
        Shape out_shape = shape;
        for (int64_t d : dims) out_shape[static_cast<size_t>(d)] = 1;
        Tensor a = Tensor::empty(out_shape, dt), b = Tensor::empty(out_shape, dt);
        cpu::reduce(op, x, dims, a);
        cpu::reduce(op, strided, dims, b);
        const Tensor af = a.to(DType::kF64), bf = b.to(DType::kF64);
        const std::vector<double> av = af.to_vector<double>(), bv = bf.to_vector<double>();
        REQUIRE(av.size() == bv.size());
        for (size_t i = 0; i < av.size(); ++i) {
          if (std::isnan(bv[i])) {
            CHECK(std::isnan(av[i]));
          } else {
            CHECK(av[i] == bv[i]);
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA reductions match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Tensor x = uniform({7, 33, 129}, 5).set_requires_grad();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::vector<int64_t> dims : {std::vector<int64_t>{2}, {0}, {0, 2}, {1}, {}}) {
      ska::test::check_cuda_parity([dims](const TensorList& in) { return sum(in[0], dims); }, {x}, dt);
      ska::test::check_cuda_parity([dims](const TensorList& in) { return mean(in[0], dims); }, {x}, dt);
      ska::test::check_cuda_parity([dims](const TensorList& in) { return amax(in[0], dims); }, {x}, dt);
    }
  }
  const Tensor y = uniform({5, 1000}, 6);
  CHECK(argmax(y.to(Device::cuda(0), DType::kF32), 1).to_vector<int64_t>() ==
        argmax(y, 1).to_vector<int64_t>());
  auto [vc, ic] = topk(y.to(Device::cuda(0), DType::kF32), 5);
  auto [v, i] = topk(y, 5);
  CHECK(ic.to_vector<int64_t>() == i.to_vector<int64_t>());
}
