// The multi-tensor kernels (gradient statistics and scaling, Adam, LAMB, SGD, the weight
// average, casts): the CPU twins against the single-tensor math, CUDA against the CPU over lists
// long enough to need several launches (more than 32 tensors, tensors of several chunks, an empty
// one), in f32 and bf16, with the skip flag; the statistics have the same bits on every run.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/backend.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::require_close;
using ska::test::tolerance_for;

namespace {

// 40 tensors: sizes from 0 to well past one 16384-element chunk, one of 3 chunks.
TensorList make_list(uint64_t seed, double lo, double hi) {
  TensorList list;
  for (int i = 0; i < 40; ++i) {
    const int64_t n = i == 7 ? 0 : i == 20 ? 3 * 16384 + 5 : 1 + (i * 997) % 20000;
    list.push_back(test::uniform({n}, seed * 100 + static_cast<uint64_t>(i), lo, hi)
                       .to(DType::kF32));
  }
  return list;
}

TensorList clone(const TensorList& list, Device device = Device::cpu(),
                 DType dtype = DType::kF32) {
  TensorList out;
  for (const Tensor& t : list) out.push_back(t.to(device, dtype).clone());
  return out;
}

void require_lists_close(const TensorList& actual, const TensorList& expected,
                         test::Tolerance tol, const char* what) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO(what << " " << i);
    require_close(actual[i].to(Device::cpu(), DType::kF32), expected[i], tol, what);
  }
}

// LAMB on one tensor from the single-tensor pieces: adam_step's update (f32), then the trust
// ratio from f64 norms and p -= lr * (trust * u).
void lamb_reference(const Tensor& p, const Tensor& g, const Tensor& divisor, const Tensor& m,
                    const Tensor& v, const Tensor& step, double lr, double weight_decay,
                    bool adapt, bool trust_clip) {
  const Tensor u = Tensor::empty(p.shape());
  cpu::adam_step(p, g, divisor, m, v, u, step, Tensor(), Tensor(), 0.9, 0.999, 1e-6, 0.0,
                 weight_decay);
  const std::vector<float> pv = p.to_vector<float>(), uv = u.to_vector<float>();
  double w_squares = 0.0, u_squares = 0.0;
  for (size_t i = 0; i < pv.size(); ++i) {
    w_squares += static_cast<double>(pv[i]) * pv[i];
    u_squares += static_cast<double>(uv[i]) * uv[i];
  }
  float trust = 1.0f;
  if (adapt && w_squares > 0 && u_squares > 0) {
    trust = static_cast<float>(std::sqrt(w_squares) / std::sqrt(u_squares));
  }
  if (adapt && trust_clip) trust = std::min(trust, 1.0f);
  std::vector<float> out(pv.size());
  for (size_t i = 0; i < pv.size(); ++i) out[i] = pv[i] - (uv[i] * trust) * static_cast<float>(lr);
  Tensor(p).copy_(Tensor::from_vector(out, p.shape()));
}

}  // namespace

