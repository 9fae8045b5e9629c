// index_select and gather: values against hand-written cases, repeated indices in the gradients,
// gradients by finite differences, range and shape errors, and CUDA parity.
#include <catch2/catch.hpp>
#include <cstdint>

#include "backend/backend.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {

Tensor indices(const std::vector<int64_t>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape);
}

}  // namespace

TEST_CASE("index_select picks whole slices along a dim", "[cpu]") {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {3, 2});  // rows [1 2] [3 4] [5 6]
  const Tensor rows = index_select(x, 0, indices({2, 0, 2}, {3}));
  CHECK(rows.shape() == Shape{3, 2});
  CHECK(rows.to_vector<double>() == std::vector<double>{5, 6, 1, 2, 5, 6});
  const Tensor cols = index_select(x, -1, indices({1}, {1}));
  CHECK(cols.shape() == Shape{3, 1});
  CHECK(cols.to_vector<double>() == std::vector<double>{2, 4, 6});
  // The middle dim of a 3-d tensor, f32, a strided input and i32 indices.
  const Tensor x3 = values({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 3, 2}, DType::kF32);
  CHECK(index_select(x3, 1, indices({1, 1}, {2})).to_vector<float>() ==
        std::vector<float>{2, 3, 2, 3, 8, 9, 8, 9});
  CHECK(index_select(x.transpose(0, 1), 1, indices({2, 1}, {2})).to_vector<double>() ==
        std::vector<double>{5, 3, 6, 4});
  CHECK(index_select(x, 0, Tensor::from_vector(std::vector<int32_t>{1}, {1})).to_vector<double>() ==
        std::vector<double>{3, 4});
  CHECK(index_select(x, 0, indices({}, {0})).shape() == Shape{0, 2});
}

TEST_CASE("gather picks one element per index like torch.gather", "[cpu]") {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {2, 3});  // [[1 2 3] [4 5 6]]
  // dim 1: out[i][j] = x[i][index[i][j]]
  CHECK(gather(x, 1, indices({2, 0, 0, 1, 1, 1}, {2, 3})).to_vector<double>() ==
        std::vector<double>{3, 1, 1, 5, 5, 5});
  // dim 0: out[i][j] = x[index[i][j]][j]
  CHECK(gather(x, 0, indices({1, 0, 1}, {1, 3})).to_vector<double>() ==
        std::vector<double>{4, 2, 6});
  // An index smaller than x along the other dims.
  CHECK(gather(x, 1, indices({1, 2}, {2, 1})).to_vector<double>() == std::vector<double>{2, 6});
  // A relative position bias lookup: table [num_rel, heads] gathered with a flattened index.
  const Tensor table = values({10, 20, 30, 40, 50, 60}, {3, 2});
  const Tensor rel = indices({1, 0, 2, 1}, {4});
  CHECK(index_select(table, 0, rel).to_vector<double>() ==
        std::vector<double>{30, 40, 10, 20, 50, 60, 30, 40});
}

