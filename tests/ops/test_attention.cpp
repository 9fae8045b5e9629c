// The fused attention op against the unfused composition (matmul, softmax, matmul) it replaces:
// values and gradients in f64 and f32, broadcast static keys, split-head views, biases with -inf,
// query blocks past the kernel's block size, gradients by finite differences, 16-bit inputs,
// MAC counts, errors and CUDA parity; qkv_attention (one packed projection) against the split form.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/autocast.h"
#include "ops/mac_counter.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::Tolerance;
using ska::test::tolerance_for;
using ska::test::uniform;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// softmax(scale * q k^T + bias) v the unfused way, as the models computed it before the op.
Tensor unfused(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
               const Tensor& bias) {
  return matmul(softmax(matmul(q, k.transpose(-2, -1)), scale, bias), v);
}

// Runs f and the unfused twin on copies of `inputs` (bias last, may be undefined), comparing the
// outputs and every input's gradient within `tol`.
void check_against_unfused(const TensorList& inputs, double scale, Tolerance tol) {
  auto fresh = [&] {
    TensorList out;
    for (const Tensor& t : inputs) {
      out.push_back(t.defined() ? t.detach().clone().set_requires_grad() : Tensor());
    }
    return out;
  };
  TensorList a = fresh(), b = fresh();
  const Tensor fused = scaled_dot_attention(a[0], a[1], a[2], scale, a[3]);
  const Tensor plain = unfused(b[0], b[1], b[2], scale, b[3]);
  require_close(fused, plain, tol, "output");
  const Tensor w = uniform(plain.shape(), 99, -1, 1, plain.dtype());
  sum(mul(fused, w)).backward();
  sum(mul(plain, w)).backward();
  const char* names[] = {"grad q", "grad k", "grad v", "grad bias"};
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined()) require_close(a[i].grad(), b[i].grad(), tol, names[i]);
  }
}

// u8 [n, n], 1 on the diagonal.
Tensor nn_free_diagonal(int64_t n) {
  std::vector<uint8_t> m(static_cast<size_t>(n * n), 0);
  for (int64_t i = 0; i < n; ++i) m[static_cast<size_t>(i * n + i)] = 1;
  return Tensor::from_vector(m, {n, n});
}

}  // namespace

TEST_CASE("fused attention equals matmul-softmax-matmul, values and gradients", "[cpu]") {
  const Tolerance tight{1e-12, 1e-10};
  SECTION("plain heads, several query blocks of the kernel, with and without bias") {
    const Tensor q = uniform({2, 3, 150, 8}, 1), k = uniform({2, 3, 70, 8}, 2);
    const Tensor v = uniform({2, 3, 70, 5}, 3);
    check_against_unfused({q, k, v, Tensor()}, 0.35, tight);
    check_against_unfused({q, k, v, uniform({3, 150, 70}, 4, -2, 2)}, 0.35, tight);
  }
  SECTION("static keys shared by the batch (SKA): k [h, Nk, d] against q [B, h, Nq, d]") {
    check_against_unfused(
        {uniform({4, 2, 17, 8}, 5), uniform({2, 17, 8}, 6), uniform({4, 2, 17, 8}, 7), Tensor()},
        0.5, tight);
  }
  SECTION("class attention: one query row over 197 keys") {
    check_against_unfused({uniform({3, 4, 1, 16}, 8), uniform({3, 4, 197, 16}, 9),
                           uniform({3, 4, 197, 16}, 10), Tensor()},
                          0.25, tight);
  }
  SECTION("windows with a relative position bias and -inf shift masks (Swin)") {
    // q [B, windows, h, 16, d]; bias [h, 16, 16] plus a mask [windows, 1, 16, 16].
    const Tensor q = uniform({2, 4, 3, 16, 8}, 11), k = uniform({2, 4, 3, 16, 8}, 12);
    const Tensor v = uniform({2, 4, 3, 16, 8}, 13);
    Tensor mask = uniform({4, 1, 16, 16}, 14, 0, 1);
    mask = masked_fill(Tensor::zeros(mask.shape(), DType::kF64),
                       gt(mask, Tensor::full({}, 0.7, DType::kF64)), -kInf);
    // Every row keeps its diagonal, so no row is fully masked.
    mask = masked_fill(mask, nn_free_diagonal(16), 0.0);
    const Tensor bias = add(uniform({3, 16, 16}, 15), mask);
    check_against_unfused({q, k, v, bias}, 0.3, tight);
  }
  SECTION("f32 agrees with the unfused f32 path") {
    check_against_unfused({uniform({2, 2, 65, 32}, 16, -1, 1, DType::kF32),
                           uniform({2, 2, 65, 32}, 17, -1, 1, DType::kF32),
                           uniform({2, 2, 65, 32}, 18, -1, 1, DType::kF32),
                           uniform({2, 65, 65}, 19, -1, 1, DType::kF32)},
                          0.17, tolerance_for(DType::kF32));
  }
}

