// matmul and linear: values against hand-computed and loop-computed products, broadcasting and
// 1-d promotion, transposed operands, gradients by finite differences, errors, and CUDA parity.
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "core/precision.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {

// The product of contiguous 2-d matrices by three plain loops.
Tensor loop_matmul(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += av[i * k + p] * bv[p * n + j];
    }
  }
  return values(c, {m, n});
}

const ska::test::Tolerance kF64 = tolerance_for(DType::kF64);

}  // namespace

TEST_CASE("matmul of a 2x3 by a 3x2 matches the hand-computed product", "[cpu]") {
  const Tensor a = values({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = values({7, 8, 9, 10, 11, 12}, {3, 2});
  const Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 2});
  CHECK(c.to_vector<double>() == std::vector<double>{58, 64, 139, 154});
  // f32 goes through sgemm.
  CHECK(matmul(a.to(DType::kF32), b.to(DType::kF32)).to_vector<float>() ==
        std::vector<float>{58, 64, 139, 154});
  // b^T a^T = (a b)^T, with both operands column-major views.
  CHECK(matmul(b.transpose(0, 1), a.transpose(0, 1)).to_vector<double>() ==
        std::vector<double>{58, 139, 64, 154});
}

TEST_CASE("matmul promotes 1-d operands like torch.matmul", "[cpu]") {
  const Tensor m = values({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor v3 = values({1, 0, -1}, {3});
  const Tensor v2 = values({2, -1}, {2});
  const Tensor mv = matmul(m, v3);
  CHECK(mv.shape() == Shape{2});
  CHECK(mv.to_vector<double>() == std::vector<double>{-2, -2});
  const Tensor vm = matmul(v2, m);
  CHECK(vm.shape() == Shape{3});
  CHECK(vm.to_vector<double>() == std::vector<double>{-2, -1, 0});
  const Tensor vv = matmul(v3, values({4, 5, 6}, {3}));
  CHECK(vv.shape() == Shape{});
  CHECK(vv.item() == -2.0);
  // A batch of matrices times a vector, and a vector times a batch.
  const Tensor batch = uniform({4, 2, 3}, 1);
  const Tensor bv = matmul(batch, v3);
  CHECK(bv.shape() == Shape{4, 2});
  require_close(bv.select(0, 2), matmul(batch.select(0, 2), v3), kF64);
  const Tensor vb = matmul(v2, batch);
  CHECK(vb.shape() == Shape{4, 3});
  require_close(vb.select(0, 3), matmul(v2, batch.select(0, 3)), kF64);
}

TEST_CASE("matmul matches loops on random and degenerate shapes", "[cpu]") {
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 7, 5}, {5, 7, 1}, {17, 33, 9}, {64, 70, 65}, {3, 1, 4}}) {
    const Tensor a = uniform({m, k}, 10 + m), b = uniform({k, n}, 20 + n);
    require_close(matmul(a, b), loop_matmul(a, b), kF64, "matmul vs loops");
    const Tensor a32 = a.to(DType::kF32), b32 = b.to(DType::kF32);
    require_close(matmul(a32, b32), loop_matmul(a, b), tolerance_for(DType::kF32), "f32");
  }
  // K == 0 gives zeros; M == 0 gives an empty result.
  CHECK(matmul(Tensor::zeros({2, 0}, DType::kF64), Tensor::zeros({0, 3}, DType::kF64))
            .to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(matmul(Tensor::zeros({0, 4}, DType::kF64), uniform({4, 3}, 3)).shape() == Shape{0, 3});
  CHECK(matmul(Tensor::zeros({2, 3, 0}, DType::kF64), Tensor::zeros({0, 5}, DType::kF64))
            .to_vector<double>() == std::vector<double>(30, 0.0));
  CHECK(matmul(Tensor::zeros({0, 3, 4}, DType::kF64), uniform({2, 4, 3}, 4).narrow(0, 0, 1))
            .shape() == Shape{0, 3, 3});
}

