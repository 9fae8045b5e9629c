// Optimizer tests: SGD / Adam / AdamW against torch.optim goldens, LAMB against our reference of
// timm's Lamb (tests/fixtures/optim, written by scripts/make_optim_fixtures.py), state_dict round
// trips, parameter grouping, and CPU-vs-CUDA parity of the fused update kernels.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::optim;
using ska::test::require_close;
using ska::test::tolerance_for;

namespace {

const char* const kParamNames[] = {"w", "b"};

struct Golden {
  TensorMap tensors;
  StringMap meta;
  int64_t steps = 0;

  explicit Golden(const std::string& name) {
    SafetensorsContents c =
        read_safetensors(std::string(SKA_TEST_FIXTURES) + "/optim/" + name + ".safetensors");
    tensors = std::move(c.tensors);
    meta = std::move(c.metadata);
    steps = std::stoll(meta.at("steps"));
  }
  double number(const std::string& key, double fallback) const {
    const auto it = meta.find(key);
    return it == meta.end() ? fallback : std::stod(it->second);
  }
  const Tensor& at(const std::string& key) const { return tensors.at(key); }

  OptimizerOptions options() const {
    OptimizerOptions o;
    o.name = meta.at("optimizer");
    o.lr = number("lr", 0);
    o.weight_decay = number("weight_decay", 0);
    o.momentum = number("momentum", 0);
    o.nesterov = number("nesterov", 0) != 0;
    if (meta.count("betas")) {
      std::istringstream betas(meta.at("betas"));
      char comma = 0;
      betas >> o.beta1 >> comma >> o.beta2;
    }
    o.eps = number("eps", o.eps);
    o.max_grad_norm = number("max_grad_norm", 0);
    o.always_adapt = number("always_adapt", 0) != 0;
    o.trust_clip = number("trust_clip", 0) != 0;
    return o;
  }
};

// The fixture's two groups: "w" with the weight decay, "b" without.
struct Setup {
  NamedTensors params;
  std::unique_ptr<Optimizer> opt;
};

Setup make_setup(const Golden& g, const std::map<std::string, Tensor>& values, DType dtype,
                 Device device) {
  Setup s;
  for (const char* name : kParamNames) {
    Tensor p = values.at(name).detach().to(device, dtype).clone();
    p.set_requires_grad(true);
    s.params.emplace_back(name, p);
  }
  const OptimizerOptions o = g.options();
  std::vector<ParamGroup> groups{{{s.params[0]}, o.lr, o.weight_decay}, {{s.params[1]}, o.lr, 0.0}};
  s.opt = make_optimizer(o, std::move(groups));
  return s;
}

std::map<std::string, Tensor> initial_values(const Golden& g) {
  return {{"w", g.at("init.w")}, {"b", g.at("init.b")}};
}

// Runs steps [first, last) and compares the parameters with the golden after each.
void run_steps(const Golden& g, Setup& s, int64_t first, int64_t last, DType dtype) {
  for (int64_t k = first; k < last; ++k) {
    for (auto& [name, p] : s.params) {
      p.set_grad(g.at("grad." + std::to_string(k) + "." + name).to(p.device(), dtype));
    }
    s.opt->step();
    for (auto& [name, p] : s.params) {
      require_close(p, g.at("step." + std::to_string(k) + "." + name), tolerance_for(dtype),
                    g.meta.at("optimizer") + " step " + std::to_string(k) + " " + name);
    }
  }
}

void check_golden(const std::string& fixture, DType dtype, Device device) {
  INFO("fixture " << fixture << ", " << dtype_name(dtype) << " on " << device);
  const Golden g(fixture);
  Setup s = make_setup(g, initial_values(g), dtype, device);
  run_steps(g, s, 0, g.steps, dtype);
}

const std::vector<std::string> kFixtures = {"sgd",   "sgd_nesterov", "sgd_plain",     "adam",
                                            "adamw", "lamb",         "lamb_adapt_all"};

}  // namespace

