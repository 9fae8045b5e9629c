// Philox4x32-10 against its published known-answer vectors, generator state, and distributions.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "backend/backend.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::bitwise_equal;

TEST_CASE("philox4x32-10 matches the Random123 known-answer test", "[cpu]") {
  // Random123 kat_vectors: philox4x32 10 rounds, counter 0, key 0.
  const PhiloxOut r = philox4x32_10(0, 0);
  CHECK(r.w[0] == 0x6627e8d5u);
  CHECK(r.w[1] == 0xe169c58du);
  CHECK(r.w[2] == 0xbc57ac4cu);
  CHECK(r.w[3] == 0x9b00dbd8u);
}

TEST_CASE("a generator's state reproduces its draws", "[cpu]") {
  Generator g(42);
  const Tensor a = rand({10}, DType::kF32, Device::cpu(), &g);
  CHECK(g.offset() == 3);  // ceil(10 / 4) counters consumed
  const uint64_t seed = g.seed(), offset = g.offset();
  const Tensor b = randn({7}, DType::kF64, Device::cpu(), &g);
  g.set_state(seed, offset);
  const Tensor c = randn({7}, DType::kF64, Device::cpu(), &g);
  CHECK(b.to_vector<double>() == c.to_vector<double>());
  Generator h(42);
  CHECK(rand({10}, DType::kF32, Device::cpu(), &h).to_vector<float>() == a.to_vector<float>());
}

TEST_CASE("ForbidDraws: a draw from a forbidden generator fails, naming why, and takes nothing",
          "[cpu]") {
  Generator g(7);
  const uint64_t offset = g.advance(5);
  {
    const ForbidDraws guard(g, "capturing the test step");
    REQUIRE_THROWS_AS(rand({3}, DType::kF32, Device::cpu(), &g), ValueError);
    REQUIRE_THROWS_WITH(randn({2}, DType::kF64, Device::cpu(), &g),
                        Catch::Contains("drawn on the host while capturing the test step"));
    CHECK(g.offset() == offset + 2);  // the failed draws consumed no counters
    Generator other(7);               // only the forbidden generator refuses
    CHECK(rand({3}, DType::kF32, Device::cpu(), &other).numel() == 3);
  }
  Generator h(7);
  h.advance(5);
  CHECK(rand({6}, DType::kF32, Device::cpu(), &g).to_vector<float>() ==
        rand({6}, DType::kF32, Device::cpu(), &h).to_vector<float>());
}

TEST_CASE("replays of a captured step draw the dropout masks of the eager steps", "[cpu]") {
  // Eager: three steps, each with a dropout mask of 10, a drop-path mask of 3 samples and
  // uniform and normal draws of 5 and 6 (rand, randn: CaiT's layer dropout on the device).
  const Tensor x = Tensor::ones({10}), paths = Tensor::ones({3, 2});
  Generator eager(7);
  std::vector<std::vector<float>> masks, uniforms, normals;
  for (int step = 0; step < 3; ++step) {
    masks.push_back(dropout(x, 0.5, true, &eager).to_vector<float>());
    masks.push_back(drop_path(paths, 0.5, true, &eager).to_vector<float>());
    uniforms.push_back(rand({5}, DType::kF32, Device::cpu(), &eager).to_vector<float>());
    normals.push_back(randn({6}, DType::kF32, Device::cpu(), &eager).to_vector<float>());
  }
  // Captured: the same draws once, with offsets relative to the capture base.
  Generator g(7);
  (void)rand({5}, DType::kF32, Device::cpu(), &g);  // state before the capture is kept
  const uint64_t before = g.offset();
  g.begin_capture(Device::cpu());
  REQUIRE(g.capture_base().defined());
  // What dropout, drop_path, rand and randn take.
  const uint64_t first = g.advance(10), second = g.advance(3), third = g.advance(5),
                 fourth = g.advance(6);
  const CapturedDraws draws = g.end_capture();
  CHECK_FALSE(g.capture_base().defined());
  CHECK(first == 0);
  CHECK(draws.counters == 3 + 1 + 2 + 2);
  CHECK(g.offset() == before);
  // Replays: the kernels as the captured launches call them, the base written before each.
  Generator r(7);
  for (int step = 0; step < 3; ++step) {
    r.before_replay(draws);
    Tensor a = Tensor::empty({10}), b = Tensor::empty({3, 1});
    cpu::random_bernoulli(a, r.seed(), first, 0.5, 2.0, draws.base);
    cpu::random_bernoulli(b, r.seed(), second, 0.5, 2.0, draws.base);
    CHECK(a.to_vector<float>() == masks[2 * step]);
    const std::vector<float> kept = b.to_vector<float>(), dropped = masks[2 * step + 1];
    for (int i = 0; i < 3; ++i) CHECK(dropped[2 * i] == kept[i]);  // x = 1: the mask itself
    Tensor u = Tensor::empty({5}), n = Tensor::empty({6});
    cpu::random_uniform(u, r.seed(), third, 0.0, 1.0, draws.base);
    cpu::random_normal(n, r.seed(), fourth, 0.0, 1.0, draws.base);
    CHECK(u.to_vector<float>() == uniforms[step]);
    CHECK(n.to_vector<float>() == normals[step]);
  }
  CHECK(r.offset() == eager.offset());
  CHECK_THROWS_WITH(r.end_capture(), Catch::Contains("without begin_capture"));
}