TEST_CASE("matmul broadcasts batch dims", "[cpu]") {
  const Tensor a = uniform({2, 1, 3, 4}, 1);
  const Tensor b = uniform({3, 4, 5}, 2);
  const Tensor c = matmul(a, b);
  REQUIRE(c.shape() == Shape{2, 3, 3, 5});
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      require_close(c.select(0, i).select(0, j),
                    loop_matmul(a.select(0, i).select(0, 0), b.select(0, j)), kF64, "batch");
    }
  }
  // A 2-d right operand shared by the whole batch (folded into one GEMM), and a 2-d left one.
  const Tensor x = uniform({2, 3, 4}, 3), w = uniform({4, 6}, 4);
  const Tensor xw = matmul(x, w);
  REQUIRE(xw.shape() == Shape{2, 3, 6});
  require_close(xw.select(0, 1), loop_matmul(x.select(0, 1), w), kF64, "folded batch");
  const Tensor wx = matmul(uniform({5, 3}, 5), x);
  REQUIRE(wx.shape() == Shape{2, 5, 4});
  require_close(wx.select(0, 1), loop_matmul(uniform({5, 3}, 5), x.select(0, 1)), kF64,
                "2-d @ 3-d");
}

TEST_CASE("matmul reads transposed and strided operands correctly", "[cpu]") {
  const Tensor a = uniform({2, 5, 4}, 1), b = uniform({2, 5, 3}, 2);
  const Tensor at = a.transpose(1, 2);  // [2, 4, 5], column-major in its last two dims
  const Tensor expected = matmul(at.contiguous(), b);
  require_close(matmul(at, b), expected, kF64, "transposed a");
  const Tensor bt = b.transpose(1, 2).contiguous().transpose(1, 2);  // column-major b
  require_close(matmul(at, bt), expected, kF64, "both transposed");
  // Every other column: neither row- nor column-major, so it is packed first.
  const Tensor wide = uniform({4, 10}, 3);
  const Tensor strided = wide.slice(1, 0, 10, 2);
  require_close(matmul(strided, uniform({5, 2}, 4)),
                loop_matmul(strided.contiguous(), uniform({5, 2}, 4)), kF64, "strided");
  // Batch dims permuted: the batch stride is not the matrix size.
  const Tensor p = uniform({3, 2, 4}, 5).permute({1, 0, 2});  // [2, 3, 4]
  require_close(matmul(p, uniform({2, 4, 2}, 6)), matmul(p.contiguous(), uniform({2, 4, 2}, 6)),
                kF64, "permuted batch");
  // A 3-d operand with a transposed last pair times a 2-d one (no fold: batched GEMM).
  require_close(matmul(at, uniform({5, 2}, 7)), matmul(at.contiguous(), uniform({5, 2}, 7)), kF64,
                "unfoldable 3-d @ 2-d");
}

TEST_CASE("linear matches x @ w^T + b", "[cpu]") {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor w = values({1, 0, -1, 0.5, 0.5, 0.5}, {2, 3});
  const Tensor b = values({10, -10}, {2});
  CHECK(linear(x, w, b).to_vector<double>() == std::vector<double>{8, -7, 8, -2.5});
  CHECK(linear(x, w).to_vector<double>() == std::vector<double>{-2, 3, -2, 7.5});
  CHECK(linear(x.to(DType::kF32), w.to(DType::kF32), b.to(DType::kF32)).to_vector<float>() ==
        std::vector<float>{8, -7, 8, -2.5});
  // Leading dims are kept; a weight given as a transposed view is read without packing.
  const Tensor x3 = uniform({2, 3, 4}, 1), w2 = uniform({4, 5}, 2).transpose(0, 1);
  const Tensor bias = uniform({5}, 3);
  const Tensor y = linear(x3, w2, bias);
  REQUIRE(y.shape() == Shape{2, 3, 5});
  require_close(y, matmul(x3, w2.transpose(0, 1)) + bias, kF64, "3-d linear");
  // A 1-d input.
  CHECK(linear(values({1, 2, 3}, {3}), w, b).to_vector<double>() == std::vector<double>{8, -7});
}