TEST_CASE("fused attention gradients match finite differences", "[cpu]") {
  const Tensor q = uniform({2, 2, 5, 3}, 21).set_requires_grad();
  const Tensor k = uniform({2, 6, 3}, 22).set_requires_grad();  // broadcast over the batch
  const Tensor v = uniform({2, 2, 6, 4}, 23).set_requires_grad();
  const Tensor bias = uniform({5, 6}, 24).set_requires_grad();
  check_gradients(
      [](const TensorList& in) { return scaled_dot_attention(in[0], in[1], in[2], 0.7, in[3]); },
      {q, k, v, bias});
}

TEST_CASE("fused attention with a device-side scale factor: values and gradients", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32}) {
    INFO(dtype_name(dt));
    auto leaf = [dt](const Shape& s, uint64_t seed) {
      return uniform(s, seed, -1, 1, dt).set_requires_grad();
    };
    const TensorList a = {leaf({2, 3, 70, 8}, 31), leaf({3, 70, 8}, 32), leaf({2, 3, 70, 8}, 33),
                          leaf({70, 70}, 34), Tensor::full({1}, 1.7, dt).set_requires_grad()};
    TensorList b;
    for (const Tensor& t : a) b.push_back(t.detach().clone().set_requires_grad());
    // A learnable temperature as LSA uses it: logits scaled by exp(t) and by 1/sqrt(d).
    const Tensor fused = scaled_dot_attention(a[0], a[1], a[2], 0.35, a[3], exp(a[4]));
    const Tensor logits = mul(matmul(b[0], b[1].transpose(-2, -1)), exp(b[4]));
    const Tensor plain = matmul(softmax(logits, 0.35, b[3]), b[2]);
    const Tolerance tol = tolerance_for(dt);
    require_close(fused, plain, tol, "output");
    const Tensor w = uniform(plain.shape(), 35, -1, 1, dt);
    sum(mul(fused, w)).backward();
    sum(mul(plain, w)).backward();
    const char* names[] = {"grad q", "grad k", "grad v", "grad bias", "grad temperature"};
    for (size_t i = 0; i < a.size(); ++i) require_close(a[i].grad(), b[i].grad(), tol, names[i]);
  }
  check_gradients(
      [](const TensorList& in) {
        return scaled_dot_attention(in[0], in[1], in[2], 0.7, Tensor(), in[3]);
      },
      {uniform({2, 5, 3}, 36).set_requires_grad(), uniform({2, 6, 3}, 37).set_requires_grad(),
       uniform({2, 6, 4}, 38).set_requires_grad(),
       Tensor::full({1}, 0.8, DType::kF64).set_requires_grad()});
  // Under autocast the factor stays f32 (bf16 q, k, v).
  {
    AutocastGuard guard(DType::kBF16);
    const Tensor q = uniform({2, 9, 16}, 39, -1, 1, DType::kF32);
    const Tensor f = Tensor::full({1}, 1.25, DType::kF32).set_requires_grad();
    const Tensor out = scaled_dot_attention(q, q, q, 0.25, Tensor(), f);
    CHECK(out.dtype() == DType::kBF16);
    sum(out.to(DType::kF32)).backward();
    CHECK(f.grad().dtype() == DType::kF32);
  }
  CHECK_THROWS_WITH(
      scaled_dot_attention(uniform({2, 4, 3}, 40), uniform({2, 4, 3}, 41), uniform({2, 4, 3}, 42),
                           1.0, Tensor(), Tensor::ones({2}, DType::kF64)),
      Catch::Contains("scale_factor") && Catch::Contains("one f64 element") &&
          Catch::Contains("[2]"));
}

TEST_CASE("softmax_attend equals softmax then matmul, with a learnable temperature", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32}) {
    INFO(dtype_name(dt));
    Tensor logits0 = uniform({2, 3, 70, 66}, 61, -3, 3, dt);
    for (int64_t i = 0; i < 66; ++i) logits0.narrow(2, i, 1).narrow(3, i, 1).fill_(-kInf);
    const TensorList a = {logits0.set_requires_grad(),
                          uniform({2, 3, 66, 8}, 62, -1, 1, dt).set_requires_grad(),
                          Tensor::full({1}, -0.4, dt).set_requires_grad()};
    TensorList b;
    for (const Tensor& t : a) b.push_back(t.detach().clone().set_requires_grad());
    const Tensor fused = softmax_attend(a[0], a[1], exp(a[2]));
    const Tensor plain = matmul(softmax(mul(b[0], exp(b[2]))), b[1]);
    const Tolerance tol = tolerance_for(dt);
    require_close(fused, plain, tol, "output");
    const Tensor w = uniform(plain.shape(), 63, -1, 1, dt);
    sum(mul(fused, w)).backward();
    sum(mul(plain, w)).backward();
    // The masked entries get no gradient on either side (0 there, not NaN).
    require_close(a[0].grad(), b[0].grad(), tol, "grad logits");
    require_close(a[1].grad(), b[1].grad(), tol, "grad v");
    require_close(a[2].grad(), b[2].grad(), tol, "grad temperature");
  }
  check_gradients(
      [](const TensorList& in) { return softmax_attend(in[0], in[1], in[2]); },
      {uniform({2, 5, 6}, 64).set_requires_grad(), uniform({2, 6, 3}, 65).set_requires_grad(),
       Tensor::full({1}, 1.3, DType::kF64).set_requires_grad()});
  // Under autocast: bf16 logits and values, the factor f32 with an f32 gradient.
  {
    AutocastGuard guard(DType::kBF16);
    const Tensor logits = uniform({2, 9, 9}, 66, -1, 1, DType::kF32).to(DType::kBF16);
    const Tensor f = Tensor::full({1}, 1.25, DType::kF32).set_requires_grad();
    const Tensor out = softmax_attend(logits, uniform({2, 9, 16}, 67, -1, 1, DType::kF32), f);
    CHECK(out.dtype() == DType::kBF16);
    sum(out.to(DType::kF32)).backward();
    CHECK(f.grad().dtype() == DType::kF32);
  }
  CHECK_THROWS_WITH(
      scaled_dot_attention(uniform({2, 4, 3}, 68), uniform({2, 4, 3}, 69), uniform({2, 4, 3}, 70),
                           1.0, Tensor(), Tensor(), Tensor::ones({1}, DType::kF64)),
      Catch::Contains("bias_factor needs a bias"));
}

