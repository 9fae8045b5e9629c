// scaled_residual (x * x_scale + drop_path(y) * y_scale, per-channel scales) against the ops it
// replaces: values and every gradient bit for bit on the CPU in each dtype mix the models give
// it, drop path's draws, finite differences, the fall-backs, and CUDA against the CPU.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::bitwise_equal;
using ska::test::uniform;

namespace {

struct Mix {
  std::string name;
  DType x, y, scale;
};

// The four leaves of one case, fresh, with gradients on.
struct Leaves {
  Tensor x, xs, y, ys;
};
Leaves leaves(const Mix& m, const Shape& shape, bool x_scale, bool y_scale, Device device) {
  const int64_t c = shape.back();
  const auto leaf = [&](const Shape& s, uint64_t seed, DType dt) {
    return uniform(s, seed, -2, 2).to(dt).to(device).set_requires_grad();
  };
  return {leaf(shape, 11, m.x), x_scale ? leaf({c}, 12, m.scale) : Tensor(), leaf(shape, 13, m.y),
          y_scale ? leaf({c}, 14, m.scale) : Tensor()};
}

// out and the four gradients of sum(out * w).
std::vector<Tensor> run(const Leaves& l, bool fused, uint64_t seed = 15) {
  const Tensor out =
      fused ? scaled_residual(l.x, l.xs, l.y, l.ys)
            : add(l.xs.defined() ? mul(l.x, l.xs) : l.x, l.ys.defined() ? mul(l.y, l.ys) : l.y);
  const Tensor w = uniform(out.shape(), seed, -1, 1).to(out.dtype()).to(out.device());
  sum(mul(out, w)).backward();
  std::vector<Tensor> r = {out.detach()};
  for (const Tensor* t : {&l.x, &l.xs, &l.y, &l.ys})
    r.push_back(t->defined() ? t->grad() : Tensor());
  return r;
}

const std::vector<Mix> kMixes = {
    {"f64", DType::kF64, DType::kF64, DType::kF64},
    {"f32", DType::kF32, DType::kF32, DType::kF32},
    {"f32 stream, bf16 branch (autocast)", DType::kF32, DType::kBF16, DType::kF32},
    {"bf16 stream and branch, f32 scales (autocast)", DType::kBF16, DType::kBF16, DType::kF32},
    {"f32 stream, f16 branch", DType::kF32, DType::kF16, DType::kF32},
    {"bf16 throughout", DType::kBF16, DType::kBF16, DType::kBF16},
};

const char* const kNames[] = {"out", "grad x", "grad x_scale", "grad y", "grad y_scale"};

}  // namespace

TEST_CASE("scaled_residual gives mul, mul and add's values and gradients bit for bit", "[cpu]") {
  for (const Mix& m : kMixes) {
    for (const auto& [x_scale, y_scale] : {std::pair{true, false}, {false, true}, {true, true}}) {
      INFO(m.name << (x_scale ? ", x scaled" : "") << (y_scale ? ", y scaled" : ""));
      const Leaves a = leaves(m, {3, 5, 7}, x_scale, y_scale, Device::cpu());
      const Leaves b = leaves(m, {3, 5, 7}, x_scale, y_scale, Device::cpu());
      const Tensor fused_out = scaled_residual(a.x, a.xs, a.y, a.ys);
      CHECK(ska::test::graph_has(fused_out, "scaled_residual"));
      const std::vector<Tensor> fused = run(a, true), plain = run(b, false);
      for (size_t i = 0; i < fused.size(); ++i) {
        INFO(kNames[i]);
        REQUIRE(fused[i].defined() == plain[i].defined());
        if (!fused[i].defined()) continue;
        CHECK(fused[i].dtype() == plain[i].dtype());
        CHECK(bitwise_equal(fused[i], plain[i]));
      }
    }
  }
  // Under autocast, as the models call it: an f32 stream, a bf16 branch, f32 scales.
  const Mix m = kMixes[2];
  const Leaves a = leaves(m, {2, 4, 8}, true, true, Device::cpu());
  AutocastGuard autocast(DType::kBF16);
  CHECK(scaled_residual(a.x, a.xs, a.y, a.ys).dtype() == DType::kF32);
}

