// Reductions: values, keepdim, gradients, strided inputs, CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

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

namespace {

// sum(a * b) in double from the values, as the reference for the dot kernels.
double dot_reference(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  double s = 0.0;
  for (size_t i = 0; i < av.size(); ++i) s += av[i] * bv[i];
  return s;
}

// The operand pairs the dot kernels meet: contiguous; q and its gradient as [B, h, N, d] views
// into packed [B, N, 3, h, d] tensors (rows of h * d); transposed views of different layouts (no
// common rows: copied first); more than one block's chunk; empty.
std::vector<std::pair<Tensor, Tensor>> dot_cases(DType dt) {
  std::vector<std::pair<Tensor, Tensor>> out;
  out.emplace_back(uniform({3, 5, 7}, 1).to(dt), uniform({3, 5, 7}, 2).to(dt));
  const Tensor packed_a = uniform({4, 9, 3, 2, 8}, 3).to(dt),
               packed_b = uniform({4, 9, 3, 2, 8}, 4).to(dt);
  out.emplace_back(packed_a.select(2, 0).permute({0, 2, 1, 3}),
                   packed_b.select(2, 0).permute({0, 2, 1, 3}));
  out.emplace_back(uniform({6, 10}, 5).to(dt).transpose(0, 1), uniform({10, 6}, 6).to(dt));
  out.emplace_back(uniform({70000}, 7).to(dt), uniform({70000}, 8).to(dt));
  out.emplace_back(Tensor::zeros({0, 4}, dt), Tensor::zeros({0, 4}, dt));
  return out;
}

}  // namespace

TEST_CASE("dot: sum(a * b) over any views, in f64 on the CPU", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const auto& [a, b] : dot_cases(dt)) {
      INFO(dtype_name(dt) << " " << a.str());
      const Tensor out = Tensor::empty({1}, dt == DType::kF64 ? DType::kF64 : DType::kF32);
      cpu::dot(a, b, out);
      const double want = dot_reference(a, b);
      CHECK(out.item() == Approx(want).epsilon(dt == DType::kF64 ? 1e-13 : 1e-6).margin(1e-9));
    }
  }
  const Tensor x = uniform({4}, 9);
  CHECK_THROWS_WITH(cpu::dot(x, uniform({5}, 10), Tensor::empty({1}, DType::kF64)),
                    Catch::Contains("one shape"));
  CHECK_THROWS_AS(cpu::dot(x, x, Tensor::empty({1}, DType::kF32)), ValueError);
}

#ifdef SKA_WITH_CUDA
TEST_CASE("dot on CUDA: the CPU's sums, the same bits every call", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [a, b] : dot_cases(dt)) {
      INFO(dtype_name(dt) << " " << a.str());
      const Tensor ag = a.to(Device::cuda(0)), bg = b.to(Device::cuda(0));
      // The views keep their layouts on the device (to() of a view copies it contiguous).
      const Tensor out1 = Tensor::empty({1}, DType::kF32, Device::cuda(0));
      const Tensor out2 = Tensor::empty({1}, DType::kF32, Device::cuda(0));
      cuda::dot(ag, bg, out1);
      cuda::dot(ag, bg, out2);
      CHECK(out1.item() == out2.item());
      CHECK(out1.item() == Approx(dot_reference(a, b)).epsilon(1e-5).margin(1e-6));
    }
    // A strided pair on the device: q and its gradient inside packed projections.
    const Tensor packed_a = uniform({4, 9, 3, 2, 8}, 3).to(Device::cuda(0), dt);
    const Tensor packed_b = uniform({4, 9, 3, 2, 8}, 4).to(Device::cuda(0), dt);
    const Tensor qa = packed_a.select(2, 0).permute({0, 2, 1, 3});
    const Tensor qb = packed_b.select(2, 0).permute({0, 2, 1, 3});
    REQUIRE_FALSE(qa.is_contiguous());
    const Tensor out = Tensor::empty({1}, DType::kF32, Device::cuda(0));
    cuda::dot(qa, qb, out);
    CHECK(out.item() == Approx(dot_reference(qa, qb)).epsilon(1e-5));
  }
}
#endif
