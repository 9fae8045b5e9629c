// Layer norm (channels-last and channels-first) and batch norm: hand-computed values, running-stat
// updates, gradients by finite differences, errors, and CUDA parity.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "autograd/node.h"
#include "ops/autocast.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {
const ska::test::Tolerance kExact = tolerance_for(DType::kF64);
}  // namespace

TEST_CASE("layer norm of a known row", "[cpu]") {
  // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  const Tensor x = values({1, 2, 3, 4, 5, 5, 5, 5}, {2, 4});
  const double eps = 1e-5, s = 1.0 / std::sqrt(1.25 + eps);
  const std::vector<double> xhat = {-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s};
  // A constant row normalises to 0 (variance 0, eps keeps it finite).
  require_close(layer_norm(x, Tensor(), Tensor(), eps),
                values({xhat[0], xhat[1], xhat[2], xhat[3], 0, 0, 0, 0}, {2, 4}), kExact);
  const Tensor w = values({1, 0.5, 2, -1}, {4}), b = values({0, 1, 0, 0.5}, {4});
  require_close(layer_norm(x, w, b, eps),
                values({xhat[0], 0.5 * xhat[1] + 1, 2 * xhat[2], -xhat[3] + 0.5,  //
                        0, 1, 0, 0.5}, {2, 4}), kExact);
  // Weight without bias (the MetaFormer norms).
  require_close(layer_norm(x, w, Tensor(), eps),
                values({xhat[0], 0.5 * xhat[1], 2 * xhat[2], -xhat[3], 0, 0, 0, 0}, {2, 4}),
                kExact);
  // f32 matches.
  require_close(layer_norm(x.to(DType::kF32), w.to(DType::kF32), b.to(DType::kF32), eps),
                layer_norm(x, w, b, eps), tolerance_for(DType::kF32));
}

TEST_CASE("layer norm over channels of a channels-first tensor", "[cpu]") {
  // x [1, 2, 1, 2]: position 0 has channels (1, 3), position 1 has channels (5, 1).
  const Tensor x = values({1, 5, 3, 1}, {1, 2, 1, 2});
  const double eps = 1e-6;
  const double a = 1.0 / std::sqrt(1.0 + eps);  // position 0: mean 2, variance 1
  const double c = 2.0 / std::sqrt(4.0 + eps);  // position 1: mean 3, variance 4
  require_close(layer_norm_channels_first(x, Tensor(), Tensor(), eps),
                values({-a, c, a, -c}, {1, 2, 1, 2}), kExact);
  const Tensor w = values({2, 3}, {2}), b = values({0.5, -1}, {2});
  const Tensor y = layer_norm_channels_first(x, w, b, eps);
  CHECK(y.is_contiguous());
  require_close(y, values({-2 * a + 0.5, 2 * c + 0.5, 3 * a - 1, -3 * c - 1}, {1, 2, 1, 2}),
                kExact);
  // A 3-D [N, C, L] input agrees with layer norm over the last dim of its transpose.
  const Tensor x3 = uniform({2, 5, 3}, 30);
  require_close(layer_norm_channels_first(x3, Tensor(), Tensor(), eps),
                layer_norm(x3.transpose(1, 2), Tensor(), Tensor(), eps).transpose(1, 2), kExact);
}

TEST_CASE("batch norm in training and eval, with the running-stat update", "[cpu]") {
  // x [N=2, C=2, L=2]. Channel 0 holds {1, 2, 3, 6}: mean 3, biased var 3.5, unbiased 14/3.
  // Channel 1 holds {0, 0, 4, 4}: mean 2, biased var 4, unbiased 16/3.
  const Tensor x = values({1, 2, 0, 0, 3, 6, 4, 4}, {2, 2, 2});
  const Tensor w = values({2, 0.5}, {2}), b = values({1, -1}, {2});
  const double eps = 1e-5, momentum = 0.1;
  Tensor running_mean = Tensor::zeros({2}, DType::kF64);
  Tensor running_var = Tensor::ones({2}, DType::kF64);

  SECTION("training uses batch statistics and updates the running ones") {
    const double s0 = 1.0 / std::sqrt(3.5 + eps), s1 = 1.0 / std::sqrt(4.0 + eps);
    const Tensor y = batch_norm(x, w, b, running_mean, running_var, true, momentum, eps);
    require_close(y, values({2 * (1 - 3) * s0 + 1, 2 * (2 - 3) * s0 + 1,      //
                             0.5 * (0 - 2) * s1 - 1, 0.5 * (0 - 2) * s1 - 1,  //
                             2 * (3 - 3) * s0 + 1, 2 * (6 - 3) * s0 + 1,      //
                             0.5 * (4 - 2) * s1 - 1, 0.5 * (4 - 2) * s1 - 1}, {2, 2, 2}),
                  kExact);
    // running = 0.9 * running + 0.1 * batch (unbiased variance).
    require_close(running_mean, values({0.3, 0.2}, {2}), kExact);
    require_close(running_var, values({0.9 + 0.1 * 14.0 / 3.0, 0.9 + 0.1 * 16.0 / 3.0}, {2}),
                  kExact);
    // A second step moves them again.
    batch_norm(x, w, b, running_mean, running_var, true, momentum, eps);
    require_close(running_mean, values({0.9 * 0.3 + 0.3, 0.9 * 0.2 + 0.2}, {2}), kExact);
  }
  SECTION("eval uses the running statistics and leaves them alone") {
    running_mean = values({1, -1}, {2});
    running_var = values({4, 0.25}, {2});
    const double s0 = 1.0 / std::sqrt(4 + eps), s1 = 1.0 / std::sqrt(0.25 + eps);
    const Tensor y = batch_norm(x, Tensor(), Tensor(), running_mean, running_var, false,
                                momentum, eps);
    require_close(y, values({0 * s0, 1 * s0, 1 * s1, 1 * s1, 2 * s0, 5 * s0, 5 * s1, 5 * s1},
                            {2, 2, 2}), kExact);
    require_close(running_mean, values({1, -1}, {2}), kExact);
    require_close(running_var, values({4, 0.25}, {2}), kExact);
  }
  SECTION("training without running statistics, and f32 running stats for f64 input") {
    const Tensor y = batch_norm(x, w, b, Tensor(), Tensor(), true, momentum, eps);
    Tensor rm32 = Tensor::zeros({2}, DType::kF32), rv32 = Tensor::ones({2}, DType::kF32);
    require_close(batch_norm(x, w, b, rm32, rv32, true, momentum, eps), y, kExact);
    require_close(rm32, values({0.3, 0.2}, {2}), tolerance_for(DType::kF32));
  }
}

