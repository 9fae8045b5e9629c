// cat, stack, split, chunk, pad, roll and grid neighbourhoods: values, gradients, errors, CUDA
// parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::uniform;
using ska::test::values;

TEST_CASE("cat and stack", "[cpu]") {
  const Tensor a = values({1, 2, 3, 4}, {2, 2}), b = values({5, 6}, {2, 1});
  CHECK(cat({a, b}, 1).to_vector<double>() == std::vector<double>{1, 2, 5, 3, 4, 6});
  CHECK(cat({a, a}, 0).shape() == Shape{4, 2});
  CHECK(stack({a, a}, 1).shape() == Shape{2, 2, 2});
  CHECK(stack({a, a * 2.0}, 0).to_vector<double>() == std::vector<double>{1, 2, 3, 4, 2, 4, 6, 8});
  CHECK_THROWS_WITH(cat({a, b}, 0), Catch::Contains("[2, 1]") && Catch::Contains("[2, 2]"));
  CHECK_THROWS_AS(stack({a, b}, 0), ShapeError);
  CHECK_THROWS_AS(cat({}, 0), ValueError);
}

TEST_CASE("empty_aligned_rows: rows 16 bytes apart, the first columns of padded rows", "[cpu]") {
  struct Case {
    DType dtype;
    int64_t cols, row;  // the row stride it must have
  };
  for (const Case c :
       {Case{DType::kBF16, 65, 72}, Case{DType::kF32, 65, 68}, Case{DType::kF64, 65, 66},
        Case{DType::kBF16, 64, 64}, Case{DType::kU8, 17, 32}}) {
    INFO(dtype_name(c.dtype) << " " << c.cols);
    const Tensor t = empty_aligned_rows({2, 3, 5, c.cols}, c.dtype, Device::cpu());
    CHECK(t.shape() == (Shape{2, 3, 5, c.cols}));
    CHECK(t.strides() == (Shape{3 * 5 * c.row, 5 * c.row, c.row, 1}));
    CHECK(t.is_contiguous() == (c.row == c.cols));
    CHECK(dense_with_padded_rows(t.shape(), t.strides()));
    // Every row starts on a 16-byte boundary.
    const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
    CHECK(base % 16 == 0);
    CHECK(c.row * static_cast<int64_t>(dtype_size(c.dtype)) % 16 == 0);
  }
  CHECK(empty_aligned_rows({}, DType::kF32, Device::cpu()).dim() == 0);
  // What counts as padded rows: permuted ones too; not overlapping, broadcast or strided columns.
  CHECK(dense_with_padded_rows({3, 2, 5, 65}, {5 * 72, 3 * 5 * 72, 72, 1}));
  CHECK_FALSE(non_overlapping_and_dense({3, 2, 5, 65}, {5 * 72, 3 * 5 * 72, 72, 1}));
  CHECK_FALSE(dense_with_padded_rows({2, 5, 65}, {5 * 72, 64, 1}));      // rows overlap
  CHECK_FALSE(dense_with_padded_rows({2, 5, 65}, {0, 72, 1}));           // broadcast
  CHECK_FALSE(dense_with_padded_rows({2, 5, 65}, {5 * 144, 144, 2}));    // strided columns
  CHECK_FALSE(dense_with_padded_rows({2, 5, 65}, {5 * 72 + 8, 72, 1}));  // gaps between blocks
  CHECK(dense_with_padded_rows({2, 5, 65}, {5 * 65, 65, 1}));            // dense
}