TEST_CASE("uniform and normal draws have the right moments", "[cpu]") {
  Generator g(7);
  const std::vector<double> u = rand({200000}, DType::kF64, Device::cpu(), &g).to_vector<double>();
  double mean = 0, var = 0, lo = 1, hi = 0;
  for (double v : u) {
    mean += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  mean /= u.size();
  for (double v : u) var += (v - mean) * (v - mean);
  var /= u.size();
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(mean == Approx(0.5).margin(0.005));
  CHECK(var == Approx(1.0 / 12).margin(0.002));
  const std::vector<double> n = randn({200000}, DType::kF64, Device::cpu(), &g).to_vector<double>();
  double m1 = 0, m2 = 0;
  for (double v : n) {
    m1 += v;
    m2 += v * v;
  }
  CHECK(m1 / n.size() == Approx(0.0).margin(0.01));
  CHECK(m2 / n.size() == Approx(1.0).margin(0.015));
}

TEST_CASE("dropout keeps 1-p of the elements, scaled, drop_path drops whole samples", "[cpu]") {
  Generator g(3);
  const Tensor x = Tensor::ones({100, 1000}, DType::kF64);
  const std::vector<double> y = dropout(x, 0.3, true, &g).to_vector<double>();
  size_t kept = 0;
  for (double v : y) {
    if (v != 0.0) {
      ++kept;
      REQUIRE(v == Approx(1.0 / 0.7));
    }
  }
  CHECK(static_cast<double>(kept) / y.size() == Approx(0.7).margin(0.01));
  CHECK(dropout(x, 0.3, false, &g).same_storage(x));

  const Tensor p = drop_path(Tensor::ones({1000, 3, 4}, DType::kF64), 0.25, true, &g);
  const std::vector<double> pv = p.to_vector<double>();
  size_t alive = 0;
  for (size_t s = 0; s < 1000; ++s) {
    for (size_t j = 1; j < 12; ++j) REQUIRE(pv[s * 12 + j] == pv[s * 12]);
    alive += pv[s * 12] != 0.0;
  }
  CHECK(alive / 1000.0 == Approx(0.75).margin(0.05));
  CHECK_THROWS_AS(dropout(x, 1.0, true, &g), ValueError);
}

TEST_CASE("dropout gradient uses the same mask", "[cpu]") {
  Generator g(9);
  Tensor x = ska::test::uniform({4, 5}, 2).set_requires_grad();
  Tensor y = dropout(x, 0.5, true, &g);
  sum(y).backward();
  const std::vector<double> yv = y.to_vector<double>(), xv = x.to_vector<double>();
  const std::vector<double> gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gv[i] == (yv[i] == 0.0 ? 0.0 : 2.0));
}