TEST_CASE("layer norm gradients match finite differences", "[cpu]") {
  Tensor x = uniform({3, 5}, 40, -2.0, 2.0).set_requires_grad();
  Tensor w = uniform({5}, 41, 0.5, 1.5).set_requires_grad();
  Tensor b = uniform({5}, 42).set_requires_grad();
  check_gradients([](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b});
  check_gradients([](const TensorList& in) { return layer_norm(in[0], in[1], Tensor()); }, {x, w});
  check_gradients([](const TensorList& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {x});
  // Weight only (frozen input).
  check_gradients([](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); },
                  {x.detach(), w, b});
  Tensor x4 = uniform({2, 3, 2, 2}, 43, -2.0, 2.0).set_requires_grad();
  Tensor w3 = uniform({3}, 44, 0.5, 1.5).set_requires_grad();
  check_gradients(
      [](const TensorList& in) { return layer_norm_channels_first(in[0], in[1], Tensor()); },
      {x4, w3});
  Tensor x3 = uniform({2, 2, 4}, 45, -2.0, 2.0).set_requires_grad();
  check_gradients([](const TensorList& in) { return layer_norm(in[0].transpose(1, 2), {}, {}); },
                  {x3});
}

namespace {

// Both outputs of x + y followed by a layer norm, concatenated (f32 for a 16-bit norm output), so
// that one loss reaches both.
Tensor residual_norm_outputs(const ResidualNorm& r) {
  const DType dt = r.sum.dtype();
  return cat({r.sum.flatten(), r.normed.to(dt).flatten()}, 0);
}

struct ResidualNormRun {
  Tensor sum, normed, gx, gy, gw, gb;
  std::string node;  // the op that made the sum
};

// add_layer_norm (fused) or add then layer_norm, then backward from a fixed weighting of the sum
// (when use_sum) and of the normed output (when use_normed).
ResidualNormRun run_residual_norm(bool fused, DType x_dtype, DType y_dtype,
                                  std::optional<DType> out_dtype, bool use_sum, bool use_normed,
                                  bool with_bias) {
  const Shape shape{6, 37};
  Tensor x = uniform(shape, 80, -2.0, 2.0).to(x_dtype).set_requires_grad();
  Tensor y = uniform(shape, 81, -2.0, 2.0).to(y_dtype).set_requires_grad();
  Tensor w = uniform({37}, 82, 0.5, 1.5).to(x_dtype).set_requires_grad();
  Tensor b = with_bias ? uniform({37}, 83).to(x_dtype).set_requires_grad() : Tensor();
  ResidualNorm r;
  if (fused) {
    r = add_layer_norm(x, y, w, b, 1e-5, out_dtype);
  } else {
    r.sum = add(x, y);
    r.normed = layer_norm(r.sum, w, b, 1e-5, out_dtype);
  }
  Tensor loss = Tensor::zeros({}, x_dtype);
  if (use_sum) loss = add(loss, sum(mul(r.sum, uniform(shape, 84).to(x_dtype))));
  if (use_normed) loss = add(loss, sum(mul(r.normed, uniform(shape, 85).to(x_dtype))));
  loss.backward();
  return {r.sum,
          r.normed,
          x.grad(),
          y.grad(),
          w.grad(),
          with_bias ? b.grad() : Tensor(),
          r.sum.grad_fn()->name()};
}

}  // namespace