TEST_CASE("gemm kernel applies alpha, beta, bias and a broadcast batch", "[cpu]") {
  // c[i] = 2 * a[i] @ b + 0.5 * c[i] + bias, with b shared by the batch (batch stride 0) and
  // read column-major.
  const Tensor a = values({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  const Tensor b_t = values({1, 0, 1, 1}, {2, 2});  // b = b_t^T = [[1 1] [0 1]]
  GemmArgs args;
  args.a = a;
  args.b = Tensor::make_view(b_t.storage(), {2, 2, 2}, {0, 1, 2}, 0, DType::kF64);
  args.c = Tensor::full({2, 2, 2}, 4.0, DType::kF64);
  args.bias = values({100, 200}, {2});
  args.alpha = 2.0f;
  args.beta = 0.5f;
  cpu::gemm(args);
  // a[0] @ b = [[1 3] [3 7]], a[1] @ b = [[5 11] [7 15]]
  CHECK(args.c.to_vector<double>() == std::vector<double>{104, 208, 108, 216, 112, 224, 116, 232});
  args.a = Tensor::make_view(a.storage(), {2, 2, 2}, {4, 1, 1}, 0, DType::kF64);  // overlapping
  CHECK_THROWS_AS(cpu::gemm(args), ValueError);
}

TEST_CASE("gemm of 16-bit operands into an f32 c: the f32 product, not rounded", "[cpu]") {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    // b read column-major, as the weight gradient's g^T is.
    const Tensor a = uniform({1, 7, 33}, 31).to(dt);
    const Tensor b = uniform({1, 5, 33}, 32).to(dt).transpose(1, 2);
    GemmArgs args;
    args.a = a;
    args.b = b;
    args.c = Tensor::empty({1, 7, 5}, DType::kF32);
    cpu::gemm(args);
    GemmArgs wide;
    wide.a = a.to(DType::kF32);
    wide.b = b.to(DType::kF32);
    wide.c = Tensor::empty({1, 7, 5}, DType::kF32);
    cpu::gemm(wide);
    CHECK(test::bitwise_equal(args.c, wide.c));
    // Not the 16-bit c's values (some sum is not representable in 16 bits).
    CHECK_FALSE(test::bitwise_equal(args.c, wide.c.to(dt).to(DType::kF32)));
    // With alpha, beta and an f32 bias.
    args.alpha = wide.alpha = 0.5f;
    args.beta = wide.beta = 2.0f;
    args.bias = wide.bias = uniform({5}, 33).to(DType::kF32);
    cpu::gemm(args);
    cpu::gemm(wide);
    CHECK(test::bitwise_equal(args.c, wide.c));
  }
  // Mixed operands, a 16-bit c of f32 operands, a bias of another dtype: errors naming them.
  GemmArgs bad;
  bad.a = uniform({1, 2, 3}, 34).to(DType::kBF16);
  bad.b = uniform({1, 3, 2}, 35).to(DType::kF16);
  bad.c = Tensor::empty({1, 2, 2}, DType::kF32);
  CHECK_THROWS_WITH(cpu::gemm(bad), Catch::Contains("bf16, f16, f32"));
  bad.b = uniform({1, 3, 2}, 35).to(DType::kF32);
  bad.a = uniform({1, 2, 3}, 34).to(DType::kF32);
  bad.c = Tensor::empty({1, 2, 2}, DType::kBF16);
  CHECK_THROWS_AS(cpu::gemm(bad), DTypeError);
  bad.a = bad.a.to(DType::kBF16);
  bad.b = bad.b.to(DType::kBF16);
  bad.c = Tensor::empty({1, 2, 2}, DType::kF32);
  bad.bias = Tensor::empty({2}, DType::kBF16);
  CHECK_THROWS_WITH(cpu::gemm(bad), Catch::Contains("bias"));
}

TEST_CASE("gemm with a_row_sums: the product and a's row sums in one call", "[cpu]") {
  // A weight gradient's shapes: a = g^T [out, rows] (column-major), b = x [rows, in].
  for (DType dt : {DType::kBF16, DType::kF32}) {
    INFO(dtype_name(dt));
    const Tensor g = uniform({1, 40, 6}, 37).to(dt);
    const Tensor x = uniform({1, 40, 5}, 38).to(dt);
    GemmArgs args;
    args.a = g.transpose(1, 2);
    args.b = x;
    args.c = Tensor::empty({1, 6, 5}, DType::kF32);
    args.a_row_sums = Tensor::empty({6}, DType::kF32);
    cpu::gemm(args);
    GemmArgs plain = args;
    plain.c = Tensor::empty({1, 6, 5}, DType::kF32);
    plain.a_row_sums = Tensor();
    cpu::gemm(plain);
    CHECK(test::bitwise_equal(args.c, plain.c));
    // The row sums of g^T are g's column sums (a bias gradient), the same bits as reduce's.
    const Tensor sums = Tensor::empty({1, 6}, DType::kF32);
    cpu::reduce(ReduceOp::kSum, g.view({40, 6}), {0}, sums);
    CHECK(test::bitwise_equal(args.a_row_sums, sums.view({6})));
  }
  // One matrix without a bias, [M] of c's dtype.
  GemmArgs bad;
  bad.a = uniform({1, 2, 3}, 39);
  bad.b = uniform({1, 3, 4}, 40);
  bad.c = Tensor::empty({1, 2, 4}, DType::kF64);
  bad.a_row_sums = Tensor::empty({3}, DType::kF64);
  CHECK_THROWS_WITH(cpu::gemm(bad), Catch::Contains("a_row_sums must be a contiguous [2]"));
  bad.a_row_sums = Tensor::empty({2}, DType::kF64);
  bad.bias = Tensor::zeros({4}, DType::kF64);
  CHECK_THROWS_WITH(cpu::gemm(bad), Catch::Contains("a_row_sums needs one matrix and no bias"));
}

TEST_CASE("reduce of a 16-bit tensor into f32: the f32 sums, not rounded", "[cpu]") {
  const Tensor x = uniform({300, 9}, 36, -4.0, 4.0).to(DType::kBF16);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}}) {
    Shape shape = x.shape();
    for (int64_t d : dims) shape[static_cast<size_t>(d)] = 1;
    const Tensor out = Tensor::empty(shape, DType::kF32), wide = Tensor::empty(shape, DType::kF32);
    cpu::reduce(ReduceOp::kSum, x, dims, out);
    cpu::reduce(ReduceOp::kSum, x.to(DType::kF32), dims, wide);
    CHECK(test::bitwise_equal(out, wide));
  }
  CHECK_THROWS_AS(
      cpu::reduce(ReduceOp::kSum, x.to(DType::kF32), {0}, Tensor::empty({1, 9}, DType::kBF16)),
      DTypeError);
}