TEST_CASE("multi-tensor CPU twins: the single-tensor math over a list", "[cpu][optim]") {
  const TensorList grads = make_list(1, -2, 2);
  // Statistics: f64 sums of x^2 and of 0 * x, after the scale.
  TensorList scaled = clone(grads);
  const Tensor stats = Tensor::empty({2});
  cpu::multi_grad_stats(scaled, 0.5, stats);
  double squares = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<float> expected = grads[i].to_vector<float>();
    for (float& x : expected) {
      x *= 0.5f;
      squares += static_cast<double>(x) * x;
    }
    REQUIRE(scaled[i].to_vector<float>() == expected);
  }
  CHECK(stats.to_vector<float>()[0] == static_cast<float>(squares));
  CHECK(stats.to_vector<float>()[1] == 0.0f);
  scaled[3].narrow(0, 5, 1).fill_(std::numeric_limits<double>::infinity());
  cpu::multi_grad_stats(scaled, 1.0, stats);
  CHECK(std::isnan(stats.to_vector<float>()[1]));
  cpu::multi_grad_stats({}, 1.0, stats);
  CHECK(stats.to_vector<float>() == std::vector<float>{0.0f, 0.0f});

  // Scaling by a factor read from a tensor.
  TensorList by_factor = clone(grads);
  cpu::multi_scale(by_factor, Tensor::full({}, 0.25));
  CHECK(by_factor[20].to_vector<float>()[100] == grads[20].to_vector<float>()[100] * 0.25f);

  // Adam over the list equals adam_step per tensor; a set skip flag changes nothing.
  const TensorList params = make_list(2, -1, 1), m = make_list(3, -0.1, 0.1),
                   v = make_list(4, 0, 0.01);
  TensorList steps;
  for (size_t i = 0; i < params.size(); ++i) {
    steps.push_back(Tensor::full({1}, static_cast<double>(1 + i % 5), DType::kI64));
  }
  TensorList p1 = clone(params), m1 = clone(m), v1 = clone(v);
  const Tensor lr = Tensor::full({1}, 0.01, DType::kF64);
  cpu::multi_adam_step(p1, grads, m1, v1, steps, Tensor::zeros({}, DType::kU8), lr, 0.9, 0.999,
                       1e-8, 0.01, 0.05);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor p2 = params[i].clone(), m2 = m[i].clone(), v2 = v[i].clone();
    cpu::adam_step(p2, grads[i], Tensor(), m2, v2, Tensor(), steps[i], Tensor(), lr, 0.9, 0.999,
                   1e-8, 0.01, 0.05);
    REQUIRE(p1[i].to_vector<float>() == p2.to_vector<float>());
    REQUIRE(m1[i].to_vector<float>() == m2.to_vector<float>());
    REQUIRE(v1[i].to_vector<float>() == v2.to_vector<float>());
  }
  TensorList p3 = clone(params);
  cpu::multi_adam_step(p3, grads, clone(m), clone(v), steps, Tensor::ones({}, DType::kU8), lr,
                       0.9, 0.999, 1e-8, 0.01, 0.05);
  CHECK(p3[20].to_vector<float>() == params[20].to_vector<float>());

  // LAMB over the list equals LAMB per tensor, with and without the trust ratio and its clip,
  // with a gradient divisor; a zero tensor keeps a trust ratio of 1; a set skip flag changes
  // nothing.
  TensorList zero_first = clone(params);
  zero_first[3].fill_(0.0);
  for (const auto& [adapt, trust_clip] : {std::pair{false, false}, {true, false}, {true, true}}) {
    INFO("lamb adapt " << adapt << " trust_clip " << trust_clip);
    const Tensor divisor = Tensor::full({}, 1.7);
    TensorList p4 = clone(zero_first), m4 = clone(m), v4 = clone(v);
    cpu::multi_lamb_step(p4, grads, m4, v4, steps, Tensor::zeros({}, DType::kU8), divisor, lr, 0.9,
                         0.999, 1e-6, 0.02, adapt, trust_clip);
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor p5 = zero_first[i].clone(), m5 = m[i].clone(), v5 = v[i].clone();
      lamb_reference(p5, grads[i], divisor, m5, v5, steps[i], 0.01, 0.02, adapt, trust_clip);
      INFO("tensor " << i);
      REQUIRE(m4[i].to_vector<float>() == m5.to_vector<float>());
      REQUIRE(v4[i].to_vector<float>() == v5.to_vector<float>());
      require_close(p4[i], p5, test::Tolerance{1e-7, 1e-6}, "lamb param");
    }
    // Where ||p|| = 0 the trust ratio is 1: the zeroed tensor still moves.
    const std::vector<float> moved = p4[3].to_vector<float>();
    CHECK(std::any_of(moved.begin(), moved.end(), [](float x) { return x != 0.0f; }));
    // Against adapt off: tensor 20's ratio ||p|| / ||u|| is above 1, so it changes the step,
    // unless clipped to 1.
    if (adapt) {
      TensorList plain = clone(zero_first);
      cpu::multi_lamb_step(plain, grads, clone(m), clone(v), steps, Tensor(), divisor, lr, 0.9,
                           0.999, 1e-6, 0.02, false, false);
      CHECK((plain[20].to_vector<float>() == p4[20].to_vector<float>()) == trust_clip);
    }
  }
  TensorList p6 = clone(params), m6 = clone(m);
  cpu::multi_lamb_step(p6, grads, m6, clone(v), steps, Tensor::ones({}, DType::kU8), Tensor(), lr,
                       0.9, 0.999, 1e-6, 0.02, true, false);
  CHECK(p6[20].to_vector<float>() == params[20].to_vector<float>());
  CHECK(m6[20].to_vector<float>() == m[20].to_vector<float>());

  // The weight average: each product and the sum rounded to f32.
  TensorList ema = clone(params);
  cpu::multi_ema_update(ema, grads, 0.9, Tensor());
  const float e0 = params[20].to_vector<float>()[9], g0 = grads[20].to_vector<float>()[9];
  CHECK(ema[20].to_vector<float>()[9] == e0 * 0.9f + g0 * static_cast<float>(1.0 - 0.9));
  TensorList ema_skipped = clone(params);
  cpu::multi_ema_update(ema_skipped, grads, 0.9, Tensor::ones({}, DType::kU8));
  CHECK(ema_skipped[20].to_vector<float>() == params[20].to_vector<float>());

  // Lists that do not match are errors naming the tensor.
  TensorList short_list(grads.begin(), grads.begin() + 3);
  REQUIRE_THROWS_WITH(cpu::multi_ema_update(clone(params), short_list, 0.9, Tensor()),
                      Catch::Contains("lists of 40 and 3 tensors"));
}