TEST_CASE("add_layer_norm: the values and gradients of add then layer_norm, bit for bit", "[cpu]") {
  using ska::test::bitwise_equal;
  struct Case {
    DType x, y;
    std::optional<DType> out;
  };
  // f64; f32; an f32 residual stream with a bf16 / f16 branch and a 16-bit norm output (autocast),
  // or with an f32 output (a norm read by more than one product).
  for (const Case& c :
       {Case{DType::kF64, DType::kF64, std::nullopt}, Case{DType::kF32, DType::kF32, std::nullopt},
        Case{DType::kF32, DType::kBF16, DType::kBF16}, Case{DType::kF32, DType::kF16, DType::kF16},
        Case{DType::kF32, DType::kBF16, DType::kF32}}) {
    for (const auto& [use_sum, use_normed] :
         {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
      for (const bool with_bias : {true, false}) {
        INFO(dtype_name(c.x) << " + " << dtype_name(c.y) << ", sum used " << use_sum
                             << ", normed used " << use_normed << ", bias " << with_bias);
        const ResidualNormRun f =
            run_residual_norm(true, c.x, c.y, c.out, use_sum, use_normed, with_bias);
        const ResidualNormRun u =
            run_residual_norm(false, c.x, c.y, c.out, use_sum, use_normed, with_bias);
        CHECK(f.node == "add_layer_norm");
        CHECK(u.node == "add");
        CHECK(f.sum.dtype() == c.x);
        CHECK(f.normed.dtype() == c.out.value_or(c.x));
        CHECK(f.gy.dtype() == c.y);
        CHECK(bitwise_equal(f.sum, u.sum));
        CHECK(bitwise_equal(f.normed, u.normed));
        CHECK(bitwise_equal(f.gx, u.gx));
        CHECK(bitwise_equal(f.gy, u.gy));
        if (use_normed) {
          CHECK(bitwise_equal(f.gw, u.gw));
          if (with_bias) CHECK(bitwise_equal(f.gb, u.gb));
        } else {  // the norm is never reached unfused; the fused node gives zeros
          CHECK_FALSE(u.gw.defined());
          CHECK(amax(abs(f.gw)).item() == 0.0);
        }
      }
    }
  }
}

TEST_CASE(
    "add_layer_norm with the branch's dropout and scale: the draws, values and gradients of "
    "dropout, add or scaled_residual, and layer_norm",
    "[cpu]") {
  using ska::test::bitwise_equal;
  // The dropout closing a branch (p = 0.3), CaiT's LayerScale on it (sum = x + dropout(y) *
  // scale), and both. 40 columns take the dropout into the one kernel; 37 (a mask byte across
  // rows) run the dropout op first, the scale still inside. f32; an f32 stream with a bf16 branch
  // and a bf16 or an f32 output; f64 (the dropout op first); autocast's bf16 stream with f32
  // parameters, whose scaled sums take scaled_residual (the dropout inside it) and the norm.
  struct Case {
    DType x, y;
    std::optional<DType> out;
    bool autocast;
  };
  for (const int64_t cols : {40, 37}) {
    for (const Case& c : {Case{DType::kF32, DType::kF32, std::nullopt, false},
                          Case{DType::kF32, DType::kBF16, DType::kBF16, false},
                          Case{DType::kF32, DType::kBF16, DType::kF32, false},
                          Case{DType::kF64, DType::kF64, std::nullopt, false},
                          Case{DType::kBF16, DType::kBF16, DType::kBF16, true}}) {
      for (const auto& [p, scaled] :
           {std::pair{0.3, false}, std::pair{0.0, true}, std::pair{0.3, true}}) {
        INFO(cols << " columns, " << dtype_name(c.x) << " + " << dtype_name(c.y) << ", autocast "
                  << c.autocast << ", dropout " << p << ", scaled " << scaled);
        const Shape shape{6, cols};
        const DType param = c.autocast ? DType::kF32 : c.x;
        struct Run {
          ResidualNorm r;
          Tensor gx, gy, gw, gb, gs;
          uint64_t offset;
          std::string node;
          int dropout_nodes;
        } run[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor x = uniform(shape, 110, -2.0, 2.0).to(c.x).set_requires_grad();
          Tensor y = uniform(shape, 111, -2.0, 2.0).to(c.y).set_requires_grad();
          Tensor w = uniform({cols}, 112, 0.5, 1.5).to(param).set_requires_grad();
          Tensor b = uniform({cols}, 113).to(param).set_requires_grad();
          Tensor scale =
              scaled ? uniform({cols}, 116, -0.5, 0.5).to(param).set_requires_grad() : Tensor();
          Generator gen(77);
          gen.advance(40);  // start past counter 0
          Tensor loss;
          {
            std::optional<AutocastGuard> autocast;
            if (c.autocast) autocast.emplace(DType::kBF16);
            ResidualNorm& r = run[fused].r;
            if (fused == 1) {
              r = add_layer_norm(x, y, w, b, 1e-5, c.out, p, &gen, scale);
            } else {
              const Tensor dropped = dropout(y, p, true, &gen);
              r.sum = scaled ? scaled_residual(x, Tensor(), dropped, scale) : add(x, dropped);
              r.normed = layer_norm(r.sum, w, b, 1e-5, c.out);
            }
            loss = add(sum(mul(r.sum, uniform(shape, 114).to(r.sum.dtype()))),
                       sum(mul(r.normed, uniform(shape, 115).to(r.normed.dtype()))));
          }
          run[fused].dropout_nodes = ska::test::count_nodes(loss, "dropout");
          loss.backward();
          run[fused].gx = x.grad();
          run[fused].gy = y.grad();
          run[fused].gw = w.grad();
          run[fused].gb = b.grad();
          run[fused].gs = scaled ? scale.grad() : Tensor();
          run[fused].offset = gen.offset();
          run[fused].node = run[fused].r.sum.grad_fn()->name();
        }
        const Run &f = run[1], &u = run[0];
        const bool unfused_scale = scaled && c.autocast;
        CHECK(f.node == (unfused_scale ? "scaled_residual" : "add_layer_norm"));
        CHECK(u.dropout_nodes == (p > 0.0 ? 1 : 0));
        // The dropout runs inside add_layer_norm's kernels, or, unfused, inside scaled_residual's.
        const bool inside = (cols % 8 == 0 && c.x != DType::kF64) || unfused_scale;
        CHECK(f.dropout_nodes == (p > 0.0 && !inside ? 1 : 0));
        CHECK(f.offset == u.offset);  // the same draws
        CHECK(f.r.sum.dtype() == u.r.sum.dtype());
        CHECK(bitwise_equal(f.r.sum, u.r.sum));
        CHECK(bitwise_equal(f.r.normed, u.r.normed));
        CHECK(bitwise_equal(f.gx, u.gx));
        CHECK(f.gy.dtype() == c.y);
        CHECK(bitwise_equal(f.gy, u.gy));
        CHECK(bitwise_equal(f.gw, u.gw));
        CHECK(bitwise_equal(f.gb, u.gb));
        if (scaled) {
          CHECK(bitwise_equal(f.gs, u.gs));
          CHECK(amax(abs(f.gs)).item() > 0.0);
        }
        if (p == 0.0) continue;
        // Some of the branch dropped, some kept (its gradient is zero exactly where dropped).
        const std::vector<double> gy = f.gy.to_vector<double>();
        const auto zeros = std::count(gy.begin(), gy.end(), 0.0);
        CHECK(zeros > 0);
        CHECK(zeros < static_cast<long>(gy.size()) / 2);
      }
    }
  }
  // Gradients not wanted (16 columns, the dropout inside the kernels): a frozen branch, with only
  // x's or the weight's gradient (the mask unused on the way back); with a scale, a frozen branch
  // with a learnable scale and a learnable branch with a frozen scale.
  struct Wanted {
    bool x, y, w, scale, scaled;
  };
  for (const Wanted& want :
       {Wanted{true, false, false, false, false}, Wanted{false, false, true, false, false},
        Wanted{true, false, false, true, true}, Wanted{true, true, false, false, true}}) {
    INFO("gradients of x " << want.x << ", y " << want.y << ", the weight " << want.w
                           << ", the scale " << want.scale << "; scaled " << want.scaled);
    std::vector<Tensor> grads[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = uniform({4, 16}, 120).to(DType::kF32).set_requires_grad(want.x);
      Tensor y = uniform({4, 16}, 121).to(DType::kBF16).set_requires_grad(want.y);
      Tensor w = uniform({16}, 122, 0.5, 1.5).to(DType::kF32).set_requires_grad(want.w);
      Tensor scale =
          want.scaled ? uniform({16}, 124).to(DType::kF32).set_requires_grad(want.scale) : Tensor();
      Generator gen(3);
      ResidualNorm r;
      if (fused == 1) {
        r = add_layer_norm(x, y, w, Tensor(), 1e-5, DType::kBF16, 0.5, &gen, scale);
        CHECK(r.sum.grad_fn()->name() == "add_layer_norm");
      } else {
        const Tensor dropped = dropout(y, 0.5, true, &gen);
        r.sum = want.scaled ? scaled_residual(x, Tensor(), dropped, scale) : add(x, dropped);
        r.normed = layer_norm(r.sum, w, Tensor(), 1e-5, DType::kBF16);
      }
      sum(mul(r.normed.to(DType::kF32), uniform({4, 16}, 123).to(DType::kF32))).backward();
      for (const auto& [t, wanted] : {std::pair{x, want.x}, std::pair{y, want.y},
                                      std::pair{w, want.w}, std::pair{scale, want.scale}}) {
        if (wanted) grads[fused].push_back(t.grad());
      }
    }
    REQUIRE(grads[1].size() == grads[0].size());
    for (size_t i = 0; i < grads[0].size(); ++i) CHECK(bitwise_equal(grads[1][i], grads[0][i]));
  }
  CHECK_THROWS_WITH(add_layer_norm(uniform({2, 8}, 1), uniform({2, 8}, 2), Tensor(), Tensor(), 1e-5,
                                   std::nullopt, 1.0),
                    Catch::Contains("add_layer_norm") && Catch::Contains("[0, 1)"));
}

TEST_CASE("add_layer_norm gradients match finite differences", "[cpu]") {
  Tensor x = uniform({3, 5}, 86, -2.0, 2.0).set_requires_grad();
  Tensor y = uniform({3, 5}, 87, -2.0, 2.0).set_requires_grad();
  Tensor w = uniform({5}, 88, 0.5, 1.5).set_requires_grad();
  Tensor b = uniform({5}, 89).set_requires_grad();
  check_gradients(
      [](const TensorList& in) {
        return residual_norm_outputs(add_layer_norm(in[0], in[1], in[2], in[3]));
      },
      {x, y, w, b});
  // The residual input alone, and the parameters alone.
  check_gradients(
      [](const TensorList& in) {
        return residual_norm_outputs(add_layer_norm(in[0], in[1], in[2], Tensor()));
      },
      {x.detach(), y, w.detach()});
  check_gradients(
      [](const TensorList& in) {
        return residual_norm_outputs(add_layer_norm(in[0], in[1], in[2], in[3]));
      },
      {x.detach(), y.detach(), w, b});
  // A scale of the branch (CaiT's LayerScale), with every input's gradient.
  Tensor scale = uniform({5}, 99, -1.0, 1.0).set_requires_grad();
  CHECK(add_layer_norm(x, y, w, b, 1e-5, std::nullopt, 0.0, nullptr, scale).sum.grad_fn()->name() ==
        "add_layer_norm");
  check_gradients(
      [](const TensorList& in) {
        return residual_norm_outputs(
            add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, std::nullopt, 0.0, nullptr, in[4]));
      },
      {x, y, w, b, scale});
}