TEST_CASE("optim: optimizers match the PyTorch / timm goldens in f64 and f32", "[cpu][optim]") {
  for (const std::string& fixture : kFixtures) {
    check_golden(fixture, DType::kF64, Device::cpu());
    check_golden(fixture, DType::kF32, Device::cpu());
  }
}

TEST_CASE("optim: optimizer state_dict round trip continues identically", "[cpu][optim]") {
  for (const std::string& fixture : kFixtures) {
    INFO("fixture " << fixture);
    const Golden g(fixture);
    Setup first = make_setup(g, initial_values(g), DType::kF64, Device::cpu());
    run_steps(g, first, 0, 2, DType::kF64);
    std::map<std::string, Tensor> saved;
    for (const auto& [key, value] : first.opt->state_dict()) saved[key] = value.clone();
    const bool has_momentum = g.options().name != "sgd" || g.options().momentum > 0;
    CHECK(saved.count("w.step") == 1);
    CHECK(saved.at("w.step").item() == 2);
    CHECK(saved.size() == (has_momentum ? (g.options().name == "sgd" ? 4u : 6u) : 2u));

    // A fresh optimizer over the parameters as they are after step 2, with the saved state.
    Setup second = make_setup(g, {{"w", first.params[0].second}, {"b", first.params[1].second}},
                              DType::kF64, Device::cpu());
    second.opt->load_state_dict(saved);
    run_steps(g, second, 2, g.steps, DType::kF64);
  }
}

TEST_CASE("optim: optimizer load_state_dict names the key at fault", "[cpu][optim]") {
  const Golden g("adam");
  Setup s = make_setup(g, initial_values(g), DType::kF64, Device::cpu());
  run_steps(g, s, 0, 1, DType::kF64);
  const std::map<std::string, Tensor> good = s.opt->state_dict();

  auto with = [&](const std::string& key, const Tensor& value) {
    std::map<std::string, Tensor> m = good;
    m[key] = value;
    return m;
  };
  REQUIRE_THROWS_WITH(s.opt->load_state_dict(with("v.exp_avg", Tensor::zeros({4}))),
                      Catch::Contains("'v.exp_avg'") && Catch::Contains("no parameter named 'v'"));
  REQUIRE_THROWS_WITH(s.opt->load_state_dict(with("w.momentum", Tensor::zeros({3, 4}))),
                      Catch::Contains("unknown slot 'momentum'"));
  REQUIRE_THROWS_WITH(s.opt->load_state_dict(with("w.exp_avg", Tensor::zeros({4, 3}))),
                      Catch::Contains("'w.exp_avg' has shape [4, 3]"));
  std::map<std::string, Tensor> missing = good;
  missing.erase("b.exp_avg_sq");
  REQUIRE_THROWS_WITH(s.opt->load_state_dict(missing), Catch::Contains("lacks 'b.exp_avg_sq'"));
}

TEST_CASE("optim: a parameter without a grad is skipped and keeps no state", "[cpu][optim]") {
  Tensor a = Tensor::ones({2}).set_requires_grad(true);
  Tensor b = Tensor::ones({2}).set_requires_grad(true);
  OptimizerOptions o;
  o.name = "adam";
  o.lr = 0.1;
  auto opt = make_optimizer(o, {ParamGroup{{{"a", a}, {"b", b}}, 0.1, 0.0}});
  a.set_grad(Tensor::full({2}, 0.5));
  opt->step();
  CHECK(b.to_vector<float>() == std::vector<float>{1, 1});
  CHECK(a.to_vector<float>()[0] == Approx(0.9).epsilon(1e-6));  // Adam's first step: lr * sign
  CHECK(opt->state_dict().count("b.step") == 0);
  opt->zero_grad();
  CHECK_FALSE(a.grad().defined());
  a.set_grad(Tensor::full({3}, 0.5));
  REQUIRE_THROWS_WITH(opt->step(), Catch::Contains("grad of parameter 'a'"));
}