TEST_CASE("fused attention of split heads comes out ready to merge", "[cpu]") {
  // q, k, v as split_heads makes them: permuted views of [B, N, h, d] slices of one qkv tensor.
  const Tensor qkv = uniform({2, 10, 3 * 4 * 8}, 31);
  auto head_view = [&](int64_t part) {
    return qkv.narrow(2, part * 32, 32).reshape({2, 10, 4, 8}).permute({0, 2, 1, 3});
  };
  const Tensor q = head_view(0), k = head_view(1), v = head_view(2);
  const Tensor out = scaled_dot_attention(q, k, v, 0.3);
  CHECK(out.shape() == Shape{2, 4, 10, 8});
  CHECK(out.permute({0, 2, 1, 3}).is_contiguous());  // [B, N, h, d] in memory
  require_close(out, unfused(q, k, v, 0.3, Tensor()), Tolerance{1e-12, 1e-10});
}

TEST_CASE("softmax_attend and split-head gradients merge back without copies", "[cpu]") {
  // CSKA's path: given logits, v split from a token-major [B, N, h * d] projection. The output
  // comes out token-major like v (q has no head dim to take an order from), and each input's
  // gradient in its input's order, so merging the heads and undoing the splits are views.
  const int64_t batch = 2, n = 10, h = 4, d = 8;
  const Tensor proj = uniform({batch, n, 2 * h * d}, 41).set_requires_grad();
  const Tensor proj2 = proj.detach().clone().set_requires_grad();
  const Tensor logits = uniform({batch, h, n, n}, 42, -2, 2).set_requires_grad();
  const Tensor w = uniform({batch, n, h * d}, 43);
  const auto heads = [&](const Tensor& p, int64_t part) {
    return p.narrow(2, part * h * d, h * d).reshape({batch, n, h, d}).permute({0, 2, 1, 3});
  };
  const Tensor out = softmax_attend(logits, heads(proj, 1), Tensor());
  CHECK(out.permute({0, 2, 1, 3}).is_contiguous());  // [B, N, h, d] in memory
  const Tensor merged = out.permute({0, 2, 1, 3}).reshape({batch, n, h * d});
  CHECK(merged.data_ptr() == out.data_ptr());  // a view
  // q, k and v split from one projection: their gradients need no [B, N, h, d] reordering.
  const Tensor y = scaled_dot_attention(heads(proj, 0), heads(proj, 0), heads(proj, 1), 0.3);
  CHECK(test::copies_of(
            [&] {
              sum(mul(merged, w)).backward();
              sum(mul(y.permute({0, 2, 1, 3}).reshape({batch, n, h * d}), w)).backward();
            },
            {"[2, 4, 10, 8]", "[2, 10, 4, 8]"})
            .empty());
  // The same numbers as from contiguous heads.
  const auto contiguous_heads = [&](int64_t part) { return heads(proj2, part).contiguous(); };
  const Tensor out2 = softmax_attend(logits.detach(), contiguous_heads(1), Tensor());
  const Tensor y2 =
      scaled_dot_attention(contiguous_heads(0), contiguous_heads(0), contiguous_heads(1), 0.3);
  sum(mul(out2.permute({0, 2, 1, 3}).reshape({batch, n, h * d}), w)).backward();
  sum(mul(y2.permute({0, 2, 1, 3}).reshape({batch, n, h * d}), w)).backward();
  CHECK(test::bitwise_equal(out, out2));
  CHECK(test::bitwise_equal(y, y2));
  CHECK(test::bitwise_equal(proj.grad(), proj2.grad()));
}