TEST_CASE("matmul gradients match finite differences", "[cpu]") {
  auto mm = [](const TensorList& in) { return matmul(in[0], in[1]); };
  check_gradients(mm,
                  {uniform({3, 4}, 1).set_requires_grad(), uniform({4, 2}, 2).set_requires_grad()});
  check_gradients(mm, {uniform({2, 1, 3, 4}, 3).set_requires_grad(),
                       uniform({3, 4, 2}, 4).set_requires_grad()});
  check_gradients(
      mm, {uniform({2, 3, 4}, 5).set_requires_grad(), uniform({4, 2}, 6).set_requires_grad()});
  check_gradients(
      mm, {uniform({3, 4}, 7).set_requires_grad(), uniform({2, 4, 2}, 8).set_requires_grad()});
  check_gradients(
      mm, {uniform({4}, 9).set_requires_grad(), uniform({2, 4, 3}, 10).set_requires_grad()});
  check_gradients(
      mm, {uniform({2, 3, 4}, 11).set_requires_grad(), uniform({4}, 12).set_requires_grad()});
  check_gradients(mm, {uniform({4}, 13).set_requires_grad(), uniform({4}, 14).set_requires_grad()});
  // Transposed operands, and only one input requiring grad.
  check_gradients(
      [](const TensorList& in) { return matmul(in[0].transpose(-1, -2), in[1].transpose(-1, -2)); },
      {uniform({2, 4, 3}, 15).set_requires_grad(), uniform({2, 5, 4}, 16).set_requires_grad()});
  check_gradients(mm, {uniform({3, 4}, 17), uniform({4, 2}, 18).set_requires_grad()});
}