TEST_CASE("scaled_residual with drop path's factors: drop_path's draws, values and gradients",
          "[cpu]") {
  for (const Mix& m : kMixes) {
    for (const bool y_scale : {false, true}) {
      INFO(m.name << (y_scale ? ", y scaled" : ""));
      const Leaves a = leaves(m, {8, 5, 7}, true, y_scale, Device::cpu());
      const Leaves b = leaves(m, {8, 5, 7}, true, y_scale, Device::cpu());
      // The factors drawn as drop_path draws its mask (rate 0.5: some samples dropped).
      manual_seed(31);
      const Tensor keep = drop_path_factors(8, 0.5, true, m.y, Device::cpu());
      const std::vector<double> k = keep.to_vector<double>();
      CHECK(std::count(k.begin(), k.end(), 0.0) > 0);
      CHECK(std::count(k.begin(), k.end(), 2.0) > 0);
      manual_seed(31);
      const Tensor dropped = drop_path(b.y, 0.5, true);
      const Tensor fused = scaled_residual(a.x, a.xs, a.y, a.ys, keep);
      const Tensor plain = add(mul(b.x, b.xs), b.ys.defined() ? mul(dropped, b.ys) : dropped);
      CHECK(bitwise_equal(fused, plain));
      const Tensor w = uniform(fused.shape(), 32, -1, 1).to(fused.dtype());
      sum(mul(fused, w)).backward();
      sum(mul(plain, w)).backward();
      CHECK(bitwise_equal(a.x.grad(), b.x.grad()));
      CHECK(bitwise_equal(a.xs.grad(), b.xs.grad()));
      CHECK(bitwise_equal(a.y.grad(), b.y.grad()));
      if (y_scale) CHECK(bitwise_equal(a.ys.grad(), b.ys.grad()));
    }
  }
  // Without training or at rate 0 nothing is drawn.
  manual_seed(33);
  const Tensor before = rand({4});
  manual_seed(33);
  CHECK_FALSE(drop_path_factors(8, 0.5, false, DType::kF32, Device::cpu()).defined());
  CHECK_FALSE(drop_path_factors(8, 0.0, true, DType::kF32, Device::cpu()).defined());
  CHECK(bitwise_equal(rand({4}), before));
}

TEST_CASE("scaled_residual gradients match finite differences, other operands take the ops",
          "[cpu]") {
  ska::test::check_gradients(
      [](const TensorList& in) { return scaled_residual(in[0], in[1], in[2], in[3]); },
      {uniform({2, 3, 4}, 21).set_requires_grad(), uniform({4}, 22).set_requires_grad(),
       uniform({2, 3, 4}, 23).set_requires_grad(), uniform({4}, 24).set_requires_grad()});
  const Tensor x = uniform({2, 3, 4}, 25).set_requires_grad(), s = uniform({4}, 26);
  // y broadcast over the batch, a strided x, a scale of another length: the ops, the same values.
  const Tensor y_row = uniform({1, 3, 4}, 27);
  CHECK_FALSE(ska::test::graph_has(scaled_residual(x, s, y_row, Tensor()), "scaled_residual"));
  CHECK(bitwise_equal(scaled_residual(x, s, y_row, Tensor()), add(mul(x, s), y_row)));
  const Tensor xt = uniform({2, 4, 3}, 28).set_requires_grad().transpose(1, 2);
  CHECK_FALSE(ska::test::graph_has(scaled_residual(xt, s, x, Tensor()), "scaled_residual"));
  CHECK_THROWS_AS(scaled_residual(x, uniform({5}, 29), x, Tensor()), ShapeError);
  // Without scales it is add.
  CHECK(ska::test::graph_has(scaled_residual(x, Tensor(), x, Tensor()), "add"));
}

TEST_CASE("scaled_residual on CUDA: the CPU's values and input gradients, the scales' sums close",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // Rows past the kernels' 1024 partial sums of 64 rows, a column count off the 32-column tiles.
  for (const Shape& shape : {Shape{3, 5, 7}, Shape{70000, 40}, Shape{4, 196, 320}}) {
    for (size_t mi = 1; mi < kMixes.size(); ++mi) {  // CUDA has no f64 kernels
      const Mix& m = kMixes[mi];
      INFO(m.name << ", " << shape_str(shape));
      const Leaves cpu = leaves(m, shape, true, true, Device::cpu());
      const Leaves gpu = leaves(m, shape, true, true, Device::cuda(0));
      std::vector<Tensor> on_cpu = run(cpu, true), on_gpu = run(gpu, true);
      // With drop path's factors (the same draws on both devices).
      const Leaves cpu_dp = leaves(m, shape, true, true, Device::cpu());
      const Leaves gpu_dp = leaves(m, shape, true, true, Device::cuda(0));
      const Tensor keep = drop_path_factors(shape[0], 0.3, true, m.y, Device::cpu());
      for (const auto& [l, device] :
           {std::pair{&cpu_dp, Device::cpu()}, {&gpu_dp, Device::cuda(0)}}) {
        const Tensor out = scaled_residual(l->x, l->xs, l->y, l->ys, keep.to(device));
        const Tensor w = uniform(out.shape(), 41, -1, 1).to(out.dtype()).to(device);
        sum(mul(out, w)).backward();
        std::vector<Tensor>& into = device.is_cuda() ? on_gpu : on_cpu;
        into.push_back(out.detach());
        for (const Tensor* t : {&l->x, &l->xs, &l->y, &l->ys}) into.push_back(t->grad());
      }
      for (size_t i = 0; i < on_cpu.size(); ++i) {
        INFO(kNames[i % 5] << (i >= 5 ? " (drop path)" : ""));
        const Tensor g = on_gpu[i].to(Device::cpu());
        if (i % 5 == 2 || i % 5 == 4) {  // sums over the rows, in another order
          ska::test::require_close(g, on_cpu[i], ska::test::tolerance_for(on_cpu[i].dtype()),
                                   kNames[i % 5]);
        } else {
          CHECK(bitwise_equal(g, on_cpu[i]));
        }
      }
    }
  }
}