TEST_CASE("optim: the step counts of the parameters that step advance, a launch per run of them",
          "[cpu][optim]") {
  // Five parameters over two groups; the third and the fifth have no gradient (a layer that
  // layer dropout skipped): their counts stay, the others' advance, in two advance_counts calls
  // (runs 0-1 and 3) instead of one per parameter; with every gradient, one call.
  std::vector<Tensor> p;
  for (int i = 0; i < 5; ++i) p.push_back(Tensor::ones({3}).set_requires_grad(true));
  OptimizerOptions o;
  o.name = "adamw";
  auto opt = make_optimizer(o, {ParamGroup{{{"p0", p[0]}, {"p1", p[1]}, {"p2", p[2]}}, 0.1, 0.0},
                                ParamGroup{{{"p3", p[3]}, {"p4", p[4]}}, 0.1, 0.0}});
  const auto advance_calls = [&](const std::vector<int>& with_grads) {
    for (int i : with_grads) p[static_cast<size_t>(i)].set_grad(Tensor::full({3}, 0.5));
    profiler::start();
    opt->step();
    int64_t calls = 0;
    for (const profiler::KernelTime& k : profiler::stop()) {
      if (k.name == "advance_counts") calls += k.calls;
    }
    opt->zero_grad();
    return calls;
  };
  CHECK(advance_calls({0, 1, 2, 3, 4}) == 1);
  CHECK(advance_calls({0, 1, 3}) == 2);
  CHECK(advance_calls({4}) == 1);
  const std::map<std::string, Tensor> state = opt->state_dict();
  const std::vector<double> steps = {2, 2, 1, 2, 2};
  for (int i = 0; i < 5; ++i) {
    INFO("p" << i);
    CHECK(state.at("p" + std::to_string(i) + ".step").item() == steps[static_cast<size_t>(i)]);
  }
}

TEST_CASE("optim: a grad gate that is set leaves its parameters as a missing grad would",
          "[cpu][optim]") {
  // Four parameters in two groups (AdamW with weight decay, so that a zero gradient still moves
  // a parameter that steps); p1 and p2 share one gate (a layer), p3 has its own. Each step runs
  // against a twin optimizer without gates whose gated parameters have no grad while their gate
  // is set: parameters and state bit for bit, under a skip flag too.
  const auto make = [](std::vector<Tensor>& p) {
    p.clear();
    for (int i = 0; i < 4; ++i) {
      p.push_back(ska::test::uniform({3}, 20 + i, -1.0, 1.0, DType::kF32).set_requires_grad(true));
    }
    OptimizerOptions o;
    o.name = "adamw";
    return make_optimizer(o, {ParamGroup{{{"p0", p[0]}, {"p1", p[1]}}, 0.1, 0.05},
                              ParamGroup{{{"p2", p[2]}, {"p3", p[3]}}, 0.1, 0.05}});
  };
  std::vector<Tensor> gated_p, plain_p;
  auto gated = make(gated_p);
  auto plain = make(plain_p);
  Tensor flags = Tensor::zeros({2}, DType::kU8);  // the layer's flag, p3's flag
  gated->set_grad_gates({{"p1", flags.narrow(0, 0, 1)},
                         {"p2", flags.narrow(0, 0, 1)},
                         {"p3", flags.narrow(0, 1, 1)}});
  const std::vector<std::vector<uint8_t>> dropped = {{1, 0}, {0, 1}, {1, 1}, {0, 0}, {1, 0}};
  for (size_t k = 0; k < dropped.size(); ++k) {
    INFO("step " << k);
    flags.copy_(Tensor::from_vector(dropped[k], {2}, DType::kU8));
    const bool skip = k == 4;  // a step the non-finite check skips
    const Tensor skip_flag = Tensor::full({1}, skip ? 1.0 : 0.0, DType::kU8);
    for (int i = 0; i < 4; ++i) {
      const Tensor g =
          ska::test::uniform({3}, 40 + 4 * static_cast<int>(k) + i, -1.0, 1.0, DType::kF32);
      const bool left_out = (i == 1 || i == 2) ? dropped[k][0] : i == 3 ? dropped[k][1] : 0;
      // The backward gives a left-out parameter zeros; the twin gets no grad at all.
      gated_p[static_cast<size_t>(i)].set_grad(left_out ? Tensor::zeros({3}) : g.clone());
      if (!left_out) plain_p[static_cast<size_t>(i)].set_grad(g.clone());
    }
    gated->step(skip_flag);
    plain->step(skip_flag);
    gated->zero_grad();
    plain->zero_grad();
    for (int i = 0; i < 4; ++i) {
      INFO("p" << i);
      CHECK(gated_p[static_cast<size_t>(i)].to_vector<float>() ==
            plain_p[static_cast<size_t>(i)].to_vector<float>());
    }
  }
  // The gated optimizer keeps (zero) state for parameters it has not stepped yet; every state
  // the twin has is the same.
  const std::map<std::string, Tensor> a = gated->state_dict(), b = plain->state_dict();
  for (const auto& [key, value] : b) {
    INFO(key);
    REQUIRE(a.count(key) == 1);
    CHECK(a.at(key).to_vector<double>() == value.to_vector<double>());
  }
  // Updates counted: p0 every step but the skipped one, p1 and p2 at steps 1 and 3, p3 at 0 and 3.
  CHECK(a.at("p0.step").item() == 4);
  CHECK(a.at("p1.step").item() == 2);
  CHECK(a.at("p3.step").item() == 2);

  REQUIRE_THROWS_WITH(gated->set_grad_gates({{"p9", flags.narrow(0, 0, 1)}}),
                      Catch::Contains("'p9'") && Catch::Contains("not one of"));
  REQUIRE_THROWS_WITH(gated->set_grad_gates({{"p0", Tensor::zeros({1})}}),
                      Catch::Contains("grad gate of 'p0'") && Catch::Contains("u8"));
}