TEST_CASE("matmul of a head-split operand: its backward reads the forward's packed copy", "[cpu]") {
  // v [B, h, N, d] split from a projection [B, N, h * d]: batch dims B and h fold into no single
  // stride, so the forward's GEMM reads a packed copy of v; the weights' gradient g v^T reads that
  // copy again instead of packing v a second time.
  const Tensor x = uniform({2, 5, 3 * 4}, 21).set_requires_grad();
  const auto head_split = [](const Tensor& t) {
    return t.reshape({2, 5, 3, 4}).permute({0, 2, 1, 3});
  };
  const Tensor w = uniform({2, 3, 6, 5}, 22).set_requires_grad();
  check_gradients([&](const TensorList& in) { return matmul(in[0], head_split(in[1])); }, {w, x});
  const Tensor c = uniform({2, 3, 6, 4}, 23);
  w.zero_grad();
  x.zero_grad();
  const Tensor y = matmul(w, head_split(x));
  // Only x's gradient, laid out as x from the head-split dV.
  CHECK(test::calls_of(test::kernels_of([&] { y.backward(c); }), "copy") == 1);
  // The values: g v^T and w^T g against the products of contiguous operands.
  const Tensor v = head_split(x.detach()).contiguous();
  const Tensor g = c;
  require_close(w.grad(), matmul(g, v.transpose(-1, -2)), kF64, "dW");
  require_close(x.grad(),
                matmul(w.detach().transpose(-1, -2), g).permute({0, 2, 1, 3}).reshape({2, 5, 12}),
                kF64, "dx");
}

TEST_CASE("matmul with a head-split output gradient packs it once for both products", "[cpu]") {
  // out [B, h, N, d] merged into [B, N, h * d] (merge_heads): the gradient reaching the product
  // is a head-split view of the merged gradient, whose batch dims fold into no single stride;
  // dW = g v^T and dV = W^T g read one packed copy of it.
  const Tensor w = uniform({2, 3, 6, 5}, 24).set_requires_grad();
  const Tensor v = uniform({2, 3, 5, 4}, 25).set_requires_grad();
  const auto merged = [](const Tensor& t) { return t.permute({0, 2, 1, 3}).reshape({2, 6, 12}); };
  check_gradients([&](const TensorList& in) { return merged(matmul(in[0], in[1])); }, {w, v});
  w.zero_grad();
  v.zero_grad();
  const Tensor y = merged(matmul(w, v));
  const Tensor c = uniform({2, 6, 12}, 26);
  CHECK(test::calls_of(test::kernels_of([&] { y.backward(c); }), "copy") == 1);
  const Tensor g = c.reshape({2, 6, 3, 4}).permute({0, 2, 1, 3}).contiguous();
  require_close(w.grad(), matmul(g, v.detach().transpose(-1, -2)), kF64, "dW");
  require_close(v.grad(), matmul(w.detach().transpose(-1, -2), g), kF64, "dV");
}