TEST_CASE("add_layer_norm under autocast: a bf16 stream normalised as its f32 copy", "[cpu]") {
  using ska::test::bitwise_equal;
  // Swin's and the MetaFormers' streams after a Linear or a convolution: bf16 x and y, f32
  // parameters; layer_norm casts the bf16 sum to f32 first, add_layer_norm reads it widened.
  for (const std::optional<DType> out :
       {std::optional<DType>(), std::optional<DType>(DType::kBF16)}) {
    INFO("output " << (out ? dtype_name(*out) : "unset"));
    ResidualNorm r[2];
    Tensor gx[2], gy[2], gw[2], gb[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = uniform({6, 37}, 100, -2.0, 2.0).to(DType::kBF16).set_requires_grad();
      Tensor y = uniform({6, 37}, 101, -2.0, 2.0).to(DType::kBF16).set_requires_grad();
      Tensor w = uniform({37}, 102, 0.5, 1.5).to(DType::kF32).set_requires_grad();
      Tensor b = uniform({37}, 103).to(DType::kF32).set_requires_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DType::kBF16);
        if (fused == 1) {
          r[1] = add_layer_norm(x, y, w, b, 1e-5, out);
        } else {
          r[0].sum = add(x, y);
          r[0].normed = layer_norm(r[0].sum, w, b, 1e-5, out);
        }
        loss = add(sum(mul(r[fused].sum, uniform({6, 37}, 104).to(DType::kBF16))),
                   sum(mul(r[fused].normed, uniform({6, 37}, 105).to(DType::kF32))));
      }
      loss.backward();
      gx[fused] = x.grad();
      gy[fused] = y.grad();
      gw[fused] = w.grad();
      gb[fused] = b.grad();
    }
    CHECK(r[1].sum.grad_fn()->name() == "add_layer_norm");
    CHECK(r[1].sum.dtype() == DType::kBF16);
    CHECK(r[1].normed.dtype() == out.value_or(DType::kF32));
    CHECK(bitwise_equal(r[1].sum, r[0].sum));
    CHECK(bitwise_equal(r[1].normed, r[0].normed));
    CHECK(bitwise_equal(gx[1], gx[0]));
    CHECK(bitwise_equal(gy[1], gy[0]));
    CHECK(gw[1].dtype() == DType::kF32);
    CHECK(bitwise_equal(gw[1], gw[0]));
    CHECK(bitwise_equal(gb[1], gb[0]));
  }
}