namespace {

// The heads of a packed [B, N, 3 * h * d] projection: part 0 (q), 1 (k) or 2 (v) as [B, h, N, d].
Tensor packed_part(const Tensor& qkv, int64_t heads, int64_t part) {
  const int64_t d = qkv.size(2) / (3 * heads);
  return qkv.view({qkv.size(0), qkv.size(1), 3, heads, d}).select(2, part).permute({0, 2, 1, 3});
}

// qkv_attention against scaled_dot_attention on the three head-split parts of a copy of qkv:
// the output and the gradients of qkv, the bias and the scale factor (each given or not).
void check_qkv_against_split(const Tensor& qkv, int64_t heads, double scale, const Tensor& bias,
                             const Tensor& factor, Tolerance tol) {
  const auto leaf = [](const Tensor& t) {
    return t.defined() ? t.detach().clone().set_requires_grad() : Tensor();
  };
  const TensorList a = {leaf(qkv), leaf(bias), leaf(factor)};
  const TensorList b = {leaf(qkv), leaf(bias), leaf(factor)};
  const Tensor packed = qkv_attention(a[0], heads, scale, a[1], a[2]);
  const Tensor split =
      scaled_dot_attention(packed_part(b[0], heads, 0), packed_part(b[0], heads, 1),
                           packed_part(b[0], heads, 2), scale, b[1], b[2]);
  REQUIRE(packed.shape() == split.shape());
  CHECK(packed.permute({0, 2, 1, 3}).is_contiguous());  // ready for merge_heads
  require_close(packed, split, tol, "output");
  const Tensor w = uniform(split.shape(), 97, -1, 1, split.dtype());
  sum(mul(packed, w)).backward();
  sum(mul(split, w)).backward();
  REQUIRE(a[0].grad().shape() == qkv.shape());
  require_close(a[0].grad(), b[0].grad(), tol, "grad qkv");
  if (bias.defined()) require_close(a[1].grad(), b[1].grad(), tol, "grad bias");
  if (factor.defined()) require_close(a[2].grad(), b[2].grad(), tol, "grad factor");
}

}  // namespace

TEST_CASE("qkv_attention equals the fused op on the split heads, gradients in qkv's layout",
          "[cpu]") {
  // A diagonal mask as LSA's -inf bias; several query blocks of the CPU kernel (N = 70).
  Tensor diagonal = Tensor::zeros({70, 70}, DType::kF64);
  diagonal = masked_fill(diagonal, nn_free_diagonal(70), -kInf);
  for (DType dt : {DType::kF64, DType::kF32}) {
    INFO(dtype_name(dt));
    const Tolerance tol = dt == DType::kF64 ? Tolerance{1e-12, 1e-10} : tolerance_for(dt);
    const Tensor qkv = uniform({2, 70, 3 * 4 * 8}, 301, -1, 1, dt);
    check_qkv_against_split(qkv, 4, 0.35, Tensor(), Tensor(), tol);
    check_qkv_against_split(qkv, 4, 0.35, diagonal.to(dt), Tensor::full({1}, 1.3, dt), tol);
    check_qkv_against_split(uniform({3, 17, 3 * 2 * 5}, 302, -1, 1, dt), 2, 0.5,
                            uniform({2, 17, 17}, 303, -1, 1, dt), Tensor(), tol);
  }
  check_gradients(
      [](const TensorList& in) { return qkv_attention(in[0], 2, 0.7, in[1], in[2]); },
      {uniform({2, 5, 3 * 2 * 3}, 304).set_requires_grad(),
       uniform({5, 5}, 305).set_requires_grad(),
       Tensor::full({1}, 0.8, DType::kF64).set_requires_grad()});
  // Under bf16 autocast: bf16 operands (the CPU kernel widens them and rounds each gradient into
  // its place in dL/dqkv), the gradient back in f32, the same values as the split form.
  const Tensor x = uniform({2, 33, 3 * 2 * 16}, 306, -1, 1, DType::kF32);
  const Tensor xa = x.detach().clone().set_requires_grad();
  const Tensor xb = x.detach().clone().set_requires_grad();
  Tensor packed, split;
  {
    AutocastGuard guard(DType::kBF16);
    packed = qkv_attention(xa, 2, 0.25);
    split = scaled_dot_attention(packed_part(xb, 2, 0), packed_part(xb, 2, 1),
                                 packed_part(xb, 2, 2), 0.25);
  }
  CHECK(packed.dtype() == DType::kBF16);
  CHECK(packed.to_vector<double>() == split.to_vector<double>());
  sum(packed.to(DType::kF32)).backward();
  sum(split.to(DType::kF32)).backward();
  CHECK(xa.grad().dtype() == DType::kF32);
  CHECK(xa.grad().to_vector<double>() == xb.grad().to_vector<double>());
  // MACs as the split form.
  int64_t macs = 0;
  {
    MacCounter count;
    qkv_attention(uniform({2, 7, 3 * 3 * 4}, 307), 3, 1.0);
    macs = count.total();
  }
  CHECK(macs == 2 * 3 * 7 * 7 * (4 + 4));
  CHECK_THROWS_WITH(qkv_attention(uniform({2, 7, 35}, 308), 3, 1.0),
                    Catch::Contains("qkv_attention") && Catch::Contains("[2, 7, 35]") &&
                        Catch::Contains("3 heads"));
  CHECK_THROWS_WITH(qkv_attention(uniform({2, 7, 36}, 309), 3, 1.0, uniform({6, 7}, 310)),
                    Catch::Contains("qkv_attention: bias"));
}