TEST_CASE("cat into a given tensor: cat's values and gradients, written there", "[cpu]") {
  const Tensor a = uniform({2, 3}, 21), b = uniform({2, 2}, 22);
  const Tensor into = Tensor::full({2, 5}, NAN, DType::kF64);
  const Tensor y = cat({a, b}, 1, into);
  CHECK(y.same_storage(into));
  CHECK(test::bitwise_equal(into, cat({a, b}, 1)));
  // Recorded as cat: gradients through the given tensor.
  check_gradients(
      [](const TensorList& in) {
        return cat({in[0], in[1]}, 1, Tensor::empty({2, 5}, DType::kF64)) * 3.0;
      },
      {a.clone().set_requires_grad(), b.clone().set_requires_grad()});
  CHECK_THROWS_WITH(cat({a, b}, 1, Tensor::empty({2, 4}, DType::kF64)),
                    Catch::Contains("the pieces make [2, 5] f64"));
  CHECK_THROWS_AS(cat({a, b}, 1, Tensor::empty({2, 5}, DType::kF32)), ShapeError);
  CHECK_THROWS_WITH(cat({a, b}, 1, Tensor::empty({2, 5}, DType::kF64).set_requires_grad()),
                    Catch::Contains("must be a fresh tensor"));
}

TEST_CASE("split and chunk are views, backward fills unused pieces with zeros", "[cpu]") {
  Tensor x = Tensor::arange(10, DType::kF64).reshape({2, 5}).detach();
  TensorList p = split(x, {2, 3}, 1);
  CHECK(p[0].same_storage(x));
  CHECK(p[1].to_vector<double>() == std::vector<double>{2, 3, 4, 7, 8, 9});
  CHECK(chunk(x, 3, 1).size() == 3);
  CHECK(chunk(x, 3, 1)[2].shape() == Shape{2, 1});
  CHECK(split(x, 2, 1).back().shape() == Shape{2, 1});
  CHECK_THROWS_AS(split(x, {2, 2}, 1), ShapeError);

  Tensor y = uniform({3, 6}, 5).set_requires_grad();
  TensorList q = chunk(y, 3, 1);
  sum(q[1] * 2.0).backward();  // only the middle chunk is used
  const std::vector<double> g = y.grad().to_vector<double>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 6; ++c) REQUIRE(g[r * 6 + c] == (c == 2 || c == 3 ? 2.0 : 0.0));
}

TEST_CASE("unbind: views of each index, one backward without zero-filled copies", "[cpu]") {
  // q, k and v of a projection as the attention mixer takes them: [B, N, 3, h, d] permuted to
  // [3, B, h, N, d], unbound along dim 0.
  const Tensor leaf = uniform({2, 5, 3, 4, 6}, 11).set_requires_grad();
  const Tensor x = leaf.permute({2, 0, 3, 1, 4});
  const TensorList pieces = unbind(x, 0);
  REQUIRE(pieces.size() == 3);
  for (int64_t i = 0; i < 3; ++i) {
    CHECK(pieces[static_cast<size_t>(i)].same_storage(leaf));
    CHECK(pieces[static_cast<size_t>(i)].shape() == Shape{2, 4, 5, 6});
    CHECK(pieces[static_cast<size_t>(i)].to_vector<double>() ==
          x.select(0, i).contiguous().to_vector<double>());
  }
  CHECK(unbind(Tensor::empty({0, 3}), 0).empty());
  // The gradient against select()'s, weights differing per piece, one piece unused.
  const Tensor w0 = uniform({2, 4, 5, 6}, 12), w2 = uniform({2, 4, 5, 6}, 13);
  profiler::start();
  sum(add(mul(pieces[0], w0), mul(pieces[2], w2))).backward();
  std::vector<profiler::KernelTime> calls;
  profiler::stop(&calls);
  const Tensor via_unbind = leaf.grad().detach().clone();
  leaf.zero_grad();
  const Tensor again = leaf.permute({2, 0, 3, 1, 4});  // the first graph is spent
  sum(add(mul(again.select(0, 0), w0), mul(again.select(0, 2), w2))).backward();
  require_close(via_unbind, leaf.grad(), {0.0, 0.0}, "unbind against select");
  // Its backward: each used piece's gradient copied once into one tensor laid out as the leaf
  // (no x-sized zero fill per piece; undoing the permute needs no copy), the unused piece's
  // place in it zero-filled (no zero tensor made and copied).
  int64_t piece_copies = 0, piece_fills = 0, whole_fills = 0;
  for (const auto& c : calls) {
    const bool piece = c.operands.rfind("[2, 4, 5, 6] f64", 0) == 0;
    const bool whole = c.operands.rfind("[3, 2, 4, 5, 6]", 0) == 0 ||
                       c.operands.rfind("[2, 5, 3, 4, 6]", 0) == 0;
    if (c.name == "copy" && c.operands == "[2, 4, 5, 6] f64, [2, 4, 5, 6] f64 (strided)") {
      piece_copies += c.calls;  // into its place in the leaf's gradient
    }
    if (c.name == "fill" && piece) piece_fills += c.calls;
    if ((c.name == "fill" || c.name == "copy") && whole) whole_fills += c.calls;
  }
  CHECK(piece_copies == 2);
  CHECK(piece_fills == 1);
  CHECK(whole_fills == 0);
  // Gradients through unbind check against finite differences.
  check_gradients(
      [](const TensorList& in) {
        const TensorList p = unbind(in[0].permute({1, 0, 2}), 0);
        return sum(mul(mul(p[0], p[1]), p[2]));
      },
      {uniform({4, 3, 2}, 14).set_requires_grad()});
}