TEST_CASE("dropout draws its mask in the kernel: bit for bit x times the Bernoulli mask",
          "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dt));
    Tensor x = ska::test::uniform({37, 41}, 4, -3.0, 3.0).to(dt);
    x.narrow(0, 0, 1).narrow(1, 0, 1).fill_(INFINITY);  // x * 0 stays NaN, as a mul gives
    Generator a(11), b(11);
    const Tensor xi = x.detach().set_requires_grad();
    const Tensor y = dropout(xi, 0.3, true, &a);
    Tensor mask = Tensor::empty(x.shape(), dt);
    cpu::random_bernoulli(mask, b.seed(), b.advance(static_cast<uint64_t>(x.numel())), 0.7,
                          1.0 / 0.7, Tensor());
    const Tensor want = mul(x, mask);
    CHECK(bitwise_equal(y, want));
    CHECK(a.offset() == b.offset());
    const Tensor w = ska::test::uniform({37, 41}, 5).to(dt);
    sum(mul(y, w)).backward();
    CHECK(bitwise_equal(xi.grad(), mul(w, mask)));
  }
  // Inside a capture the offset comes from the base, as random_bernoulli's does.
  const Tensor x = ska::test::uniform({9}, 6, 1.0, 2.0, DType::kF32);
  const Tensor base = Tensor::full({1}, 5.0, DType::kI64);
  Tensor y = Tensor::empty({9}), y_bits = Tensor::empty({9}), mask = Tensor::empty({9});
  cpu::dropout_apply(x, 3, 2, 0.5, 2.0, base, y);
  cpu::dropout_forward(x, 3, 2, 0.5, 2.0, base, y_bits, Tensor::empty({2}, DType::kU8));
  cpu::random_bernoulli(mask, 3, 2, 0.5, 2.0, base);
  CHECK(bitwise_equal(y, mul(x, mask)));
  CHECK(bitwise_equal(y_bits, y));
}

TEST_CASE("dropout in training keeps its mask as bits, the draws' own", "[cpu]") {
  // 1,517 elements: a last byte of 5 bits.
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dt));
    const Tensor x = ska::test::uniform({37, 41}, 4, -3.0, 3.0).to(dt);
    const int64_t n = x.numel();
    Tensor mask = Tensor::empty(x.shape(), dt);
    cpu::random_bernoulli(mask, 11, 6, 0.7, 1.0 / 0.7, Tensor());
    Tensor y = Tensor::empty(x.shape(), dt), bits = Tensor::empty({(n + 7) / 8}, DType::kU8);
    bits.fill_(170.0);  // every byte written: none keeps this pattern by chance below
    cpu::dropout_forward(x, 11, 6, 0.7, 1.0 / 0.7, Tensor(), y, bits);
    Tensor y_apply = Tensor::empty(x.shape(), dt);
    cpu::dropout_apply(x, 11, 6, 0.7, 1.0 / 0.7, Tensor(), y_apply);
    CHECK(bitwise_equal(y, y_apply));
    const std::vector<double> m = mask.to_vector<double>();
    const std::vector<uint8_t> b = bits.to_vector<uint8_t>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += ((b[i / 8] >> (i % 8)) & 1) != (m[i] != 0.0);
    CHECK(wrong == 0);
    CHECK((b.back() >> 5) == 0);  // past the end: no bits
    // The backward from the bits is dropout_apply on the gradient with the same draws.
    const Tensor g = ska::test::uniform({37, 41}, 5).to(dt);
    Tensor gx = Tensor::empty(x.shape(), dt), gx_apply = Tensor::empty(x.shape(), dt);
    cpu::dropout_backward(g, bits, 1.0 / 0.7, gx);
    cpu::dropout_apply(g, 11, 6, 0.7, 1.0 / 0.7, Tensor(), gx_apply);
    CHECK(bitwise_equal(gx, gx_apply));
  }
  // Without a graph to record (no_grad, or no input needing a gradient) the op keeps no bits and
  // draws the same values.
  Generator a(13), b(13);
  const Tensor x = ska::test::uniform({100}, 7);
  const Tensor with_grad = dropout(x.detach().set_requires_grad(), 0.25, true, &a);
  Tensor without;
  {
    const NoGradGuard no_grad;
    without = dropout(x.detach().set_requires_grad(), 0.25, true, &b);
  }
  CHECK_FALSE(without.requires_grad());
  CHECK(bitwise_equal(with_grad, without));
  CHECK_THROWS_WITH(cpu::dropout_backward(x, Tensor::empty({12}, DType::kU8), 2.0, x.clone()),
                    Catch::Contains("13 contiguous u8 bytes"));
}