// Each tensor of `list` converted to `dtype` by copy (Tensor::to).
TensorList converted(const TensorList& list, DType dtype) {
  TensorList out;
  for (const Tensor& t : list) out.push_back(t.detach().to(dtype));
  return out;
}

// Empty destinations with `list`'s sizes, on `device` in `dtype`, each a [n] view at a different
// offset of one buffer (as autocast's parameter casts are).
TensorList destinations(const TensorList& list, Device device, DType dtype) {
  int64_t total = 0;
  for (const Tensor& t : list) total += t.numel() + 3;
  const Tensor buffer = Tensor::empty({total}, dtype, device);
  TensorList out;
  int64_t offset = 0;
  for (const Tensor& t : list) {
    out.push_back(buffer.narrow(0, offset, t.numel()));
    offset += t.numel() + 3;
  }
  return out;
}

TEST_CASE("multi_cast converts every tensor as copy does, bit for bit", "[cpu][optim]") {
  // Values spread over the range where bf16 and f16 round (ties included: 1 + 2^-8 in bf16).
  TensorList src = make_list(5, -300, 300);
  src[3].narrow(0, 0, 2).copy_(Tensor::from_vector<float>({1.0f + 1.0f / 256, -1.5e-5f}, {2}));
  const std::vector<std::pair<DType, DType>> pairs = {{DType::kF32, DType::kBF16},
                                                      {DType::kF32, DType::kF16},
                                                      {DType::kBF16, DType::kF32},
                                                      {DType::kF16, DType::kF32}};
  for (const auto& [from, to] : pairs) {
    INFO(dtype_name(from) << " to " << dtype_name(to));
    const TensorList in = converted(src, from);
    const TensorList out = destinations(in, Device::cpu(), to);
    cpu::multi_cast(in, out);
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("tensor " << i);
      CHECK(test::bitwise_equal(out[i], in[i].to(to)));
    }
  }
  cpu::multi_cast({}, {});  // nothing to do

  // Lists that do not match are errors naming the tensor.
  const TensorList bf16 = converted(src, DType::kBF16);
  CHECK_THROWS_WITH(cpu::multi_cast(src, TensorList(bf16.begin(), bf16.begin() + 3)),
                    Catch::Contains("lists of 40 and 3 tensors"));
  TensorList wrong_size = destinations(src, Device::cpu(), DType::kBF16);
  wrong_size[9] = Tensor::empty({wrong_size[9].numel() + 1}, DType::kBF16);
  CHECK_THROWS_WITH(cpu::multi_cast(src, wrong_size), Catch::Contains("tensor 9"));
  TensorList mixed = destinations(src, Device::cpu(), DType::kBF16);
  mixed[2] = Tensor::empty({mixed[2].numel()}, DType::kF16);
  CHECK_THROWS_AS(cpu::multi_cast(src, mixed), DTypeError);
  CHECK_THROWS_WITH(
      cpu::multi_cast(converted(src, DType::kF64), destinations(src, Device::cpu(), DType::kF32)),
      Catch::Contains("f32, bf16 or f16"));
}