TEST_CASE("narrowed head splits and the sum of their gradients keep the projection's layout",
          "[cpu]") {
  // CSKA's queries: heads split from a token-major projection [B, N, h * d], the class row and
  // the spatial rows narrowed from them. Each narrow's gradient comes back laid out like its
  // input, autograd's sum of the two keeps that order, and undoing the split is then a view:
  // no copy of a [B, h, N, d] or [B, N, h, d] tensor in the backward pass.
  const int64_t batch = 2, n = 5, h = 3, d = 4;
  const Tensor proj = uniform({batch, n, h * d}, 21).set_requires_grad();
  const Tensor heads = proj.reshape({batch, n, h, d}).permute({0, 2, 1, 3});
  const Tensor first = heads.narrow(2, 0, 1), rest = heads.narrow(2, 1, n - 1);
  const Tensor w0 = uniform(first.shape(), 22), w1 = uniform(rest.shape(), 23);
  CHECK(test::copies_of([&] { sum(add(sum(mul(first, w0)), sum(mul(rest, w1)))).backward(); },
                        {"[2, 3, 5, 4]", "[2, 5, 3, 4]"})
            .empty());
  // The values: each token's gradient is its row's weights.
  const Tensor want = cat({w0, w1}, 2).permute({0, 2, 1, 3}).reshape({batch, n, h * d});
  require_close(proj.grad(), want, {0.0, 0.0}, "gradient of the projection");
  // The same rows as one split: its backward writes the two gradients side by side into one
  // tensor in the projection's order (a copy of each piece, no zero-fill, no sum), and undoing
  // the head split is again a view.
  proj.zero_grad();
  const TensorList rows =
      split(proj.reshape({batch, n, h, d}).permute({0, 2, 1, 3}), {1, n - 1}, 2);
  const Tensor loss = sum(add(sum(mul(rows[0], w0)), sum(mul(rows[1], w1))));
  const std::vector<profiler::KernelTime> calls = test::kernels_of([&] { loss.backward(); });
  std::map<std::string, int64_t> whole;  // kernels on q-sized operands
  int64_t into_rows = 0;                 // copies into a strided view: the pieces into their rows
  for (const profiler::KernelTime& k : calls) {
    const std::string& ops = k.operands;
    if (ops.find("[2, 3, 5, 4]") != std::string::npos ||
        ops.find("[2, 5, 3, 4]") != std::string::npos) {
      whole[k.name] += k.calls;
    }
    const std::string strided = " (strided)";
    if (k.name == "copy" && ops.size() > strided.size() &&
        ops.compare(ops.size() - strided.size(), strided.size(), strided) == 0) {
      into_rows += k.calls;
    }
  }
  CHECK(whole.empty());  // no zero-fill, sum or copy of a q-sized gradient
  CHECK(into_rows == 2);
  require_close(proj.grad(), want, {0.0, 0.0}, "gradient of the projection through split");
  // A sum of two tensors in one permuted dense order comes out in that order, the same values.
  const Tensor x = uniform({2, 3, 4}, 24).permute({2, 0, 1}),
               y = uniform({2, 3, 4}, 25).permute({2, 0, 1});
  const Tensor z = add(x, y);
  CHECK(z.strides() == x.strides());
  require_close(z, add(x.contiguous(), y.contiguous()), {0.0, 0.0}, "permuted sum");
}