TEST_CASE("dropout on CUDA draws the CPU's mask, bit for bit, forward and backward", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    const Tensor x = ska::test::uniform({513, 65}, 7, -3.0, 3.0).to(dt);
    const Tensor w = ska::test::uniform({513, 65}, 8).to(dt);
    Generator cg(21), gg(21);
    const Tensor xc = x.detach().set_requires_grad();
    const Tensor xg = x.to(Device::cuda(0)).detach().set_requires_grad();
    const Tensor yc = dropout(xc, 0.1, true, &cg), yg = dropout(xg, 0.1, true, &gg);
    CHECK(bitwise_equal(yg, yc));
    sum(mul(yc, w)).backward();
    sum(mul(yg, w.to(Device::cuda(0)))).backward();
    CHECK(bitwise_equal(xg.grad(), xc.grad()));
#ifdef SKA_WITH_CUDA
    // The kernels themselves: the kept bits, and the scalar path of views that are not 16-byte
    // aligned (one element in), against the CPU twin.
    for (const int64_t skip : {0, 1}) {
      INFO("skip " << skip);
      const int64_t n = x.numel() - skip;
      const Tensor xs = x.reshape({-1}).narrow(0, skip, n), gs = w.reshape({-1}).narrow(0, skip, n);
      const Tensor xsg = x.to(Device::cuda(0)).reshape({-1}).narrow(0, skip, n);
      const Tensor gsg = w.to(Device::cuda(0)).reshape({-1}).narrow(0, skip, n);
      Tensor yc_k = Tensor::empty({n}, dt), bc = Tensor::empty({(n + 7) / 8}, DType::kU8);
      Tensor yg_k = Tensor::empty({n}, dt, Device::cuda(0));
      Tensor bg = Tensor::empty({(n + 7) / 8}, DType::kU8, Device::cuda(0));
      const Tensor base = Tensor::full({1}, 3.0, DType::kI64);
      cpu::dropout_forward(xs, 5, 9, 0.8, 1.25, base, yc_k, bc);
      cuda::dropout_forward(xsg, 5, 9, 0.8, 1.25, base.to(Device::cuda(0)), yg_k, bg);
      CHECK(bitwise_equal(yg_k, yc_k));
      CHECK(bg.to_vector<uint8_t>() == bc.to_vector<uint8_t>());
      Tensor gc_k = Tensor::empty({n}, dt), gg_k = Tensor::empty({n}, dt, Device::cuda(0));
      cpu::dropout_backward(gs, bc, 1.25, gc_k);
      cuda::dropout_backward(gsg, bg, 1.25, gg_k);
      CHECK(bitwise_equal(gg_k, gc_k));
    }
#endif
  }
}