TEST_CASE("fused attention: excluded pairs get no weight, an all-excluded row is NaN", "[cpu]") {
  const Tensor q = uniform({1, 1, 2, 4}, 41), k = uniform({1, 1, 3, 4}, 42);
  const Tensor v = ska::test::values({1, 10, 2, 20, 3, 30}, {1, 1, 3, 2});
  // Row 0 sees only key 1; row 1 sees nothing.
  const Tensor bias = ska::test::values({-kInf, 0, -kInf, -kInf, -kInf, -kInf}, {2, 3});
  const Tensor out = scaled_dot_attention(q, k, v, 1.0, bias);
  const std::vector<double> o = out.to_vector<double>();
  CHECK(o[0] == 2.0);
  CHECK(o[1] == 20.0);
  CHECK(std::isnan(o[2]));
  CHECK(std::isnan(o[3]));
}

namespace {

// [nq, nk] of dtype dt: -inf at (i, i), 0 elsewhere.
Tensor minus_inf_diagonal(int64_t nq, int64_t nk, DType dt) {
  std::vector<double> m(static_cast<size_t>(nq * nk), 0.0);
  for (int64_t i = 0; i < std::min(nq, nk); ++i) m[static_cast<size_t>(i * nk + i)] = -kInf;
  return Tensor::from_vector(m, {nq, nk}, dt);
}

}  // namespace

TEST_CASE("fused attention: the diagonal mask is an -inf bias on the diagonal, without the bias",
          "[cpu]") {
  // Query blocks past the kernel's 64 rows, rows past the keys (nothing excluded there), a
  // learnable bias beside the mask, and qkv_attention's packed form.
  for (const DType dt : {DType::kF64, DType::kF32}) {
    for (const auto& [nq, nk] : {std::pair<int64_t, int64_t>{70, 66}, {65, 65}}) {
      INFO(dtype_name(dt) << ", " << nq << " queries, " << nk << " keys");
      const TensorList in = {
          uniform({2, 3, nq, 8}, 81, -2, 2, dt), uniform({2, 3, nk, 8}, 82, -1, 1, dt),
          uniform({2, 3, nk, 5}, 83, -1, 1, dt), uniform({3, nq, nk}, 84, -1, 1, dt)};
      TensorList a, b;
      for (const Tensor& t : in) {
        a.push_back(t.detach().clone().set_requires_grad());
        b.push_back(t.detach().clone().set_requires_grad());
      }
      const Tensor masked = scaled_dot_attention(a[0], a[1], a[2], 0.3, a[3], Tensor(), Tensor(),
                                                 AttentionMask::kDiagonal);
      const Tensor biased =
          scaled_dot_attention(b[0], b[1], b[2], 0.3, add(b[3], minus_inf_diagonal(nq, nk, dt)));
      CHECK(test::bitwise_equal(masked, biased));
      const Tensor w = uniform(masked.shape(), 85, -1, 1, dt);
      sum(mul(masked, w)).backward();
      sum(mul(biased, w)).backward();
      for (int i = 0; i < 3; ++i) CHECK(test::bitwise_equal(a[i].grad(), b[i].grad()));
      // The bias's gradient: the same off the diagonal, +0 on it (the -inf bias gives +-0 there).
      require_close(a[3].grad(), b[3].grad(), {0.0, 0.0}, "grad bias");
      CHECK(ska::test::plus_zero_diagonal(a[3].grad()));
    }
  }
  SECTION("qkv_attention") {
    const Tensor qkv = uniform({2, 65, 3 * 4 * 8}, 86, -1, 1).set_requires_grad();
    const Tensor qkv2 = qkv.detach().clone().set_requires_grad();
    const Tensor masked = qkv_attention(qkv, 4, 0.25, Tensor(), Tensor(), AttentionMask::kDiagonal);
    const Tensor biased = qkv_attention(qkv2, 4, 0.25, minus_inf_diagonal(65, 65, DType::kF64));
    CHECK(test::bitwise_equal(masked, biased));
    sum(masked).backward();
    sum(biased).backward();
    CHECK(test::bitwise_equal(qkv.grad(), qkv2.grad()));
  }
  SECTION("softmax_attend: the same as the logits masked to the lowest finite value") {
    for (const DType dt : {DType::kF64, DType::kF32}) {
      INFO(dtype_name(dt));
      const Tensor logits = uniform({2, 3, 65, 65}, 87, -3, 3, dt).set_requires_grad();
      const Tensor logits2 = logits.detach().clone().set_requires_grad();
      const Tensor v = uniform({2, 3, 65, 16}, 88, -1, 1, dt);
      const Tensor tau = Tensor::full({1}, 0.7, dt == DType::kF64 ? dt : DType::kF32);
      const Tensor masked = softmax_attend(logits, v, tau, AttentionMask::kDiagonal);
      const double lowest = dt == DType::kF64 ? -1.7976931348623157e308 : -3.4028234663852886e38;
      // What attend() ran before the kernels took the mask.
      const Tensor reference =
          softmax_attend(masked_fill(logits2, nn_free_diagonal(65), lowest), v, tau);
      CHECK(test::bitwise_equal(masked, reference));
      const Tensor w = uniform(masked.shape(), 89, -1, 1, dt);
      sum(mul(masked, w)).backward();
      sum(mul(reference, w)).backward();
      CHECK(test::bitwise_equal(logits.grad(), logits2.grad()));
      CHECK(ska::test::plus_zero_diagonal(logits.grad()));
    }
  }
}