TEST_CASE("add_layer_norm takes the two ops where one kernel cannot", "[cpu]") {
  const Tensor x = uniform({4, 6}, 90), w = uniform({6}, 91, 0.5, 1.5);
  Tensor y = uniform({6}, 92).set_requires_grad();  // broadcast over the rows
  const ResidualNorm r = add_layer_norm(x, y, w, Tensor());
  CHECK(r.sum.grad_fn()->name() == "add");
  ska::test::require_close(r.normed, layer_norm(add(x, y), w, Tensor()), kExact);
  // Under autocast a bf16 stream with an f32 branch sums in f32 (promotion): the two ops.
  {
    AutocastGuard autocast(DType::kBF16);
    const Tensor x16 = x.to(DType::kBF16).set_requires_grad();
    const ResidualNorm a = add_layer_norm(x16, x.to(DType::kF32), w.to(DType::kF32), Tensor());
    CHECK(a.sum.grad_fn()->name() == "add");
    CHECK(a.sum.dtype() == DType::kF32);
  }
  // Bad parameters get layer_norm's error.
  CHECK_THROWS_WITH(
      add_layer_norm(x, x, uniform({4}, 93), Tensor()),
      Catch::Contains("layer_norm") && Catch::Contains("[6]") && Catch::Contains("[4]"));
  CHECK_THROWS_AS(add_layer_norm(x, uniform({4, 5}, 94), w, Tensor()), ShapeError);
  // A branch scale of another width: scaled_residual's error.
  CHECK_THROWS_AS(
      add_layer_norm(x, x, w, Tensor(), 1e-5, std::nullopt, 0.0, nullptr, uniform({5}, 95)),
      ShapeError);
}