TEST_CASE("optim: the kernels read each group's lr as set_lr or groups() last set it",
          "[cpu][optim]") {
  // Plain SGD (p -= lr * g, g = 1) over two groups, so every step's lr shows in the weights.
  Tensor a = Tensor::zeros({2}, DType::kF64).set_requires_grad(true);
  Tensor b = Tensor::zeros({2}, DType::kF64).set_requires_grad(true);
  Sgd opt({ParamGroup{{{"a", a}}, 0.5, 0.0}, ParamGroup{{{"b", b}}, 0.25, 0.0}}, 0.0, false);
  const auto step = [&] {
    a.set_grad(Tensor::ones({2}, DType::kF64));
    b.set_grad(Tensor::ones({2}, DType::kF64));
    opt.step();
  };
  step();  // the constructor's lrs: 0.5 and 0.25
  CHECK(a.to_vector<double>() == std::vector<double>{-0.5, -0.5});
  CHECK(b.to_vector<double>() == std::vector<double>{-0.25, -0.25});
  opt.set_lr(0.125);
  step();
  CHECK(a.to_vector<double>() == std::vector<double>{-0.625, -0.625});
  CHECK(b.to_vector<double>() == std::vector<double>{-0.375, -0.375});
  opt.groups()[1].lr = 1.0;  // changed behind set_lr's back: step() writes it
  step();
  CHECK(a.to_vector<double>() == std::vector<double>{-0.75, -0.75});
  CHECK(b.to_vector<double>() == std::vector<double>{-1.375, -1.375});
}