TEST_CASE(
    "scaled_residual on CUDA: each scale alone, drop path without scales, x without a gradient",
    "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // The forms the models run: MetaFormer's res_scale (x's scale only, layer_scale off), CaiT's
  // LayerScale (y's only), CvT's drop path (factors and no scale), and a stream that needs no
  // gradient (the first block's input). Values and input gradients to the CPU's bits, the
  // scales' sums close.
  struct Form {
    const char* name;
    bool x_scale, y_scale, drop_path, x_grad;
  };
  const Form forms[] = {{"x scale", true, false, false, true},
                        {"y scale", false, true, false, true},
                        {"drop path, no scale", false, false, true, true},
                        {"y scale and drop path, x without a gradient", false, true, true, false}};
  for (const Shape& shape : {Shape{3, 5, 7}, Shape{4, 196, 320}}) {
    for (size_t mi = 1; mi < kMixes.size(); ++mi) {
      const Mix& m = kMixes[mi];
      for (const Form& f : forms) {
        INFO(m.name << ", " << shape_str(shape) << ", " << f.name);
        const Tensor keep =
            f.drop_path ? drop_path_factors(shape[0], 0.5, true, m.y, Device::cpu()) : Tensor();
        std::vector<std::vector<Tensor>> results;
        for (const Device device : {Device::cpu(), Device::cuda(0)}) {
          Leaves l = leaves(m, shape, f.x_scale, f.y_scale, device);
          if (!f.x_grad) l.x = l.x.detach();
          const Tensor out =
              scaled_residual(l.x, l.xs, l.y, l.ys, keep.defined() ? keep.to(device) : Tensor());
          const Tensor w = uniform(out.shape(), 43, -1, 1).to(out.dtype()).to(device);
          sum(mul(out, w)).backward();
          std::vector<Tensor> r = {out.detach()};
          for (const Tensor* t : {&l.x, &l.xs, &l.y, &l.ys}) {
            r.push_back(t->defined() && t->requires_grad() ? t->grad() : Tensor());
          }
          results.push_back(std::move(r));
        }
        for (size_t i = 0; i < results[0].size(); ++i) {
          INFO(kNames[i]);
          const Tensor& c = results[0][i];
          REQUIRE(c.defined() == results[1][i].defined());
          if (!c.defined()) continue;
          const Tensor g = results[1][i].to(Device::cpu());
          if (i == 2 || i == 4) {  // sums over the rows, in another order
            ska::test::require_close(g, c, ska::test::tolerance_for(c.dtype()), kNames[i]);
          } else {
            CHECK(bitwise_equal(g, c));
          }
        }
      }
    }
  }
}

namespace {

// scaled_residual with a dropout of y inside (y_drop), or the dropout op first, on `device`,
// from generators of one seed: out, the four leaves' gradients of sum(out * w) and the
// generator's next draw. keep: drop path's factors or undefined.
struct DropRun {
  std::vector<Tensor> results;
  float next_draw;
};
DropRun run_dropped(const Mix& m, const Shape& shape, bool x_scale, bool y_scale,
                    const Tensor& keep, bool inside, Device device) {
  const Leaves l = leaves(m, shape, x_scale, y_scale, device);
  Generator gen(29);
  const Tensor yk = keep.defined() ? keep.to(device) : Tensor();
  const Tensor out = inside ? scaled_residual(l.x, l.xs, l.y, l.ys, yk, 0.3, &gen)
                            : scaled_residual(l.x, l.xs, dropout(l.y, 0.3, true, &gen), l.ys, yk);
  const Tensor w = uniform(out.shape(), 44, -1, 1).to(out.dtype()).to(device);
  sum(mul(out, w)).backward();
  DropRun r{{out.detach()}, static_cast<float>(rand({1}, DType::kF32, Device::cpu(), &gen).item())};
  for (const Tensor* t : {&l.x, &l.xs, &l.y, &l.ys})
    r.results.push_back(t->defined() ? t->grad() : Tensor());
  return r;
}

}  // namespace