TEST_CASE("matmul with b broadcast over the batch: single rows and b's gradient fold the batch",
          "[cpu]") {
  // CSKA's class row against its static keys: q [B, h, 1, d] (rows of a token-major projection)
  // @ keys^T [h, d, K], shared by the batch. b's gradient, the sum over B of q^T g, is one
  // product per head with B folded into the contraction: no [B, h, d, K] products to reduce;
  // the product itself one per head with B folded into its rows.
  // Where the batch does not fold into the rows (h between B and 4 rows), the products are
  // summed after, with the same values.
  const int64_t batch = 3, heads = 2, d = 4, keys = 5;
  const Tensor proj = uniform({batch, 6, heads * d}, 27);
  const auto first_rows = [&](const Tensor& t, int64_t rows) {
    return t.reshape({batch, 6, heads, d}).permute({0, 2, 1, 3}).narrow(2, 0, rows);
  };
  const Tensor kt = uniform({heads, d, keys}, 28).set_requires_grad();
  for (const int64_t rows : {int64_t{1}, int64_t{4}}) {
    INFO(rows << " rows a head");
    const Tensor x = proj.clone().set_requires_grad();
    check_gradients([&](const TensorList& in) { return matmul(first_rows(in[0], rows), in[1]); },
                    {x, kt});
    x.zero_grad();
    kt.zero_grad();
    // The forward with one row a head: one product per head over the batch, no copy of the keys
    // per sample (with 4 rows the batched form packs them).
    const std::vector<std::string> packed = test::copies_of(
        [&] { (void)matmul(first_rows(proj, rows), kt.detach()); }, {"[3, 2, 4, 5]"});
    CHECK(packed.empty() == (rows == 1));
    const Tensor y = matmul(first_rows(x, rows), kt);
    for (int64_t i = 0; i < batch; ++i) {  // each sample alone: no broadcast
      require_close(y.detach().select(0, i),
                    matmul(first_rows(proj, rows).select(0, i), kt.detach()), kF64, "product");
    }
    const Tensor c = uniform(y.shape(), 29);
    const std::vector<profiler::KernelTime> calls = test::kernels_of([&] { y.backward(c); });
    if (rows == 1) CHECK(test::calls_of(calls, "reduce") == 0);
    // The values: the per-sample products summed over the batch.
    const Tensor q = first_rows(proj, rows);
    require_close(kt.grad(), sum(matmul(q.transpose(-1, -2), c), {0}), kF64, "d keys");
    require_close(x.grad().reshape({batch, 6, heads, d}).permute({0, 2, 1, 3}).narrow(2, 0, rows),
                  matmul(c, kt.detach().transpose(-1, -2)), kF64, "dq");
  }
}

TEST_CASE("linear gradients match finite differences", "[cpu]") {
  const Tensor w = uniform({3, 4}, 2).set_requires_grad(), b = uniform({3}, 3).set_requires_grad();
  auto with_bias = [](const TensorList& in) { return linear(in[0], in[1], in[2]); };
  check_gradients(with_bias, {uniform({5, 4}, 1).set_requires_grad(), w, b});
  check_gradients(with_bias, {uniform({2, 3, 4}, 4).set_requires_grad(), w, b});
  check_gradients([](const TensorList& in) { return linear(in[0], in[1]); },
                  {uniform({4}, 5).set_requires_grad(), w});
  check_gradients([](const TensorList& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
                  {uniform({4, 5}, 6).set_requires_grad(), w, b});
  check_gradients(with_bias, {uniform({5, 4}, 7), w, uniform({3}, 8)});
  // Weight only: x needs no gradient.
  const Tensor x = uniform({2, 4}, 9);
  w.zero_grad();
  b.zero_grad();
  const Tensor y = linear(x, w, b);
  sum(y).backward();
  REQUIRE(w.grad().defined());
  require_close(w.grad(), sum(x, {0}, true).expand({3, 4}), kF64, "grad w = sum of rows of x");
  require_close(b.grad(), values({2, 2, 2}, {3}), kF64, "grad b = row count");
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("matmul and linear reject mismatched operands", "[cpu]") {
  const Tensor a = uniform({2, 3}, 1), b = uniform({4, 2}, 2);
  CHECK_THROWS_AS(matmul(a, b), ShapeError);
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[2, 3]") &&
                                      Catch::Contains("[4, 2]"));
  CHECK_THROWS_AS(matmul(uniform({2, 2, 3}, 3), uniform({3, 3, 2}, 4)), ShapeError);
  CHECK_THROWS_AS(matmul(Tensor::scalar(1.0, DType::kF64), a), ShapeError);
  CHECK_THROWS_AS(matmul(a, uniform({3, 2}, 5).to(DType::kF32)), DTypeError);
  CHECK_THROWS_AS(matmul(Tensor::zeros({2, 3}, DType::kI64), Tensor::zeros({3, 2}, DType::kI64)),
                  DTypeError);
  const Tensor w = uniform({5, 4}, 6);
  CHECK_THROWS_WITH(linear(a, w), Catch::Contains("linear") && Catch::Contains("[2, 3]") &&
                                      Catch::Contains("[5, 4]"));
  CHECK_THROWS_AS(linear(uniform({2, 4}, 7), w, uniform({4}, 8)), ShapeError);
  CHECK_THROWS_AS(linear(uniform({2, 4}, 7), uniform({5, 4, 1}, 9)), ShapeError);
}

TEST_CASE("CUDA matmul and linear match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  auto mm = [](const TensorList& in) { return matmul(in[0], in[1]); };
  auto mm_tt = [](const TensorList& in) {
    return matmul(in[0].transpose(-1, -2), in[1].transpose(-1, -2));
  };
  auto lin = [](const TensorList& in) { return linear(in[0], in[1], in[2]); };
  auto lin_nobias = [](const TensorList& in) { return linear(in[0], in[1]); };
  const Tensor a = uniform({33, 65}, 1).set_requires_grad();
  const Tensor b = uniform({65, 17}, 2).set_requires_grad();
  const Tensor batched_a = uniform({2, 1, 8, 32}, 3).set_requires_grad();
  const Tensor batched_b = uniform({3, 32, 24}, 4).set_requires_grad();
  const Tensor at = uniform({4, 40, 16}, 5).set_requires_grad();
  const Tensor bt = uniform({4, 8, 40}, 6).set_requires_grad();
  const Tensor v = uniform({65}, 7).set_requires_grad();
  const Tensor x = uniform({2, 7, 48}, 8).set_requires_grad();
  const Tensor w = uniform({40, 48}, 9).set_requires_grad();
  const Tensor bias = uniform({40}, 10).set_requires_grad();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    ska::test::check_cuda_parity(mm, {a, b}, dt);
    ska::test::check_cuda_parity(mm, {batched_a, batched_b}, dt);
    ska::test::check_cuda_parity(mm, {x, w.transpose(0, 1)}, dt);
    ska::test::check_cuda_parity(mm, {v, b}, dt);
    ska::test::check_cuda_parity(mm_tt, {at, bt}, dt);
    ska::test::check_cuda_parity(lin, {x, w, bias}, dt);
    ska::test::check_cuda_parity(lin_nobias, {a, uniform({9, 65}, 11).set_requires_grad()}, dt);
  }
}