TEST_CASE("fused attention: a permuted bias gets its gradient in its own layout, without a copy",
          "[cpu]") {
  // CSKA's logits from their matrix product: [h, B, N, K] seen as [B, h, N, K].
  const int64_t h = 3, batch = 2, n = 20, keys = 20;
  for (const int64_t d : {int64_t{0}, int64_t{8}}) {
    INFO("head dim " << d);
    const Tensor base = uniform({h, batch, n, keys}, 91, -2, 2).set_requires_grad();
    const Tensor base2 = base.detach().clone().set_requires_grad();
    const Tensor q = uniform({batch, h, n, d}, 92), k = uniform({batch, h, keys, d}, 93);
    const Tensor v = uniform({batch, h, keys, 6}, 94);
    const Tensor w = uniform({batch, h, n, 6}, 95);
    const Tensor out = scaled_dot_attention(q, k, v, 0.5, base.transpose(0, 1));
    CHECK(
        test::copies_of([&] { sum(mul(out, w)).backward(); }, {"[3, 2, 20, 20]", "[2, 3, 20, 20]"})
            .empty());
    CHECK(base.grad().is_contiguous());
    // The same numbers as with the bias copied into [B, h, N, K] first.
    const Tensor out2 = scaled_dot_attention(q, k, v, 0.5, base2.transpose(0, 1).contiguous());
    sum(mul(out2, w)).backward();
    CHECK(test::bitwise_equal(out, out2));
    CHECK(test::bitwise_equal(base.grad(), base2.grad()));
  }
  // A broadcast bias's gradient is summed as before.
  const Tensor shared = uniform({1, 3, 5, 5}, 96).set_requires_grad();
  const Tensor y = scaled_dot_attention(uniform({2, 3, 5, 4}, 97), uniform({2, 3, 5, 4}, 98),
                                        uniform({2, 3, 5, 4}, 99), 1.0, shared);
  sum(y).backward();
  CHECK(shared.grad().shape() == Shape{1, 3, 5, 5});
}

TEST_CASE("fused attention: logits in rows padded to 16 bytes get their gradient padded alike",
          "[cpu]") {
  // CSKA-ViT's logits: a class row and the grid rows put together by cat into a tensor from
  // empty_aligned_rows ([B, h, 1 + P, K] in rows of K rounded up to 16 bytes); the fused op's
  // gradient of them keeps that layout, so the grid rows' gradient reaches their producer (the
  // conv logits' backward) in rows 16 bytes apart. The values are the dense tensor's, to the bit.
  const int64_t batch = 2, h = 3, n = 13, dv = 8;  // 13 keys: rows of 16 (bf16), 14 (f64)
  for (const DType dtype : {DType::kF64, DType::kBF16}) {
    INFO(dtype_name(dtype));
    const int64_t per_row = dtype == DType::kF64 ? 14 : 16;
    const Tensor cls = uniform({batch, h, 1, n}, 101, -2, 2, dtype).set_requires_grad();
    const Tensor grid = uniform({batch, h, n - 1, n}, 102, -2, 2, dtype).set_requires_grad();
    const Tensor v = uniform({batch, h, n, dv}, 103, -1, 1, dtype);
    const Tensor w = uniform({batch, h, n, dv}, 104, -1, 1, dtype);
    const Tensor factor = Tensor::full({1}, 0.7, dtype == DType::kF64 ? DType::kF64 : DType::kF32);
    struct Run {
      Tensor out, grad_cls, grad_grid;
      Shape grid_grad_strides;
    };
    const auto run = [&](bool padded) {
      const Shape shape{batch, h, n, n};
      const Tensor all = padded ? empty_aligned_rows(shape, dtype, Device::cpu())
                                : Tensor::empty(shape, dtype, Device::cpu());
      Run r;
      // The grid rows pass a probe that notes the strides of the gradient they get.
      const Tensor rows = mul(grid, 1.0);
      const Tensor probed =
          Tensor::make_view(rows.storage(), rows.shape(), rows.strides(), rows.offset(), dtype);
      autograd::record_op("probe", {rows}, {probed}, [&r](const TensorList& g) {
        r.grid_grad_strides = g[0].strides();
        return TensorList{g[0]};
      });
      const Tensor logits = cat({mul(cls, 1.0), probed}, 2, all);
      r.out = softmax_attend(logits, v, factor, AttentionMask::kDiagonal);
      cls.zero_grad();
      grid.zero_grad();
      sum(mul(r.out.to(DType::kF64), w.to(DType::kF64))).backward();
      r.grad_cls = cls.grad();
      r.grad_grid = grid.grad();
      return r;
    };
    const Run dense = run(false), padded = run(true);
    CHECK(dense.grid_grad_strides == (Shape{h * n * n, n * n, n, 1}));
    CHECK(padded.grid_grad_strides == (Shape{h * n * per_row, n * per_row, per_row, 1}));
    CHECK(test::bitwise_equal(padded.out, dense.out));
    CHECK(test::bitwise_equal(padded.grad_cls, dense.grad_cls));
    CHECK(test::bitwise_equal(padded.grad_grid, dense.grad_grid));
  }
}