TEST_CASE("batch norm gradients match finite differences", "[cpu]") {
  Tensor x = uniform({3, 2, 2, 2}, 50, -2.0, 2.0).set_requires_grad();
  Tensor w = uniform({2}, 51, 0.5, 1.5).set_requires_grad();
  Tensor b = uniform({2}, 52).set_requires_grad();
  const Tensor rm = values({0.1, -0.2}, {2}), rv = values({0.8, 1.3}, {2});
  for (bool training : {true, false}) {
    INFO("training " << training);
    check_gradients([&](const TensorList& in) {
      Tensor m = rm.clone(), v = rv.clone();  // fresh running stats per call
      return batch_norm(in[0], in[1], in[2], m, v, training);
    }, {x, w, b});
    check_gradients([&](const TensorList& in) {
      Tensor m = rm.clone(), v = rv.clone();
      return batch_norm(in[0], Tensor(), Tensor(), m, v, training);
    }, {x});
  }
  Tensor x2 = uniform({4, 3}, 53, -2.0, 2.0).set_requires_grad();  // [N, C] (no spatial dims)
  check_gradients([](const TensorList& in) {
    return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
  }, {x2});
}

TEST_CASE("batch norm of a 16-bit input with f32 parameters: the f32 form on its widened values",
          "[cpu][autocast]") {
  // What autocast did before (a cast of x to f32, batch norm in f32) and what it does now (batch
  // norm reading the 16-bit x with f32 parameters): y and grad_x are the f32 values rounded
  // once to x's dtype, the parameters' gradients and the running statistics the same f32
  // values. (Where only a matrix product reads y, as in CvT, which rounded it to 16 bits anyway,
  // the model's values are then the same bits; other readers now see y in 16 bits, as in
  // torch.autocast.)
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (bool training : {true, false}) {
      INFO(dtype_name(dt) << ", training " << training);
      const Tensor x = uniform({4, 3, 5, 5}, 54, -3.0, 3.0).to(dt).set_requires_grad();
      const Tensor w = uniform({3}, 55, 0.5, 1.5, DType::kF32).set_requires_grad();
      const Tensor b = uniform({3}, 56, -1.0, 1.0, DType::kF32).set_requires_grad();
      const Tensor g = uniform({4, 3, 5, 5}, 57).to(dt);
      Tensor rm = Tensor::full({3}, 0.1, DType::kF32), rv = Tensor::full({3}, 1.5, DType::kF32);
      Tensor rm_ref = rm.clone(), rv_ref = rv.clone();

      const Tensor y = batch_norm(x, w, b, rm, rv, training);
      REQUIRE(y.dtype() == dt);
      CHECK(y.grad_fn()->name() == "batch_norm");  // one node: no cast of x recorded
      y.backward(g);
      const TensorList grads = {x.grad(), w.grad(), b.grad()};

      const Tensor x32 = x.detach().to(DType::kF32).set_requires_grad();
      const Tensor w32 = w.detach().set_requires_grad(), b32 = b.detach().set_requires_grad();
      const Tensor y32 = batch_norm(x32, w32, b32, rm_ref, rv_ref, training);
      y32.backward(g.to(DType::kF32));
      const TensorList ref = {x32.grad(), w32.grad(), b32.grad()};

      CHECK(ska::test::bitwise_equal(y, y32.to(dt)));
      CHECK(ska::test::bitwise_equal(grads[0], ref[0].to(dt)));
      CHECK(ska::test::bitwise_equal(grads[1], ref[1]));
      CHECK(ska::test::bitwise_equal(grads[2], ref[2]));
      CHECK(ska::test::bitwise_equal(rm, rm_ref));
      CHECK(ska::test::bitwise_equal(rv, rv_ref));
    }
  }
  // Under autocast nothing is cast: the op runs on the 16-bit input as it is.
  const AutocastGuard autocast(DType::kBF16);
  const Tensor x = uniform({2, 3, 4, 4}, 58).to(DType::kBF16).set_requires_grad();
  const Tensor w = Tensor::ones({3}).to(DType::kF32).set_requires_grad();
  const Tensor y = batch_norm(x, w, Tensor::zeros({3}, DType::kF32), Tensor(), Tensor(), true);
  CHECK(y.dtype() == DType::kBF16);
  CHECK(y.grad_fn()->name() == "batch_norm");
  CHECK(y.grad_fn()->next_edges[0].fn->name() == "AccumulateGrad");  // x's own, no cast node
  // An f32 gradient arriving for the 16-bit y is read in y's dtype.
  y.backward(Tensor::ones({2, 3, 4, 4}, DType::kF32));
  CHECK(x.grad().dtype() == DType::kBF16);
  CHECK(w.grad().dtype() == DType::kF32);
}