TEST_CASE("CUDA TF32 policy: strict f32 by default, TF32 only when allowed", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // K = 512 products of uniform values: TF32 inputs keep 10 mantissa bits, so its result differs
  // from the f32 one by ~1e-4 relative, 100x more than f32 rounding does.
  const Tensor a = uniform({64, 512}, 21).to(DType::kF32), b = uniform({512, 48}, 22).to(DType::kF32);
  const Tensor ref = matmul(a, b);
  const Device gpu = Device::cuda(0);
  const Tensor strict = matmul(a.to(gpu), b.to(gpu)).to(Device::cpu());
  const double strict_err = ska::test::nmse(strict, ref);
  Tensor fast;
  {
    Tf32Guard tf32({/*matmul=*/true, /*conv=*/true});
    fast = matmul(a.to(gpu), b.to(gpu)).to(Device::cpu());
  }
  const double fast_err = ska::test::nmse(fast, ref);
  INFO("nmse strict " << strict_err << ", tf32 " << fast_err);
  CHECK(strict_err < 1e-12);
  CHECK(fast_err > 1e-10);
  CHECK(fast_err < 1e-5);
  CHECK(tf32_policy().matmul == false);  // the guard restored the policy
}

TEST_CASE("CUDA gemm keeps its stream's workspace: a product allocates nothing", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  GemmArgs args;
  args.a = uniform({1, 64, 96}, 41).to(DType::kBF16).to(gpu);
  args.b = uniform({1, 96, 32}, 42).to(DType::kBF16).to(gpu);
  args.c = Tensor::empty({1, 64, 32}, DType::kBF16, gpu);
  SKA_KERNEL(gpu, gemm)(args);  // the stream's first product (in this process, maybe not): takes it
  Allocator& alloc = allocator_for(gpu);
  const MemoryStats before = alloc.stats();
  for (int i = 0; i < 3; ++i) SKA_KERNEL(gpu, gemm)(args);
  const MemoryStats after = alloc.stats();
  CHECK(after.num_allocs == before.num_allocs);
  CHECK(after.allocated == before.allocated);
  const Tensor want = matmul(args.a.to(Device::cpu()), args.b.to(Device::cpu()));
  CHECK(ska::test::nmse(args.c.to(Device::cpu()).to(DType::kF32), want.to(DType::kF32)) < 1e-4);
}