TEST_CASE("optim: param_groups_weight_decay splits like timm", "[cpu][optim]") {
  auto param = [](const Shape& s, bool trainable = true) {
    return Tensor::zeros(s).set_requires_grad(trainable);
  };
  const NamedTensors named = {{"patch_embed.proj.weight", param({8, 3, 2, 2})},
                              {"patch_embed.proj.bias", param({8})},
                              {"cls_token", param({1, 1, 8})},
                              {"pos_embed", param({1, 5, 8})},
                              {"blocks.0.norm1.weight", param({8})},
                              {"blocks.0.gamma", param({8})},
                              {"blocks.0.fc.weight", param({8, 8})},
                              {"blocks.0.mask", param({4, 4}, false)},
                              {"head.bias2d.bias", param({2, 2})}};
  const auto groups = param_groups_weight_decay(named, 0.1, 0.05, {"cls_token", "pos_*"});
  REQUIRE(groups.size() == 2);
  std::vector<std::string> no_decay, decay;
  for (const auto& e : groups[0].params) no_decay.push_back(e.first);
  for (const auto& e : groups[1].params) decay.push_back(e.first);
  CHECK(groups[0].weight_decay == 0.0);
  CHECK(groups[1].weight_decay == 0.05);
  CHECK(groups[0].lr == 0.1);
  CHECK(no_decay == std::vector<std::string>{"patch_embed.proj.bias", "cls_token", "pos_embed",
                                             "blocks.0.norm1.weight", "blocks.0.gamma",
                                             "head.bias2d.bias"});
  CHECK(decay == std::vector<std::string>{"patch_embed.proj.weight", "blocks.0.fc.weight"});

  const auto single = param_groups_weight_decay(named, 0.1, 0.0, {});
  REQUIRE(single.size() == 1);
  CHECK(single[0].params.size() == 8);

  CHECK(name_matches("blocks.3.attn.static_keys", "*.static_keys"));
  CHECK(name_matches("pos_embed", "pos_?mbed"));
  CHECK_FALSE(name_matches("pos_embed.x", "pos_embed"));
  CHECK_FALSE(name_matches("cls", "cls_token"));
}

TEST_CASE("optim: optimizers reject bad hyperparameters and duplicate parameters", "[cpu][optim]") {
  const Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  REQUIRE_THROWS_WITH(Sgd({ParamGroup{{{"p", p}}, 0.1, 0}}, 0.0, true),
                      Catch::Contains("nesterov needs momentum > 0"));
  REQUIRE_THROWS_WITH(Adam({ParamGroup{{{"p", p}}, 0.1, 0}}, 1.0, 0.999, 1e-8, false),
                      Catch::Contains("betas must be in [0, 1)"));
  REQUIRE_THROWS_WITH(Adam({ParamGroup{{{"p", p}}, 0.1, 0}, ParamGroup{{{"p", p}}, 0.1, 0}}, 0.9,
                           0.999, 1e-8, false),
                      Catch::Contains("'p' appears twice"));
  OptimizerOptions o;
  o.name = "rmsprop";
  REQUIRE_THROWS_WITH(make_optimizer(o, NamedTensors{{"p", p}}),
                      Catch::Contains("unknown optimizer 'rmsprop'"));
}

TEST_CASE("optim: optimizers match the goldens on CUDA", "[cuda][optim]") {
  if (!test::cuda_available_or_skip()) return;
  for (const std::string& fixture : kFixtures) check_golden(fixture, DType::kF32, Device::cuda(0));
}