TEST_CASE("fused attention in 16 bits rounds the f32 result once", "[cpu]") {
  const Tensor q = uniform({2, 2, 33, 16}, 51, -1, 1, DType::kF32);
  const Tensor k = uniform({2, 2, 40, 16}, 52, -1, 1, DType::kF32);
  const Tensor v = uniform({2, 2, 40, 16}, 53, -1, 1, DType::kF32);
  const Tensor reference = scaled_dot_attention(q, k, v, 0.25);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Tensor out = scaled_dot_attention(q.to(dt), k.to(dt), v.to(dt), 0.25);
    CHECK(out.dtype() == dt);
    require_close(out, reference, tolerance_for(dt), dtype_name(dt));
  }
  // Under bf16 autocast the op runs in bf16 and its gradients return to f32.
  const Tensor qa = q.detach().clone().set_requires_grad();
  Tensor out;
  {
    AutocastGuard guard(DType::kBF16);
    out = scaled_dot_attention(qa, k, v, 0.25);
  }
  CHECK(out.dtype() == DType::kBF16);
  sum(out).backward();
  CHECK(qa.grad().dtype() == DType::kF32);
}

TEST_CASE("fused attention counts the MACs of the two products it replaces", "[cpu]") {
  const Tensor q = uniform({2, 3, 7, 8}, 61), k = uniform({3, 9, 8}, 62);
  const Tensor v = uniform({2, 3, 9, 5}, 63);
  int64_t fused = 0, plain = 0;
  {
    MacCounter count;
    scaled_dot_attention(q, k, v, 1.0);
    fused = count.total();
  }
  {
    MacCounter count;
    unfused(q, k, v, 1.0, Tensor());
    plain = count.total();
  }
  CHECK(fused == 2 * 3 * 7 * 9 * (8 + 5));
  CHECK(fused == plain);
  // Nested counters both count; a pause hides the ops from every one, and ends.
  MacCounter outer;
  {
    MacCounter inner;
    {
      const MacCountingPause pause;
      scaled_dot_attention(q, k, v, 1.0);
      MacCounter inside_pause;  // a counter made during a pause counts on its own
      scaled_dot_attention(q, k, v, 1.0);
      CHECK(inside_pause.total() == fused);
    }
    CHECK(inner.total() == 0);
    scaled_dot_attention(q, k, v, 1.0);
    CHECK(inner.total() == fused);
  }
  CHECK(outer.total() == fused);
}

TEST_CASE("fused attention: a row with no live key keeps its NaN out of the other gradients",
          "[cpu]") {
  // One key under the diagonal mask: query 0 attends to nothing (out and lse NaN, as softmax
  // gives), queries 1 and 2 to key 0 alone. The excluded pair has weight 0 in the backward too,
  // as the CUDA kernels never compute it, so dL/dv = dO[1] + dO[2], and row 0's gradients are 0.
  Tensor q = uniform({1, 1, 3, 4}, 301).set_requires_grad();
  Tensor k = uniform({1, 1, 1, 4}, 302).set_requires_grad();
  Tensor v = uniform({1, 1, 1, 4}, 303).set_requires_grad();
  const Tensor out =
      scaled_dot_attention(q, k, v, 0.5, Tensor(), Tensor(), Tensor(), AttentionMask::kDiagonal);
  const std::vector<double> o = out.to_vector<double>();
  const std::vector<double> vv = v.to_vector<double>();
  for (int c = 0; c < 4; ++c) {
    CHECK(std::isnan(o[c]));
    CHECK(o[4 + c] == vv[c]);
    CHECK(o[8 + c] == vv[c]);
  }
  const Tensor g = uniform({1, 1, 3, 4}, 304);
  sum(mul(out, g)).backward();
  const std::vector<double> gv = v.grad().to_vector<double>(), gg = g.to_vector<double>();
  for (int c = 0; c < 4; ++c) CHECK(gv[c] == Approx(gg[4 + c] + gg[8 + c]));
  for (const double x : q.grad().to_vector<double>()) CHECK(x == 0.0);
  for (const double x : k.grad().to_vector<double>()) CHECK(x == 0.0);
}