namespace {

// gelu_dropout and the two ops it fuses, from generators of one seed, on `device`: the outputs
// and the input gradients of a fixed weighting of them.
struct GeluDropoutRun {
  Tensor y, grad;
  std::string node;
  float next_draw;  // the generator's next draw: both advanced alike
};
GeluDropoutRun run_gelu_dropout(bool fused, const Tensor& x, bool tanh, Device device) {
  Generator gen(31);
  const Tensor xd = x.to(device).detach().set_requires_grad();
  const Tensor y =
      fused ? gelu_dropout(xd, 0.2, true, tanh, &gen) : dropout(gelu(xd, tanh), 0.2, true, &gen);
  const Tensor w = ska::test::uniform(x.shape(), 9).to(device, x.dtype());
  sum(mul(y, w)).backward();
  const float next = static_cast<float>(rand({1}, DType::kF32, Device::cpu(), &gen).item());
  return {y, xd.grad(), y.grad_fn()->name(), next};
}

}  // namespace

TEST_CASE("gelu_dropout: the values, draws and gradient of gelu then dropout, bit for bit",
          "[cpu]") {
  // 1,517 elements: a last byte of 5 bits.
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const bool tanh : {false, true}) {
      INFO(dtype_name(dt) << (tanh ? ", tanh approximation" : ""));
      const Tensor x = ska::test::uniform({37, 41}, 4, -3.0, 3.0).to(dt);
      const GeluDropoutRun f = run_gelu_dropout(true, x, tanh, Device::cpu());
      const GeluDropoutRun u = run_gelu_dropout(false, x, tanh, Device::cpu());
      CHECK(f.node == "gelu_dropout");
      CHECK(u.node == "dropout");
      CHECK(bitwise_equal(f.y, u.y));
      CHECK(bitwise_equal(f.grad, u.grad));
      CHECK(f.next_draw == u.next_draw);
    }
  }
  // Eval mode, p = 0 and no gradient to record: the two ops (GELU alone without dropout).
  const Tensor x = ska::test::uniform({10}, 5, -3.0, 3.0);
  CHECK(bitwise_equal(gelu_dropout(x, 0.3, false), gelu(x)));
  CHECK(bitwise_equal(gelu_dropout(x.detach().set_requires_grad(), 0.0, true), gelu(x)));
  Generator a(3), b(3);
  CHECK(bitwise_equal(gelu_dropout(x, 0.3, true, false, &a), dropout(gelu(x), 0.3, true, &b)));
  CHECK_THROWS_WITH(gelu_dropout(x.detach().set_requires_grad(), 1.0, true),
                    Catch::Contains("[0, 1)"));
}

TEST_CASE("gelu_dropout on CUDA: the bits of the GELU and dropout kernels, the CPU's mask",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const bool tanh : {false, true}) {
      INFO(dtype_name(dt) << (tanh ? ", tanh approximation" : ""));
      const Tensor x = ska::test::uniform({513, 65}, 7, -3.0, 3.0).to(dt);
      const GeluDropoutRun f = run_gelu_dropout(true, x, tanh, Device::cuda(0));
      const GeluDropoutRun u = run_gelu_dropout(false, x, tanh, Device::cuda(0));
      CHECK(f.node == "gelu_dropout");
      CHECK(bitwise_equal(f.y, u.y));
      CHECK(bitwise_equal(f.grad, u.grad));
      CHECK(f.next_draw == u.next_draw);
      // Against the CPU: the same mask; GELU's erf / tanh may differ in the last bit.
      const GeluDropoutRun c = run_gelu_dropout(true, x, tanh, Device::cpu());
      const ska::test::Tolerance tol = ska::test::tolerance_for(dt);
      ska::test::require_close(f.y, c.y.to(DType::kF64), tol, "gelu_dropout forward");
      ska::test::require_close(f.grad, c.grad.to(DType::kF64), tol, "gelu_dropout backward");
      CHECK(bitwise_equal(ne(f.y.to(Device::cpu()), Tensor::zeros({}, dt)),
                          ne(c.y, Tensor::zeros({}, dt))));
    }