TEST_CASE("multi_cast on CUDA converts as the CPU does, bit for bit", "[cuda][optim]") {
  if (!test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  TensorList src = make_list(5, -300, 300);
  src[3].narrow(0, 0, 2).copy_(Tensor::from_vector<float>({1.0f + 1.0f / 256, -1.5e-5f}, {2}));
  for (const auto& [from, to] : std::vector<std::pair<DType, DType>>{{DType::kF32, DType::kBF16},
                                                                     {DType::kF32, DType::kF16},
                                                                     {DType::kBF16, DType::kF32},
                                                                     {DType::kF16, DType::kF32}}) {
    INFO(dtype_name(from) << " to " << dtype_name(to));
    const TensorList in = converted(src, from);
    TensorList din;
    for (const Tensor& t : in) din.push_back(t.to(gpu));
    const TensorList dout = destinations(in, gpu, to), hout = destinations(in, Device::cpu(), to);
    SKA_KERNEL(gpu, multi_cast)(din, dout);  // 40 tensors: two launches
    cpu::multi_cast(in, hout);
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("tensor " << i);
      CHECK(test::bitwise_equal(dout[i].to(Device::cpu()), hout[i]));
    }
  }
}

TEST_CASE("multi-tensor kernels: CUDA matches the CPU twins, f32 and bf16", "[cuda][optim]") {
  if (!test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  const TensorList grads = make_list(1, -2, 2), params = make_list(2, -1, 1),
                   m = make_list(3, -0.1, 0.1), v = make_list(4, 0, 0.01);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dtype));
    const test::Tolerance tol = tolerance_for(dtype);
    // The CPU works on the values the device holds (rounded to the dtype), in f32.
    const auto rounded = [&](const TensorList& list) {
      return clone(clone(list, Device::cpu(), dtype), Device::cpu(), DType::kF32);
    };

    // Statistics, twice: the same bits.
    TensorList dg = clone(grads, gpu, dtype), hg = rounded(grads);
    const Tensor dstats = Tensor::empty({2}, DType::kF32, gpu), hstats = Tensor::empty({2});
    SKA_KERNEL(gpu, multi_grad_stats)(dg, 0.5, dstats);
    cpu::multi_grad_stats(hg, 0.5, hstats);
    require_lists_close(dg, hg, tol, "scaled grad");
    require_close(dstats.to(Device::cpu()), hstats, test::Tolerance{1e-4, 1e-3}, "statistics");
    const Tensor again = Tensor::empty({2}, DType::kF32, gpu);
    SKA_KERNEL(gpu, multi_grad_stats)(dg, 1.0, dstats);
    SKA_KERNEL(gpu, multi_grad_stats)(dg, 1.0, again);
    CHECK(dstats.to_vector<float>() == again.to_vector<float>());
    dg[33].narrow(0, 2, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    SKA_KERNEL(gpu, multi_grad_stats)(dg, 1.0, dstats);
    CHECK(std::isnan(dstats.to_vector<float>()[1]));

    // Scaling by a device factor.
    TensorList ds = clone(grads, gpu, dtype), hs = rounded(grads);
    SKA_KERNEL(gpu, multi_scale)(ds, Tensor::full({}, 0.25).to(gpu));
    cpu::multi_scale(hs, Tensor::full({}, 0.25));
    require_lists_close(ds, hs, tol, "scaled by factor");

    // Adam, with and without the skip flag.
    TensorList steps, dsteps;
    for (size_t i = 0; i < params.size(); ++i) {
      steps.push_back(Tensor::full({1}, static_cast<double>(1 + i % 5), DType::kI64));
      dsteps.push_back(steps.back().to(gpu));
    }
    for (uint8_t flag : {uint8_t{0}, uint8_t{1}}) {
      INFO("skip " << int(flag));
      TensorList dp = clone(params, gpu, dtype), dm = clone(m, gpu, dtype),
                 dv = clone(v, gpu, dtype);
      TensorList hp = rounded(params), hm = rounded(m), hv = rounded(v);
      const Tensor lr = Tensor::full({1}, 0.01, DType::kF64);
      SKA_KERNEL(gpu, multi_adam_step)(dp, clone(grads, gpu, dtype), dm, dv, dsteps,
                            Tensor::full({}, flag, DType::kU8).to(gpu), lr.to(gpu), 0.9, 0.999,
                            1e-8, 0.01, 0.05);
      cpu::multi_adam_step(hp, rounded(grads), hm, hv, steps, Tensor::full({}, flag, DType::kU8),
                           lr, 0.9, 0.999, 1e-8, 0.01, 0.05);
      require_lists_close(dp, hp, tol, "adam param");
      require_lists_close(dm, hm, tol, "adam exp_avg");
      require_lists_close(dv, hv, tol, "adam exp_avg_sq");

      // SGD with momentum and without.
      for (bool momentum : {false, true}) {
        TensorList sp = clone(params, gpu, dtype), sb = momentum ? clone(m, gpu, dtype) : TensorList{};
        TensorList tp = rounded(params), tb = momentum ? rounded(m) : TensorList{};
        const Tensor sgd_lr = Tensor::full({1}, 0.1, DType::kF64);
        SKA_KERNEL(gpu, multi_sgd_step)(sp, clone(grads, gpu, dtype), sb,
                             Tensor::full({}, flag, DType::kU8).to(gpu), sgd_lr.to(gpu),
                             momentum ? 0.9 : 0.0, 0.05, momentum);
        cpu::multi_sgd_step(tp, rounded(grads), tb, Tensor::full({}, flag, DType::kU8), sgd_lr,
                            momentum ? 0.9 : 0.0, 0.05, momentum);
        require_lists_close(sp, tp, tol, "sgd param");
        if (momentum) require_lists_close(sb, tb, tol, "sgd momentum");
      }

      // LAMB: the trust ratio off, on, and clipped; a gradient divisor read on the device.
      for (const auto& [adapt, trust_clip] :
           {std::pair{false, false}, {true, false}, {true, true}}) {
        INFO("lamb adapt " << adapt << " trust_clip " << trust_clip);
        TensorList lp = clone(params, gpu, dtype), lm = clone(m, gpu, dtype),
                   lv = clone(v, gpu, dtype);
        TensorList kp = rounded(params), km = rounded(m), kv = rounded(v);
        const Tensor divisor = Tensor::full({}, 1.7);
        SKA_KERNEL(gpu, multi_lamb_step)(lp, clone(grads, gpu, dtype), lm, lv, dsteps,
                              Tensor::full({}, flag, DType::kU8).to(gpu), divisor.to(gpu),
                              lr.to(gpu), 0.9, 0.999, 1e-6, 0.02, adapt, trust_clip);
        cpu::multi_lamb_step(kp, rounded(grads), km, kv, steps,
                             Tensor::full({}, flag, DType::kU8), divisor, lr, 0.9, 0.999, 1e-6,
                             0.02, adapt, trust_clip);
        require_lists_close(lp, kp, tol, "lamb param");
        require_lists_close(lm, km, tol, "lamb exp_avg");
        require_lists_close(lv, kv, tol, "lamb exp_avg_sq");
      }

      // The weight average.
      TensorList de = clone(params, gpu, dtype), he = rounded(params);
      SKA_KERNEL(gpu, multi_ema_update)(de, clone(grads, gpu, dtype), 0.99,
                             Tensor::full({}, flag, DType::kU8).to(gpu));
      cpu::multi_ema_update(he, rounded(grads), 0.99, Tensor::full({}, flag, DType::kU8));
      require_lists_close(de, he, tol, "ema");
    }
  }
}