TEST_CASE(
    "fused attention: logits given as the bias with an empty value dim still get their "
    "gradient",
    "[cpu]") {
  // d = dv = 0: the output has no elements, so the logits' gradient is 0, and it must be written
  // (the kernel contract: everything is written), not left as the allocator's memory.
  const Tensor logits = Tensor::full({2, 3, 5, 6}, 7.0).set_requires_grad();
  const Tensor v = Tensor::zeros({2, 3, 6, 0});
  const Tensor out = softmax_attend(logits, v);
  CHECK(out.shape() == Shape{2, 3, 5, 0});
  sum(out).backward();
  REQUIRE(logits.grad().defined());
  for (const double x : logits.grad().to_vector<double>()) CHECK(x == 0.0);
}

TEST_CASE("fused attention rejects shapes that do not fit, naming them", "[cpu]") {
  const Tensor q = uniform({2, 3, 5, 8}, 71);
  CHECK_THROWS_WITH(
      scaled_dot_attention(q, uniform({2, 3, 5, 7}, 72), uniform({2, 3, 5, 8}, 73), 1.0),
      Catch::Contains("q and k need the same last dim"));
  CHECK_THROWS_WITH(
      scaled_dot_attention(q, uniform({4, 3, 5, 8}, 74), uniform({4, 3, 5, 8}, 75), 1.0),
      Catch::Contains("k Tensor[4, 3, 5, 8]") && Catch::Contains("does not broadcast"));
  CHECK_THROWS_WITH(scaled_dot_attention(q, q, q, 1.0, uniform({5, 6}, 76)),
                    Catch::Contains("bias"));
  CHECK_THROWS_WITH(scaled_dot_attention(uniform({5, 8}, 77), q, q, 1.0),
                    Catch::Contains("needs 3 to 6 dims"));
}

TEST_CASE("qkv_attention: CUDA matches the CPU in f32, bf16 and f16", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // ViT-S on CIFAR (65 tokens, d = 64: the one-block backward's size), 197 tokens (the two
  // kernels), and LSA's diagonal mask with a learnable temperature.
  Tensor diagonal = Tensor::zeros({65, 65}, DType::kF64);
  diagonal = masked_fill(diagonal, nn_free_diagonal(65), -kInf);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    for (const int64_t n : {65, 197}) {
      ska::test::check_cuda_parity(
          [](const TensorList& in) { return qkv_attention(in[0], 4, 0.125); },
          {uniform({2, n, 3 * 4 * 64}, 91 + n).set_requires_grad()}, dt);
    }
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return qkv_attention(in[0], 2, 1.0, in[1], exp(in[2])); },
        {uniform({3, 65, 3 * 2 * 32}, 95).set_requires_grad(), diagonal,
         Tensor::full({1}, -1.5, DType::kF64)},
        dt);
  }
}

TEST_CASE("fused attention: CUDA matches the CPU in f32, bf16 and f16", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor q = uniform({2, 3, 65, 32}, 81).set_requires_grad();
    Tensor k = uniform({3, 65, 32}, 82).set_requires_grad();  // static keys
    Tensor v = uniform({2, 3, 65, 32}, 83).set_requires_grad();
    Tensor bias = uniform({3, 65, 65}, 84).set_requires_grad();
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return scaled_dot_attention(in[0], in[1], in[2], 0.17, in[3]); },
        {q, k, v, bias}, dt);
    // The factors' gradients below sum 2 x 3 x 65 x 65 products of the logits' gradient (rounded
    // to 16 bits, from the rounded output) with heavy cancellation: in bf16 the CPU itself lands
    // 3% off its f32 result. They get a tolerance of their own in 16 bits; the other gradients
    // keep the strict one.
    const Tolerance loose = dt == DType::kF32 ? tolerance_for(dt) : Tolerance{0.15, 0.1};
    // Attention from given logits (head dim 0) with a temperature on them.
    const Tensor logits = uniform({2, 3, 65, 65}, 85, -3, 3);
    const auto from_logits = [](const TensorList& in) {
      return softmax_attend(in[0], in[1], exp(in[2]));
    };
    const Tensor temperature = Tensor::full({1}, -0.2, DType::kF64);
    ska::test::check_cuda_parity(from_logits,
                                 {logits.detach().set_requires_grad(), v, temperature}, dt);
    ska::test::check_cuda_parity(from_logits,
                                 {logits, v.detach(), temperature.detach().set_requires_grad()},
                                 dt, &loose);
    // A learnable temperature read on the device (the factor is cast to f32 inside the op).
    const auto scaled = [](const TensorList& in) {
      return scaled_dot_attention(in[0], in[1], in[2], 0.17, Tensor(), exp(in[3]));
    };
    const Tensor t = Tensor::full({1}, 0.4, DType::kF64);
    ska::test::check_cuda_parity(scaled, {q, k, v, t}, dt);
    ska::test::check_cuda_parity(
        scaled, {q.detach(), k.detach(), v.detach(), t.detach().set_requires_grad()}, dt, &loose);
  }
}
