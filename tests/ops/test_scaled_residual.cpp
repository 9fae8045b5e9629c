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