#ifdef SKA_WITH_CUDA
    // The kernels: the kept bits against the CPU twin, with and without 16-byte alignment.
    const Tensor x = ska::test::uniform({513, 65}, 7, -3.0, 3.0).to(dt);
    const Tensor w = ska::test::uniform({513, 65}, 8).to(dt);
    for (const int64_t skip : {0, 1}) {
      INFO("skip " << skip);
      const int64_t n = x.numel() - skip;
      const Tensor xs = x.reshape({-1}).narrow(0, skip, n), gs = w.reshape({-1}).narrow(0, skip, n);
      const Tensor xsg = x.to(Device::cuda(0)).reshape({-1}).narrow(0, skip, n);
      const Tensor gsg = w.to(Device::cuda(0)).reshape({-1}).narrow(0, skip, n);
      Tensor yc = Tensor::empty({n}, dt), bc = Tensor::empty({(n + 7) / 8}, DType::kU8);
      Tensor yg = Tensor::empty({n}, dt, Device::cuda(0));
      Tensor bg = Tensor::empty({(n + 7) / 8}, DType::kU8, Device::cuda(0));
      cpu::unary_dropout_forward(UnaryOp::kGelu, xs, 0, 0, 5, 9, 0.8, 1.25, Tensor(), yc, bc);
      cuda::unary_dropout_forward(UnaryOp::kGelu, xsg, 0, 0, 5, 9, 0.8, 1.25, Tensor(), yg, bg);
      CHECK(bg.to_vector<uint8_t>() == bc.to_vector<uint8_t>());
      ska::test::require_close(yg, yc.to(DType::kF64), ska::test::tolerance_for(dt), "forward");
      Tensor gc = Tensor::empty({n}, dt), gg = Tensor::empty({n}, dt, Device::cuda(0));
      cpu::unary_dropout_backward(UnaryOp::kGelu, gs, bc, 1.25, xs, 0, 0, gc);
      cuda::unary_dropout_backward(UnaryOp::kGelu, gsg, bg, 1.25, xsg, 0, 0, gg);
      ska::test::require_close(gg, gc.to(DType::kF64), ska::test::tolerance_for(dt), "backward");
    }
    CHECK_THROWS_WITH(
        cuda::unary_dropout_forward(
            UnaryOp::kExp, x.to(Device::cuda(0)), 0, 0, 5, 9, 0.8, 1.25, Tensor(),
            x.to(Device::cuda(0)).clone(),
            Tensor::empty({(x.numel() + 7) / 8}, DType::kU8, Device::cpu()).to(Device::cuda(0))),
        Catch::Contains("not an activation"));
#endif
  }
}

namespace {

// dropout_add and the two ops it fuses (add(x, dropout(y))), from generators of one seed, on
// `device`: the sum and the gradients of x and y under a fixed weighting of it.
struct DropoutAddRun {
  Tensor out, grad_x, grad_y;
  std::string node;
  float next_draw;  // the generator's next draw: both advanced alike
};
// The dtypes of x and y the fused kernels take: one dtype, or an f32 x (the residual stream) with a
// bf16 / f16 y (autocast's branch).
const std::vector<std::pair<DType, DType>> kDropoutAddPairs = {{DType::kF32, DType::kF32},
                                                               {DType::kF32, DType::kBF16},
                                                               {DType::kF32, DType::kF16},
                                                               {DType::kBF16, DType::kBF16},
                                                               {DType::kF16, DType::kF16}};

DropoutAddRun run_dropout_add(bool fused, const Tensor& x, const Tensor& y, Device device) {
  Generator gen(17);
  const Tensor xd = x.to(device).detach().set_requires_grad();
  const Tensor yd = y.to(device).detach().set_requires_grad();
  const Tensor out =
      fused ? dropout_add(xd, yd, 0.25, true, &gen) : add(xd, dropout(yd, 0.25, true, &gen));
  const Tensor w = ska::test::uniform(out.shape(), 12).to(device, out.dtype());
  sum(mul(out, w)).backward();
  const float next = static_cast<float>(rand({1}, DType::kF32, Device::cpu(), &gen).item());
  return {out, xd.grad(), yd.grad(), out.grad_fn()->name(), next};
}

}  // namespace