TEST_CASE("constant pad", "[cpu]") {
  const Tensor x = values({1, 2, 3, 4}, {1, 2, 2});
  const Tensor y = pad(x, {1, 0, 0, 1}, -1.0);  // last dim: 1 before; second last: 1 after
  CHECK(y.shape() == Shape{1, 3, 3});
  CHECK(y.to_vector<double>() == std::vector<double>{-1, 1, 2, -1, 3, 4, -1, -1, -1});
  CHECK_THROWS_AS(pad(x, {1}, 0.0), ShapeError);
  CHECK_THROWS_AS(pad(x, {-1, 0}, 0.0), ValueError);
}

TEST_CASE("roll matches torch.roll", "[cpu]") {
  const Tensor x = Tensor::arange(12, DType::kF64).reshape({3, 4}).detach();
  CHECK(roll(x, {1}, {1}).to_vector<double>() ==
        std::vector<double>{3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10});
  CHECK(roll(x, {-1, 2}, {0, 1}).to_vector<double>() ==
        std::vector<double>{6, 7, 4, 5, 10, 11, 8, 9, 2, 3, 0, 1});
  CHECK(roll(x, {8}, {1}).to_vector<double>() == x.to_vector<double>());
  // A dim given twice: the shifts add up (torch.roll((1, 2), (1, 1)) is a shift of 3).
  CHECK(roll(x, {1, 2}, {1, -1}).to_vector<double>() == roll(x, {3}, {1}).to_vector<double>());
  // A strided input, three dims, negative and oversized shifts, against one dim at a time.
  const Tensor y = uniform({3, 4, 5}, 81).permute({2, 0, 1});
  const Tensor stepwise = roll(roll(roll(y, {7}, {0}), {-1}, {1}), {2}, {2});
  CHECK(roll(y, {7, -1, 2}, {0, 1, 2}).to_vector<double>() == stepwise.to_vector<double>());
  // One op, forward and backward: a roll back (no zero-filled gradient per part, no cat).
  const Tensor z = uniform({2, 5, 6, 3}, 82).set_requires_grad(true);
  const Tensor r = roll(z, {-2, -2}, {1, 2});
  CHECK(test::graph_has(r, "roll"));
  CHECK_FALSE(test::graph_has(r, "cat"));
  const Tensor w = uniform(r.shape(), 83);
  sum(r * w).backward();
  CHECK(z.grad().to_vector<double>() == roll(w, {2, 2}, {1, 2}).to_vector<double>());
}