TEST_CASE("scaled_residual with a dropout of y: dropout's draws, values and gradients", "[cpu]") {
  const Tensor keep = drop_path_factors(8, 0.5, true, DType::kF32, Device::cpu());
  for (const Mix& m : kMixes) {
    for (const auto& [x_scale, y_scale] : {std::pair{false, true}, {true, false}, {true, true}}) {
      for (const bool drop_path : {false, true}) {
        INFO(m.name << (x_scale ? ", x scaled" : "") << (y_scale ? ", y scaled" : "")
                    << (drop_path ? ", drop path" : ""));
        const Tensor yk = drop_path ? keep.to(m.y) : Tensor();
        const DropRun in = run_dropped(m, {8, 5, 7}, x_scale, y_scale, yk, true, Device::cpu());
        const DropRun op = run_dropped(m, {8, 5, 7}, x_scale, y_scale, yk, false, Device::cpu());
        CHECK(in.next_draw == op.next_draw);
        for (size_t i = 0; i < in.results.size(); ++i) {
          INFO(kNames[i]);
          REQUIRE(in.results[i].defined() == op.results[i].defined());
          if (in.results[i].defined()) CHECK(bitwise_equal(in.results[i], op.results[i]));
        }
        // About 30% of y's gradient is zero.
        const std::vector<double> gy = in.results[3].to(DType::kF64).to_vector<double>();
        const double zeros = static_cast<double>(std::count(gy.begin(), gy.end(), 0.0));
        const double share = zeros / static_cast<double>(gy.size());
        CHECK(share > (drop_path ? 0.3 : 0.15));
        CHECK(share < (drop_path ? 0.85 : 0.45));
      }
    }
  }
  // Without scales it is dropout_add; without a gradient for y, or for operands the kernel does
  // not take (a broadcast y), the dropout op first: the same values.
  const Leaves l = leaves(kMixes[1], {4, 3, 8}, false, true, Device::cpu());
  Generator a(5), b(5);
  CHECK(ska::test::graph_has(scaled_residual(l.x, Tensor(), l.y, Tensor(), Tensor(), 0.3, &a),
                             "dropout_add"));
  const Tensor y1 = uniform({4, 1, 8}, 8, -1, 1).to(DType::kF32);
  Generator c(6), d(6);
  CHECK(bitwise_equal(scaled_residual(l.x, Tensor(), y1, l.ys, Tensor(), 0.3, &c),
                      add(l.x, mul(dropout(y1, 0.3, true, &d), l.ys))));
  CHECK_THROWS_WITH(scaled_residual(l.x, Tensor(), l.y, l.ys, Tensor(), 1.0),
                    Catch::Contains("[0, 1)"));
}

TEST_CASE("scaled_residual with a dropout of y on CUDA: the CPU's mask, values and gradients",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // CaiT's LayerScale form (y scaled), with drop path's factors, both scales; a column count off
  // every tile and byte, and CaiT-S's width.
  const Tensor keep5 = drop_path_factors(5, 0.5, true, DType::kF32, Device::cpu());
  const Tensor keep4 = drop_path_factors(4, 0.5, true, DType::kF32, Device::cpu());
  for (const Shape& shape : {Shape{5, 7, 13}, Shape{4, 65, 384}}) {
    for (size_t mi = 1; mi < kMixes.size(); ++mi) {
      const Mix& m = kMixes[mi];
      for (const auto& [x_scale, drop_path] :
           {std::pair{false, false}, {false, true}, {true, true}}) {
        INFO(m.name << ", " << shape_str(shape) << (x_scale ? ", x scaled" : "")
                    << (drop_path ? ", drop path" : ""));
        const Tensor yk = drop_path ? (shape[0] == 5 ? keep5 : keep4).to(m.y) : Tensor();
        const DropRun c = run_dropped(m, shape, x_scale, true, yk, true, Device::cpu());
        const DropRun g = run_dropped(m, shape, x_scale, true, yk, true, Device::cuda(0));
        const DropRun op = run_dropped(m, shape, x_scale, true, yk, false, Device::cuda(0));
        CHECK(g.next_draw == c.next_draw);
        for (size_t i = 0; i < c.results.size(); ++i) {
          INFO(kNames[i]);
          REQUIRE(c.results[i].defined() == g.results[i].defined());
          if (!c.results[i].defined()) continue;
          const Tensor gi = g.results[i].to(Device::cpu());
          if (i == 2 || i == 4) {  // sums over the rows, in another order
            ska::test::require_close(gi, c.results[i],
                                     ska::test::tolerance_for(c.results[i].dtype()), kNames[i]);
          } else {
            CHECK(bitwise_equal(gi, c.results[i]));
            CHECK(bitwise_equal(gi, op.results[i].to(Device::cpu())));
          }
        }
      }
    }
  }
}