TEST_CASE("dropout_add: the values, draws and gradients of dropout then add, bit for bit",
          "[cpu]") {
  // 1,517 elements: a last byte of 5 bits. x f32 with a bf16 / f16 y: autocast's branch into an
  // f32 residual stream.
  for (const auto& [xt, yt] : kDropoutAddPairs) {
    INFO("x " << dtype_name(xt) << ", y " << dtype_name(yt));
    const Tensor x = ska::test::uniform({37, 41}, 4, -3.0, 3.0).to(xt);
    const Tensor y = ska::test::uniform({37, 41}, 5, -3.0, 3.0).to(yt);
    const DropoutAddRun f = run_dropout_add(true, x, y, Device::cpu());
    const DropoutAddRun u = run_dropout_add(false, x, y, Device::cpu());
    CHECK(f.node == "dropout_add");
    CHECK(u.node == "add");
    CHECK(f.out.dtype() == xt);
    CHECK(f.grad_y.dtype() == yt);
    CHECK(bitwise_equal(f.out, u.out));
    CHECK(bitwise_equal(f.grad_x, u.grad_x));
    CHECK(bitwise_equal(f.grad_y, u.grad_y));
    CHECK(f.next_draw == u.next_draw);
    // About a quarter of the branch dropped, with a gradient of exactly zero there.
    const double dropped =
        sum(eq(f.grad_y.to(DType::kF32), Tensor::zeros({}, DType::kF32)).to(DType::kF32)).item() /
        1517.0;
    CHECK(dropped > 0.2);
    CHECK(dropped < 0.3);
  }
  // What takes the two ops: f64, a broadcast x, a 16-bit x with an f32 y, no gradient for y,
  // eval mode and p = 0; the same results.
  const Tensor y = ska::test::uniform({6, 5, 8}, 6).to(DType::kF32).set_requires_grad();
  const std::vector<Tensor> xs = {ska::test::uniform({6, 5, 8}, 7),
                                  ska::test::uniform({6, 1, 8}, 8).to(DType::kF32),
                                  ska::test::uniform({6, 5, 8}, 9).to(DType::kBF16)};
  for (const Tensor& x : xs) {
    INFO(x.str());
    const Tensor yy = x.dtype() == DType::kF64 ? y.to(DType::kF64).detach().set_requires_grad() : y;
    Generator a(3), b(3);
    const Tensor f = dropout_add(x, yy, 0.3, true, &a);
    CHECK(f.grad_fn()->name() != "dropout_add");
    CHECK(bitwise_equal(f, add(x, dropout(yy, 0.3, true, &b))));
  }
  const Tensor x = ska::test::uniform({6, 5, 8}, 7).to(DType::kF32);
  Generator a(3), b(3);
  CHECK(bitwise_equal(dropout_add(x, y.detach(), 0.3, true, &a),
                      add(x, dropout(y.detach(), 0.3, true, &b))));
  CHECK(bitwise_equal(dropout_add(x, y, 0.3, false), add(x, y)));
  CHECK(bitwise_equal(dropout_add(x, y, 0.0, true), add(x, y)));
  CHECK_THROWS_WITH(dropout_add(x, y, 1.0, true), Catch::Contains("[0, 1)"));
}