TEST_CASE("norms reject bad arguments", "[cpu]") {
  const Tensor x = uniform({2, 3}, 60);
  CHECK_THROWS_WITH(layer_norm(x, uniform({4}, 61), Tensor()),
                    Catch::Contains("layer_norm") && Catch::Contains("[3]") &&
                        Catch::Contains("[4]"));
  CHECK_THROWS_AS(layer_norm(x, Tensor(), uniform({3}, 62, -1, 1, DType::kF32)), DTypeError);
  CHECK_THROWS_AS(layer_norm(Tensor::zeros({2, 3}, DType::kI64), Tensor(), Tensor()), DTypeError);
  CHECK_THROWS_AS(layer_norm_channels_first(uniform({3}, 63), Tensor(), Tensor()), ShapeError);
  CHECK_THROWS_AS(batch_norm(uniform({3}, 64), Tensor(), Tensor(), Tensor(), Tensor(), true),
                  ShapeError);
  CHECK_THROWS_AS(batch_norm(x, uniform({2}, 65), Tensor(), Tensor(), Tensor(), true), ShapeError);
  CHECK_THROWS_WITH(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false),
                    Catch::Contains("eval") && Catch::Contains("running"));
  CHECK_THROWS_WITH(batch_norm(uniform({1, 3}, 66), Tensor(), Tensor(), Tensor(), Tensor(), true),
                    Catch::Contains("more than 1 value") && Catch::Contains("[1, 3]"));
  CHECK_THROWS_AS(batch_norm(x, Tensor(), Tensor(), Tensor::zeros({4}, DType::kF64),
                             Tensor::ones({3}, DType::kF64), true), ShapeError);
  // Parameters: x's dtype, or f32 (both alike) for a 16-bit x.
  const Tensor x16 = uniform({2, 3}, 67).to(DType::kBF16);
  const Tensor w32 = Tensor::ones({3}, DType::kF32), b16 = Tensor::zeros({3}).to(DType::kBF16);
  CHECK_THROWS_WITH(batch_norm(x16, w32, b16, Tensor(), Tensor(), true),
                    Catch::Contains("batch_norm: bias is bf16 for a bf16 input and a f32 weight") &&
                        Catch::Contains("weight and bias alike"));
  CHECK_THROWS_WITH(
      batch_norm(x.to(DType::kF32), w32.to(DType::kF64), Tensor(), Tensor(), Tensor(), true),
      Catch::Contains("weight is f64 for a f32 input"));
  CHECK_THROWS_AS(
      batch_norm(x16, Tensor::ones({3}, DType::kF64), Tensor(), Tensor(), Tensor(), true),
      DTypeError);
}