TEST_CASE("optim: fused optimizer kernels: CUDA matches the CPU twin", "[cuda][optim]") {
  if (!test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  const Shape shape{37, 129};  // not a multiple of the block size
  auto f32 = [&](uint64_t seed, double lo, double hi) {
    return test::uniform(shape, seed, lo, hi).to(DType::kF32);
  };
  const test::Tolerance tol = tolerance_for(DType::kF32);
  for (bool lamb_mode : {false, true}) {
    INFO("adam_step, update output " << lamb_mode);
    const Tensor p = f32(1, -1, 1), g = f32(2, -3, 3), m = f32(3, -0.1, 0.1), v = f32(4, 0, 0.01);
    const Tensor divisor = lamb_mode ? Tensor::full({}, 2.5) : Tensor();
    const Tensor u = lamb_mode ? Tensor::empty(shape) : Tensor();
    std::vector<Tensor> dev;
    for (const Tensor& t : {p, g, m, v, u}) dev.push_back(t.defined() ? t.to(gpu) : Tensor());
    const Tensor dev_divisor = divisor.defined() ? divisor.to(gpu) : Tensor();
    const double l2 = lamb_mode ? 0.0 : 0.01, decoupled = lamb_mode ? 0.05 : 0.02;
    const Tensor step = Tensor::full({1}, 3.0, DType::kI64);
    const Tensor lr = Tensor::full({1}, 0.01, DType::kF64);
    cpu::adam_step(p, g, divisor, m, v, u, step, Tensor(), lr, 0.9, 0.999, 1e-8, l2, decoupled);
    SKA_KERNEL(gpu, adam_step)
    (dev[0], dev[1], dev_divisor, dev[2], dev[3], dev[4], step.to(gpu), Tensor(), lr.to(gpu), 0.9,
     0.999, 1e-8, l2, decoupled);
    require_close(dev[0], p, tol, "param");
    require_close(dev[2], m, tol, "exp_avg");
    require_close(dev[3], v, tol, "exp_avg_sq");
    if (lamb_mode) require_close(dev[4], u, tol, "update");
  }
  for (bool nesterov : {false, true}) {
    INFO("sgd_step, nesterov " << nesterov);
    const Tensor p = f32(5, -1, 1), g = f32(6, -1, 1), buf = f32(7, -0.5, 0.5);
    const Tensor dp = p.to(gpu), dg = g.to(gpu), dbuf = buf.to(gpu);
    const Tensor lr = Tensor::full({1}, 0.1, DType::kF64);
    cpu::sgd_step(p, g, buf, Tensor(), lr, 0.9, 0.05, nesterov);
    SKA_KERNEL(gpu, sgd_step)(dp, dg, dbuf, Tensor(), lr.to(gpu), 0.9, 0.05, nesterov);
    require_close(dp, p, tol, "param");
    require_close(dbuf, buf, tol, "momentum buffer");
  }
  // A set skip flag leaves everything as it was (and zero-fills LAMB's update); a clear one is
  // the same as none. The counts advance only without the flag.
  for (uint8_t flag : {uint8_t{0}, uint8_t{1}}) {
    INFO("skip flag " << int(flag));
    const Tensor skip = Tensor::full({}, flag, DType::kU8).to(gpu);
    const Tensor p = f32(8, -1, 1), g = f32(9, -1, 1), m = f32(10, -0.1, 0.1), v = f32(11, 0, 0.01);
    const Tensor dp = p.to(gpu), dm = m.to(gpu), dv = v.to(gpu), du = Tensor::full(shape, 7.0).to(gpu);
    const Tensor step = Tensor::full({1}, 2.0, DType::kI64).to(gpu);
    SKA_KERNEL(gpu, adam_step)
    (dp, g.to(gpu), Tensor(), dm, dv, du, step, skip, Tensor(), 0.9, 0.999, 1e-8, 0.0, 0.05);
    Tensor ep = p.clone(), em = m.clone(), ev = v.clone(), eu = Tensor::full(shape, 7.0);
    if (flag) {
      eu.fill_(0.0);
    } else {
      cpu::adam_step(ep, g, Tensor(), em, ev, eu, Tensor::full({1}, 2.0, DType::kI64), Tensor(),
                     Tensor(), 0.9, 0.999, 1e-8, 0.0, 0.05);
    }
    require_close(dp, ep, tol, "param");
    require_close(dm, em, tol, "exp_avg");
    require_close(dv, ev, tol, "exp_avg_sq");
    require_close(du, eu, tol, "update");
    const Tensor counts = Tensor::full({3}, 5.0, DType::kI64).to(gpu);
    SKA_KERNEL(gpu, advance_counts)(counts, skip);
    CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>(3, flag ? 5 : 6));
    const Tensor stats = Tensor::zeros({5}).to(gpu), cpu_stats = Tensor::zeros({5});
    const Tensor loss = Tensor::full({}, 1.5).to(gpu);
    for (int i = 0; i < 3; ++i) {
      SKA_KERNEL(gpu, record_update)(stats, loss, skip);
      cpu::record_update(cpu_stats, loss.to(Device::cpu()), skip.to(Device::cpu()));
    }
    CHECK(stats.to_vector<float>() == cpu_stats.to_vector<float>());
  }
}