TEST_CASE("index gradients accumulate repeated indices", "[cpu]") {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {3, 2}).set_requires_grad();
  sum(index_select(x, 0, indices({2, 0, 2}, {3}))).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1, 0, 0, 2, 2});
  const Tensor y = values({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad();
  sum(gather(y, 1, indices({2, 0, 0, 1, 1, 1}, {2, 3}))).backward();
  CHECK(y.grad().to_vector<double>() == std::vector<double>{2, 0, 1, 0, 3, 0});
}

TEST_CASE("index gradients match finite differences", "[cpu]") {
  const Tensor x = uniform({4, 3, 5}, 1).set_requires_grad();
  for (int64_t dim : {0, 1, 2}) {
    const Tensor idx = indices({2, 0, 2, 1}, {4});
    check_gradients([dim, idx](const TensorList& in) { return index_select(in[0], dim, idx); },
                    {x});
  }
  const Tensor g0 = indices({3, 0, 1, 3, 3, 2}, {2, 3, 1});
  check_gradients([g0](const TensorList& in) { return gather(in[0], 0, g0); }, {x});
  const Tensor g2 = indices({4, 4, 0, 1, 2, 3, 0, 0, 1, 1, 2, 2}, {2, 3, 2});
  check_gradients([g2](const TensorList& in) { return gather(in[0], 2, g2); }, {x});
  check_gradients([g2](const TensorList& in) { return gather(in[0].transpose(0, 2), 2, g2); },
                  {uniform({5, 3, 4}, 2).set_requires_grad()});
}

TEST_CASE("index ops reject bad indices and shapes", "[cpu]") {
  const Tensor x = uniform({3, 2}, 1);
  CHECK_THROWS_AS(index_select(x, 0, indices({0, 3}, {2})), ValueError);
  CHECK_THROWS_WITH(index_select(x, 0, indices({0, 3}, {2})), Catch::Contains("index_select") &&
                                                                  Catch::Contains("index 3") &&
                                                                  Catch::Contains("size 3"));
  CHECK_THROWS_WITH(index_select(x, 1, indices({-1}, {1})),
                    Catch::Contains("index -1") && Catch::Contains("size 2"));
  CHECK_THROWS_AS(index_select(x, 2, indices({0}, {1})), ShapeError);
  CHECK_THROWS_AS(index_select(x, 0, indices({0, 1}, {1, 2})), ShapeError);
  CHECK_THROWS_AS(index_select(x, 0, values({0}, {1})), DTypeError);
  CHECK_THROWS_WITH(gather(x, 1, indices({0, 2}, {1, 2})), Catch::Contains("gather") &&
                                                               Catch::Contains("index 2") &&
                                                               Catch::Contains("size 2"));
  CHECK_THROWS_AS(gather(x, 1, indices({0, 1}, {2})), ShapeError);
  CHECK_THROWS_AS(gather(x, 1, indices({0, 0, 0, 0}, {4, 1})), ShapeError);
  CHECK_THROWS_AS(gather(Tensor::zeros({3}, DType::kI64), 0, indices({0}, {1})), DTypeError);
  // The kernels check too, before writing anything.
  Tensor out = Tensor::zeros({3, 2}, DType::kF64);
  CHECK_THROWS_AS(cpu::index_add(uniform({1, 2}, 2), 0, indices({5}, {1}), out), ValueError);
  CHECK_THROWS_AS(cpu::scatter_add(uniform({1, 2}, 3), 0, indices({0, -2}, {1, 2}), out),
                  ValueError);
  CHECK(out.to_vector<double>() == std::vector<double>(6, 0.0));
}

TEST_CASE("CUDA index ops match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor table = uniform({169, 6}, 1).set_requires_grad();  // 13 x 13 relative positions
  std::vector<int64_t> rel;
  for (int64_t i = 0; i < 49; ++i) {
    for (int64_t j = 0; j < 49; ++j) rel.push_back((i / 7 - j / 7 + 6) * 13 + (i % 7 - j % 7 + 6));
  }
  const Tensor rel_index = indices(rel, {49 * 49});
  const Tensor x = uniform({4, 33, 5}, 2).set_requires_grad();
  std::vector<int64_t> g;
  for (int64_t i = 0; i < 4 * 20 * 5; ++i) g.push_back((i * 7 + 3) % 33);
  const Tensor gather_index = indices(g, {4, 20, 5});
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    ska::test::check_cuda_parity(
        [rel_index](const TensorList& in) {
          return index_select(in[0], 0, rel_index.to(in[0].device()));
        },
        {table},
        dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return index_select(in[0], 1, in[1]); },
                                 {x, indices({32, 0, 5, 5, 17}, {5})}, dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return gather(in[0], 1, in[1]); },
                                 {x, gather_index}, dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return gather(in[0], 2, in[1]); },
                                 {x, indices(std::vector<int64_t>(4 * 33 * 2, 4), {4, 33, 2})}, dt);
  }
}