TEST_CASE("roll is one kernel call each way, for any dtype, and its kernel checks its operands",
          "[cpu]") {
  const Tensor z = uniform({2, 4, 4, 6}, 84).to(DType::kF32).set_requires_grad(true);
  const auto calls = [](const std::string& name) {
    int64_t n = 0;
    for (const profiler::KernelTime& k : profiler::stop()) n += k.name == name ? k.calls : 0;
    return n;
  };
  profiler::start();
  const Tensor r = roll(z, {-2, 1}, {1, 2});
  CHECK(calls("roll") == 1);
  profiler::start();
  (void)roll(z, {-2, 1}, {1, 2});
  CHECK(calls("copy") == 0);  // not a strided copy per block
  profiler::start();
  r.backward(uniform(r.shape(), 87).to(DType::kF32));
  CHECK(calls("roll") == 1);
  // The bits moved as they are: integers, bytes and 16-bit floats, strided or not.
  const Tensor ints = Tensor::arange(24, DType::kI64).reshape({2, 3, 4}).detach();
  CHECK(roll(ints, {1, -1}, {0, 2}).to_vector<int64_t>() ==
        roll(ints.to(DType::kF64), {1, -1}, {0, 2}).to_vector<int64_t>());
  const Tensor bytes = ints.to(DType::kU8).transpose(1, 2);
  CHECK(roll(bytes, {2}, {1}).to_vector<int64_t>() ==
        roll(ints.transpose(1, 2), {2}, {1}).to_vector<int64_t>());
  const Tensor halves = uniform({3, 5}, 85).to(DType::kBF16);
  CHECK(test::bitwise_equal(roll(halves, {2, 3}, {0, 1}).to(DType::kF32),
                            roll(halves.to(DType::kF32), {2, 3}, {0, 1})));
  // The kernel itself: one shift per dim, each in [0, n), out contiguous of x's shape and dtype.
  const Tensor x = uniform({3, 4}, 86);
  const Tensor out = Tensor::empty({3, 4}, DType::kF64);
  CHECK_THROWS_WITH(cpu::roll(x, {1}, out), Catch::Contains("roll: 1 shifts for a 2-d input"));
  CHECK_THROWS_WITH(cpu::roll(x, {0, 4}, out),
                    Catch::Contains("shift 4 of dim 1 is outside [0, 4)"));
  CHECK_THROWS_AS(cpu::roll(x, {0, 1}, Tensor::empty({4, 3}, DType::kF64)), ShapeError);
  CHECK_THROWS_AS(cpu::roll(x, {0, 1}, Tensor::empty({3, 4}, DType::kF32)), ShapeError);
}

// grid_neighbourhoods by its definition, element by element: [L, H, W, C] -> [L, H, W, k*k, C].
std::vector<double> neighbourhoods_by_definition(const Tensor& x, int64_t k) {
  const int64_t l = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const std::vector<double> in = x.contiguous().to_vector<double>();
  std::vector<double> out;
  for (int64_t i = 0; i < l; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t xx = 0; xx < w; ++xx)
        for (int64_t ky = 0; ky < k; ++ky)
          for (int64_t kx = 0; kx < k; ++kx)
            for (int64_t ch = 0; ch < c; ++ch) {
              const int64_t sy = y + ky - k / 2, sx = xx + kx - k / 2;
              const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
              out.push_back(inside ? in[static_cast<size_t>(((i * h + sy) * w + sx) * c + ch)]
                                   : 0.0);
            }
  return out;
}

TEST_CASE("grid neighbourhoods: every tap of every position, zeros off the grid", "[cpu]") {
  const Tensor x = uniform({2, 4, 5, 3}, 11);
  for (int64_t k : {1, 3, 5, 7}) {  // 7: taps that miss a 4-row grid entirely
    const Tensor y = grid_neighbourhoods(x, k);
    CHECK(y.shape() == Shape{2, 4, 5, k * k, 3});
    CHECK(y.to_vector<double>() == neighbourhoods_by_definition(x, k));
  }
  // A strided view (channels last of a channels-first tensor) reads as its values.
  const Tensor xt = uniform({2, 3, 4, 5}, 12).permute({0, 2, 3, 1});
  CHECK(grid_neighbourhoods(xt, 3).to_vector<double>() == neighbourhoods_by_definition(xt, 3));
  // The 3x3 "same" convolution of [C_out, C, 3, 3] filters as a product with [C_out, 9 * C].
  const Tensor image = uniform({2, 3, 4, 5}, 13), weight = uniform({6, 3, 3, 3}, 14);
  const Tensor cols = grid_neighbourhoods(image.permute({0, 2, 3, 1}), 3).reshape({2, 20, 27});
  const Tensor filters = weight.permute({0, 2, 3, 1}).reshape({6, 27});
  const Tensor product = matmul(cols, filters.transpose(0, 1));  // [2, 20 positions, 6]
  require_close(product.transpose(1, 2).reshape({2, 6, 4, 5}),
                conv2d(image, weight, Tensor(), 1, 1), ska::test::tolerance_for(DType::kF64));
  CHECK_THROWS_WITH(grid_neighbourhoods(x, 2), Catch::Contains("odd"));
  CHECK_THROWS_AS(grid_neighbourhoods(x.reshape({40, 3}), 3), ShapeError);
}