TEST_CASE("CUDA add_layer_norm matches the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 65, 384}, Shape{3, 4097}}) {
      INFO(dtype_name(dt) << " " << shape_str(shape));
      const int64_t c = shape.back();
      Tensor x = uniform(shape, 95, -2.0, 2.0).set_requires_grad();
      Tensor y = uniform(shape, 96, -2.0, 2.0).set_requires_grad();
      Tensor w = uniform({c}, 97, 0.5, 1.5).set_requires_grad();
      Tensor b = uniform({c}, 98).set_requires_grad();
      // In 16 bits the CUDA op normalises the sum rounded to 16 bits (its output), the f32
      // reference the exact sum: the weight gradient adds that rounding (up to half an ulp of
      // sums up to 4) over every row, 130 of them for [2, 65, 384], so its error grows as their
      // square root: seen on an H200, 0.046 on a bf16 gradient of 0.48 and 0.0069 on an f16 one
      // of 0.38, where the dtypes' tolerances allow 0.030 and 0.0039.
      const int64_t rows = shape_numel(shape) / c;
      ska::test::Tolerance sum_rows = tolerance_for(dt);
      if (rows > 64 && dt != DType::kF32) {
        sum_rows = dt == DType::kBF16 ? ska::test::Tolerance{0.08, 0.02}
                                      : ska::test::Tolerance{0.015, 0.005};
      }
      ska::test::check_cuda_parity(
          [](const TensorList& in) {
            return residual_norm_outputs(add_layer_norm(in[0], in[1], in[2], in[3]));
          },
          {x, y, w, b}, dt, &sum_rows);
      // With the branch's dropout (inside the kernels for 384 columns): the same draws on both
      // devices from generators of one seed.
      ska::test::check_cuda_parity(
          [](const TensorList& in) {
            Generator gen(5);
            return residual_norm_outputs(
                add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, std::nullopt, 0.25, &gen));
          },
          {x, y, w, b}, dt, &sum_rows);
      if (dt == DType::kF32) continue;
      // The autocast form: an f32 stream, a 16-bit branch and a 16-bit norm output.
      const ska::test::Tolerance tol = tolerance_for(dt);
      ska::test::check_cuda_parity(
          [dt](const TensorList& in) {
            const ResidualNorm r = add_layer_norm(in[0], in[1].to(dt), in[2], Tensor(), 1e-6, dt);
            CHECK(r.sum.grad_fn()->name() == "add_layer_norm");
            return residual_norm_outputs(r);
          },
          {x, y, w}, DType::kF32, &tol);
      // Autocast's 16-bit stream: x and y 16-bit, f32 parameters.
      ska::test::check_cuda_parity(
          [dt](const TensorList& in) {
            const AutocastGuard autocast(dt);
            const ResidualNorm r =
                add_layer_norm(in[0].to(dt), in[1].to(dt), in[2], in[3], 1e-6, dt);
            CHECK(r.sum.grad_fn()->name() == "add_layer_norm");
            return cat({r.sum.to(DType::kF32).flatten(), r.normed.to(DType::kF32).flatten()}, 0);
          },
          {x, y, w, b}, DType::kF32, &tol);
      // CaiT's sums: an f32 stream, a 16-bit branch times an f32 LayerScale, with its dropout
      // inside, and a 16-bit or an f32 norm output; the scale's gradient sums over the rows.
      Tensor scale = uniform({c}, 99, -0.5, 0.5).set_requires_grad();
      for (const DType out : {dt, DType::kF32}) {
        INFO("LayerScale, output " << dtype_name(out));
        ska::test::check_cuda_parity(
            [dt, out](const TensorList& in) {
              Generator gen(6);
              const ResidualNorm r =
                  add_layer_norm(in[0], in[1].to(dt), in[2], in[3], 1e-6, out, 0.25, &gen, in[4]);
              CHECK(r.sum.grad_fn()->name() == "add_layer_norm");
              return cat({r.sum.flatten(), r.normed.to(DType::kF32).flatten()}, 0);
            },
            {x, y, w, b, scale}, DType::kF32, &sum_rows);
      }
    }
  }
}

TEST_CASE("CUDA norms match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 64}, Shape{5, 1000}, Shape{3, 4097}}) {
      const int64_t c = shape.back();
      Tensor x = uniform(shape, 70, -2.0, 2.0).set_requires_grad();
      Tensor w = uniform({c}, 71, 0.5, 1.5).set_requires_grad();
      Tensor b = uniform({c}, 72).set_requires_grad();
      ska::test::check_cuda_parity(
          [](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b}, dt);
      ska::test::check_cuda_parity(
          [](const TensorList& in) { return layer_norm(in[0], in[1], Tensor(), 1e-6); }, {x, w},
          dt);
    }
    Tensor img = uniform({2, 8, 5, 5}, 73, -2.0, 2.0).set_requires_grad();
    // An f32 input writing a 16-bit output (LayerNorm::autocast_output), and its 16-bit gradient.
    if (dt != DType::kF32) {
      const ska::test::Tolerance tol = tolerance_for(dt);
      for (const Shape& shape : {Shape{4, 7}, Shape{3, 4097}}) {
        const int64_t c = shape.back();
        ska::test::check_cuda_parity(
            [dt](const TensorList& in) {
              return layer_norm(in[0], in[1], in[2], 1e-5, dt).to(DType::kF32);
            },
            {uniform(shape, 76, -2.0, 2.0).set_requires_grad(),
             uniform({c}, 77, 0.5, 1.5).set_requires_grad(), uniform({c}, 78).set_requires_grad()},
            DType::kF32, &tol);
      }
    }
    Tensor w8 = uniform({8}, 74, 0.5, 1.5).set_requires_grad();
    Tensor b8 = uniform({8}, 75).set_requires_grad();
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return layer_norm_channels_first(in[0], in[1], Tensor()); },
        {img, w8}, dt);
    for (bool training : {true, false}) {
      ska::test::check_cuda_parity([training](const TensorList& in) {
        // f32 running statistics on the input's device, the same on both sides.
        Tensor m = Tensor::full({8}, 0.1, DType::kF32, in[0].device());
        Tensor v = Tensor::full({8}, 1.5, DType::kF32, in[0].device());
        return batch_norm(in[0], in[1], in[2], m, v, training);
      }, {img, w8, b8}, dt);
      if (dt == DType::kF32) continue;
      // Autocast's mixed form: a 16-bit input with f32 parameters and statistics.
      const ska::test::Tolerance tol = tolerance_for(dt);
      ska::test::check_cuda_parity(
          [training, dt](const TensorList& in) {
            Tensor m = Tensor::full({8}, 0.1, DType::kF32, in[0].device());
            Tensor v = Tensor::full({8}, 1.5, DType::kF32, in[0].device());
            const Tensor y = batch_norm(in[0].to(dt), in[1], in[2], m, v, training);
            CHECK(y.dtype() == dt);
            return cat({y.to(DType::kF32).flatten(), m, v}, 0);
          },
          {img, w8, b8}, DType::kF32, &tol);
    }
  }
}