TEST_CASE("dropout_add's kernels refuse operands they do not take, naming them", "[cpu]") {
  const Tensor x = Tensor::zeros({4, 8}), y = Tensor::zeros({4, 8}, DType::kBF16);
  const Tensor bits = Tensor::empty({4}, DType::kU8);
  Tensor out = Tensor::empty({4, 8});
  // A 16-bit x with an f32 y, an f64 pair, mismatched shapes, too few bits.
  CHECK_THROWS_AS(cpu::dropout_add_forward(y, x, 1, 0, 0.5, 2.0, Tensor(), y.clone(), bits),
                  DTypeError);
  CHECK_THROWS_WITH(cpu::dropout_add_forward(x.to(DType::kF64), x.to(DType::kF64), 1, 0, 0.5, 2.0,
                                             Tensor(), out.to(DType::kF64), bits),
                    Catch::Contains("dropout_add_forward") && Catch::Contains("f64"));
  CHECK_THROWS_AS(
      cpu::dropout_add_forward(x, y.reshape({8, 4}), 1, 0, 0.5, 2.0, Tensor(), out, bits),
      ShapeError);
  CHECK_THROWS_WITH(
      cpu::dropout_add_forward(x, y, 1, 0, 0.5, 2.0, Tensor(), out, Tensor::empty({3}, DType::kU8)),
      Catch::Contains("bits must be 4"));
  Tensor gy = Tensor::empty({4, 8}, DType::kBF16);
  CHECK_THROWS_AS(cpu::dropout_add_backward(gy, bits, 2.0, out), DTypeError);
  CHECK_THROWS_AS(cpu::dropout_add_backward(out, bits, 2.0, Tensor::empty({5}, DType::kBF16)),
                  ShapeError);
}

TEST_CASE("dropout_add on CUDA: the bits of the dropout and add kernels, the CPU's mask",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (const auto& [xt, yt] : kDropoutAddPairs) {
    INFO("x " << dtype_name(xt) << ", y " << dtype_name(yt));
    const Tensor x = ska::test::uniform({513, 65}, 4, -3.0, 3.0).to(xt);
    const Tensor y = ska::test::uniform({513, 65}, 5, -3.0, 3.0).to(yt);
    const DropoutAddRun f = run_dropout_add(true, x, y, Device::cuda(0));
    const DropoutAddRun u = run_dropout_add(false, x, y, Device::cuda(0));
    const DropoutAddRun c = run_dropout_add(true, x, y, Device::cpu());
    CHECK(f.node == "dropout_add");
    CHECK(bitwise_equal(f.out, u.out));
    CHECK(bitwise_equal(f.grad_x, u.grad_x));
    CHECK(bitwise_equal(f.grad_y, u.grad_y));
    CHECK(f.next_draw == u.next_draw);
    // The CPU's mask and arithmetic: no transcendental here, so the same bits.
    CHECK(bitwise_equal(f.out.to(Device::cpu()), c.out));
    CHECK(bitwise_equal(f.grad_y.to(Device::cpu()), c.grad_y));
#ifdef SKA_WITH_CUDA
    // The kernels against the CPU twin, with and without 16-byte alignment (skip 1).
    for (const int64_t skip : {0, 1}) {
      INFO("skip " << skip);
      const int64_t n = x.numel() - skip;
      const auto flat = [&](const Tensor& t, Device d) {
        return t.to(d).reshape({-1}).narrow(0, skip, n);
      };
      const Device gpu = Device::cuda(0);
      Tensor oc = Tensor::empty({n}, xt), bc = Tensor::empty({(n + 7) / 8}, DType::kU8);
      Tensor og = Tensor::empty({n}, xt, gpu), bg = Tensor::empty({(n + 7) / 8}, DType::kU8, gpu);
      cpu::dropout_add_forward(flat(x, Device::cpu()), flat(y, Device::cpu()), 5, 9, 0.8, 1.25,
                               Tensor(), oc, bc);
      cuda::dropout_add_forward(flat(x, gpu), flat(y, gpu), 5, 9, 0.8, 1.25, Tensor(), og, bg);
      CHECK(bg.to_vector<uint8_t>() == bc.to_vector<uint8_t>());
      CHECK(bitwise_equal(og, oc));
      Tensor gc = Tensor::empty({n}, yt), gg = Tensor::empty({n}, yt, gpu);
      cpu::dropout_add_backward(flat(x, Device::cpu()), bc, 1.25, gc);
      cuda::dropout_add_backward(flat(x, gpu), bg, 1.25, gg);
      CHECK(bitwise_equal(gg, gc));
    }
#endif
  }
}