TEST_CASE("grid neighbourhood rows: the neighbourhoods, a one, zeros, and their gradient",
          "[cpu]") {
  const Tensor x = uniform({2, 4, 5, 3}, 21);
  for (int64_t k : {1, 3}) {
    const int64_t taps = k * k * 3, width = (taps + 1 + 7) / 8 * 8;
    INFO("k " << k << ", width " << width);
    const Tensor rows = grid_neighbourhood_rows(x, k, width);
    REQUIRE(rows.shape() == Shape{2, 4, 5, width});
    const std::vector<double> expected = neighbourhoods_by_definition(x, k);
    const std::vector<double> got = rows.to_vector<double>();
    for (int64_t p = 0; p < 2 * 4 * 5; ++p) {
      for (int64_t c = 0; c < width; ++c) {
        const double want = c < taps ? expected[static_cast<size_t>(p * taps + c)]
                                     : (c == taps ? 1.0 : 0.0);
        REQUIRE(got[static_cast<size_t>(p * width + c)] == want);
      }
    }
    // Gradient: grid_neighbourhoods' from the same upstream values, bit for bit.
    const Tensor up = uniform({2, 4, 5, width}, 22);
    const Tensor x1 = x.detach().set_requires_grad(), x2 = x.detach().set_requires_grad();
    sum(grid_neighbourhood_rows(x1, k, width) * up).backward();
    sum(grid_neighbourhoods(x2, k) * up.narrow(3, 0, taps).reshape({2, 4, 5, k * k, 3}))
        .backward();
    CHECK(ska::test::bitwise_equal(x1.grad(), x2.grad()));
    check_gradients([k, width](const TensorList& in) {
      return grid_neighbourhood_rows(in[0], k, width);
    }, {x.detach().set_requires_grad()});
  }
  CHECK_THROWS_WITH(grid_neighbourhood_rows(x, 3, 27), Catch::Contains("column of ones"));
}

TEST_CASE("with_zero_grads: the tensor itself, zero gradients for what it did not read", "[cpu]") {
  const Tensor x = uniform({2, 3}, 61).set_requires_grad(true);
  const Tensor w = uniform({4, 5}, 62, -1.0, 1.0, DType::kF32).set_requires_grad(true);
  const Tensor frozen = uniform({2}, 63);  // no gradient wanted
  const Tensor y = mul(x, 2.0);
  const Tensor z = with_zero_grads(y, {w, frozen});
  CHECK(z.data_ptr() == y.data_ptr());  // no copy
  CHECK(test::graph_has(z, "with_zero_grads"));
  sum(mul(z, uniform({2, 3}, 64))).backward();
  require_close(x.grad(), mul(uniform({2, 3}, 64), 2.0), test::tolerance_for(DType::kF64));
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::kF32);
  CHECK(w.grad().shape() == w.shape());
  CHECK(amax(abs(w.grad())).item() == 0.0);
  CHECK_FALSE(frozen.grad().defined());
}

TEST_CASE("shape op gradients", "[cpu]") {
  Tensor a = uniform({2, 3}, 1).set_requires_grad();
  Tensor b = uniform({2, 2}, 2).set_requires_grad();
  check_gradients([](const TensorList& in) { return cat({in[0], in[1], in[0]}, 1); }, {a, b});
  check_gradients([](const TensorList& in) { return stack({in[0], in[0] * 3.0}, 2); }, {a});
  check_gradients([](const TensorList& in) {
    TensorList p = split(in[0], {1, 2}, 1);
    return p[0] * p[1].narrow(1, 1, 1) + p[1].narrow(1, 0, 1);
  }, {a});
  check_gradients([](const TensorList& in) { return pad(in[0], {2, 1, 0, 3}, 0.5); }, {a});
  check_gradients([](const TensorList& in) { return roll(in[0], {1, -2}, {0, 1}) * in[0]; }, {a});
  Tensor grid = uniform({2, 3, 4, 2}, 3).set_requires_grad();
  for (int64_t k : {1, 3, 5}) {
    check_gradients([k](const TensorList& in) { return grid_neighbourhoods(in[0], k); }, {grid});
  }
  check_gradients(  // a strided input, read twice
      [](const TensorList& in) {
        const Tensor t = in[0].transpose(1, 2);
        return grid_neighbourhoods(t, 3) * grid_neighbourhoods(t * t, 3);
      },
      {grid});
}

TEST_CASE("CUDA shape ops match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Tensor a = uniform({4, 7, 9}, 3).set_requires_grad();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    ska::test::check_cuda_parity([](const TensorList& in) {
      TensorList p = chunk(in[0], 3, 2);
      return cat({p[2], p[0] * 2.0}, 1);
    }, {a}, dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return pad(in[0], {1, 2, 3, 0}, 0.0); },
                                 {a}, dt);
    ska::test::check_cuda_parity([](const TensorList& in) { return roll(in[0], {2, -3}, {1, 2}); },
                                 {a}, dt);
    // Swin's shifted windows: [B, H, W, C] rolled over H and W, rows of C moved as 16-byte
    // packs; and a strided input, element by element.
    Tensor grid = uniform({2, 4, 4, 48}, 4).set_requires_grad();
    ska::test::check_cuda_parity(
        [](const TensorList& in) {
          return roll(in[0], {-2, -2}, {1, 2});
        },
        {grid}, dt);
    ska::test::check_cuda_parity(
        [](const TensorList& in) {
          return roll(in[0].transpose(1, 3), {1, 3}, {1, 3});
        },
        {grid}, dt);
    ska::test::check_cuda_parity(  // channels last of a channels-first tensor, as CSKA reads q
        [](const TensorList& in) {
          return grid_neighbourhoods(in[0].reshape({4, 7, 3, 3}).permute({0, 2, 3, 1}), 3);
        },
        {a}, dt);
  }
  // Every element size, bit for bit: 1, 2, 4 and 8 bytes, packs and single elements.
  const Tensor ints = Tensor::arange(2 * 6 * 5 * 16, DType::kI64).reshape({2, 6, 5, 16}).detach();
  for (DType dt : {DType::kU8, DType::kBF16, DType::kI32, DType::kI64}) {
    INFO(dtype_name(dt));
    const Tensor host = ints.to(dt);
    for (const std::vector<int64_t>& shifts :
         std::vector<std::vector<int64_t>>{{3, -1}, {0, 7}, {2, 0}}) {
      const Tensor expected = roll(host, shifts, {1, 3});
      const Tensor got = roll(host.to(Device::cuda(0)), shifts, {1, 3}).to(Device::cpu());
      CHECK(ska::test::bitwise_equal(got, expected));
      const Tensor strided = roll(host.transpose(0, 2), shifts, {1, 3});
      CHECK(ska::test::bitwise_equal(
          roll(host.to(Device::cuda(0)).transpose(0, 2), shifts, {1, 3}).to(Device::cpu()),
          strided));
    }
  }
}
