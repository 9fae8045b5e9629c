// Schedule values at the key steps of the paper's recipes (hand-derived from timm's cosine
// formula), optimizer / schedule config parsing, gradient clipping, the non-finite flag, and EMA.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>

#include "config/config.h"
#include "nn/module.h"
#include "optim/ema.h"
#include "optim/grad_utils.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::optim;

namespace {

// The MetaFormer ImageNet recipe: LAMB 8e-3, 300 epochs + 10 cooldown, 20 warmup from 1e-6.
ScheduleOptions imagenet_cosine() {
  ScheduleOptions o;
  o.name = "cosine";
  o.base_lr = 8e-3;
  o.epochs = 300;
  o.warmup_epochs = 20;
  o.warmup_lr = 1e-6;
  o.min_lr = 1e-5;
  o.cooldown_epochs = 10;
  return o;
}

double cosine(double t, double t_max, double base, double floor) {
  return floor + 0.5 * (base - floor) * (1 + std::cos(M_PI * t / t_max));
}

}  // namespace

TEST_CASE("optim: cosine schedule with warmup and cooldown, per epoch", "[cpu][optim]") {
  const LrSchedule s(imagenet_cosine());
  CHECK(s.total_epochs() == 310);
  CHECK(s.lr(0) == Approx(1e-6));                             // start: warmup_lr
  CHECK(s.lr(10) == Approx(1e-6 + 10 * (8e-3 - 1e-6) / 20));  // half way up: 4.0005e-3
  CHECK(s.lr(10) == Approx(4.0005e-3));
  // End of warmup: the cosine counted from t = 0 (timm, warmup_prefix off), not the base lr.
  CHECK(s.lr(20) == Approx(1e-5 + 0.5 * 7.99e-3 * (1 + std::cos(M_PI / 15))));
  CHECK(s.lr(20) == Approx(0.0079126997).epsilon(1e-8));
  CHECK(s.lr(150) == Approx(1e-5 + 7.99e-3 / 2));  // mid cosine: 4.005e-3
  CHECK(s.lr(299) == Approx(cosine(299, 300, 8e-3, 1e-5)));
  CHECK(s.lr(299) > 1e-5);
  CHECK(s.lr(300) == Approx(1e-5));  // cooldown at min_lr
  CHECK(s.lr(309) == Approx(1e-5));
  CHECK(s.lr(500) == Approx(1e-5));
}

TEST_CASE("optim: cosine schedule per step scales every length by the updates per epoch",
          "[cpu][optim]") {
  ScheduleOptions o = imagenet_cosine();
  o.per_step = true;
  const LrSchedule s(o);
  const int64_t n = 100;  // updates per epoch
  CHECK(s.lr(0, 0, n) == Approx(1e-6));
  CHECK(s.lr(0, 50, n) == Approx(1e-6 + 50 * (8e-3 - 1e-6) / 2000));
  CHECK(s.lr(10, 0, n) == Approx(4.0005e-3));
  CHECK(s.lr(150, 0, n) == Approx(4.005e-3));
  CHECK(s.lr(200, 37, n) == Approx(cosine(20037, 30000, 8e-3, 1e-5)));
  CHECK(s.lr(300, 0, n) == Approx(1e-5));
  CHECK(s.lr_at(29999, n) > 1e-5);
}

TEST_CASE("optim: CIFAR cosine, step decay and constant schedules", "[cpu][optim]") {
  ScheduleOptions cifar;  // Adam lr 1e-4, cosine over 400 epochs per epoch, no warmup
  cifar.base_lr = 1e-4;
  cifar.epochs = 400;
  const LrSchedule c(cifar);
  CHECK(c.lr(0) == Approx(1e-4));
  CHECK(c.lr(200) == Approx(5e-5));
  CHECK(c.lr(100) == Approx(5e-5 * (1 + std::sqrt(0.5))));
  CHECK(c.lr(400) == 0.0);

  ScheduleOptions step;
  step.name = "step";
  step.base_lr = 0.1;
  step.epochs = 90;
  step.step_size = 30;
  step.gamma = 0.1;
  const LrSchedule st(step);
  CHECK(st.lr(29) == Approx(0.1));
  CHECK(st.lr(30) == Approx(0.01));
  CHECK(st.lr(65) == Approx(0.001));

  ScheduleOptions constant;
  constant.name = "constant";
  constant.base_lr = 0.5;
  constant.epochs = 10;
  constant.warmup_epochs = 5;
  const LrSchedule k(constant);
  CHECK(k.lr(0) == 0.0);
  CHECK(k.lr(1) == Approx(0.1));
  CHECK(k.lr(5) == Approx(0.5));
  CHECK(k.lr(9) == Approx(0.5));
}

TEST_CASE("optim: optimizer and schedule config parsing", "[cpu][optim]") {
  Config cfg = Config::parse(
      "optim: {name: lamb, lr: 8e-3, weight_decay: 0.05, no_weight_decay: [cls_token]}\n"
      "sched: {name: cosine, warmup_epochs: 20, warmup_lr: 1e-6, min_lr: 1e-5,\n"
      "        cooldown_epochs: 10, per_step: true}\n");
  const OptimizerOptions o = OptimizerOptions::from_config(cfg.root()["optim"]);
  CHECK(o.name == "lamb");
  CHECK(o.lr == Approx(8e-3));
  CHECK(o.weight_decay == Approx(0.05));
  CHECK(o.eps == Approx(1e-6));  // timm Lamb's default
  CHECK(o.max_grad_norm == 1.0);
  CHECK(o.no_weight_decay == std::vector<std::string>{"cls_token"});
  const ScheduleOptions s = ScheduleOptions::from_config(cfg.root()["sched"], o.lr, 300);
  CHECK(s.per_step);
  CHECK(s.warmup_epochs == 20);
  CHECK(s.min_lr == Approx(1e-5));
  CHECK(LrSchedule(s).total_epochs() == 310);
  cfg.check_unused();

  const Config adam = Config::parse("optim: {name: adam, lr: 1e-4, betas: [0.9, 0.99]}");
  const OptimizerOptions a = OptimizerOptions::from_config(adam.root()["optim"]);
  CHECK(a.eps == 1e-8);
  CHECK(a.beta2 == Approx(0.99));

  auto optim_error = [](const std::string& yaml) {
    const Config c = Config::parse(yaml);
    OptimizerOptions::from_config(c.root()["optim"]);
  };
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adamww}"),
                      Catch::Contains("optim.name") && Catch::Contains("did you mean 'adamw'"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adam, lr: -1}"),
                      Catch::Contains("optim.lr") && Catch::Contains("must be > 0"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adam, betas: [0.9]}"),
                      Catch::Contains("optim.betas") && Catch::Contains("two numbers"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adam, betas: [0.9, 1.5]}"),
                      Catch::Contains("optim.betas") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adam, momentum: 0.9}"),
                      Catch::Contains("optim.momentum") && Catch::Contains("only by sgd"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: sgd, momentum: 0, nesterov: true}"),
                      Catch::Contains("optim.nesterov: needs momentum > 0"));
  REQUIRE_THROWS_WITH(optim_error("optim: {name: adamw, weight_decay: 2}"),
                      Catch::Contains("optim.weight_decay") && Catch::Contains("out of range"));

  auto sched_error = [](const std::string& yaml) {
    const Config c = Config::parse(yaml);
    ScheduleOptions::from_config(c.root()["sched"], 1e-3, 100);
  };
  REQUIRE_THROWS_WITH(sched_error("sched: {name: cosine, min_lr: 0.1}"),
                      Catch::Contains("sched.min_lr") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(sched_error("sched: {name: cosine, warmup_epochs: 101}"),
                      Catch::Contains("sched.warmup_epochs"));
  REQUIRE_THROWS_WITH(sched_error("sched: {name: step, min_lr: 1e-5}"),
                      Catch::Contains("sched.min_lr") && Catch::Contains("only by cosine"));
  REQUIRE_THROWS_WITH(sched_error("sched: {name: linear}"),
                      Catch::Contains("sched.name") && Catch::Contains("cosine"));
}

namespace {

TensorList params_with_grads(const std::vector<std::vector<float>>& grads) {
  TensorList params;
  for (const auto& g : grads) {
    const int64_t n = static_cast<int64_t>(g.size());
    Tensor p = Tensor::zeros({n}).set_requires_grad(true);
    p.set_grad(Tensor::from_vector(g, {n}));
    params.push_back(p);
  }
  return params;
}

}  // namespace

TEST_CASE("optim: gradient clipping by global norm and by value", "[cpu][optim]") {
  TensorList params = params_with_grads({{3, -4}, {0, 12}});
  params.push_back(Tensor::zeros({2}).set_requires_grad(true));  // no grad: skipped
  CHECK(grad_norm(params).item() == Approx(13));
  const Tensor norm = clip_grad_norm(params, 6.5);
  CHECK(norm.item() == Approx(13));
  CHECK(norm.device() == Device::cpu());
  const float c = static_cast<float>(6.5 / (13 + 1e-6));
  CHECK(params[0].grad().to_vector<float>() == std::vector<float>{3 * c, -4 * c});
  CHECK(params[1].grad().to_vector<float>()[1] == Approx(6));
  CHECK(clip_grad_norm(params, 100).item() == Approx(6.5));  // below max: unchanged
  CHECK(params[1].grad().to_vector<float>()[1] == Approx(6));

  TensorList v = params_with_grads({{3, -4, 0.5f}});
  clip_grad_value(v, 2.5);
  CHECK(v[0].grad().to_vector<float>() == std::vector<float>{2.5f, -2.5f, 0.5f});

  zero_grad(v, false);
  CHECK(v[0].grad().to_vector<float>() == std::vector<float>{0, 0, 0});
  zero_grad(v);
  CHECK_FALSE(v[0].grad().defined());
  CHECK(grad_norm(v).item() == 0.0);
}

TEST_CASE("optim: grads_nonfinite flags inf and NaN as a u8 device tensor", "[cpu][optim]") {
  const Tensor ok = grads_nonfinite(params_with_grads({{1e30f, -2}, {3}}));
  CHECK(ok.dtype() == DType::kU8);
  CHECK(ok.item() == 0);
  CHECK(grads_nonfinite(params_with_grads({{1, INFINITY}, {3}})).item() == 1);
  CHECK(grads_nonfinite(params_with_grads({{1, 2}, {-INFINITY}})).item() == 1);
  CHECK(grads_nonfinite(params_with_grads({{1, NAN}, {3}})).item() == 1);
}

namespace {

class TinyModel : public nn::Module {
 public:
  TinyModel() {
    weight = register_parameter("weight", Tensor::from_vector<float>({1, 2}, {2}));
    running = register_buffer("running", Tensor::from_vector<float>({10}, {1}));
    count = register_buffer("count", Tensor::from_vector<int64_t>({0}, {1}));
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Tiny"; }
  Tensor weight, running, count;
};

}  // namespace

TEST_CASE("optim: ModelEma averages weights (and buffers) as timm's ModelEmaV2", "[cpu][optim]") {
  TinyModel model;
  ModelEma ema(model, 0.9);
  ModelEma ema_copy_buffers(model, 0.9, /*average_buffers=*/false);
  model.weight.copy_(Tensor::from_vector<float>({3, 0}, {2}));
  model.running.fill_(20);
  model.count.fill_(7);
  ema.update(model);
  ema_copy_buffers.update(model);
  // 0.9 * [1, 2] + 0.1 * [3, 0] = [1.2, 1.8]
  const auto w = ema.state_dict().at("weight").to_vector<double>();
  CHECK(w[0] == Approx(1.2));
  CHECK(w[1] == Approx(1.8));
  CHECK(ema.state_dict().at("running").item() == Approx(11));
  CHECK(ema.state_dict().at("count").item() == 7);  // integer buffers are copied
  CHECK(ema_copy_buffers.state_dict().at("running").item() == Approx(20));
  CHECK(ema_copy_buffers.state_dict().at("weight").to_vector<double>()[0] == Approx(1.2));
  CHECK_FALSE(ema.state_dict().at("weight").requires_grad());
  CHECK(model.weight.to_vector<float>()[0] == 3);  // the model is untouched

  ema.update(model);  // 0.9 * 1.2 + 0.1 * 3 = 1.38
  CHECK(ema.state_dict().at("weight").to_vector<double>()[0] == Approx(1.38));

  std::map<std::string, Tensor> saved;
  for (const auto& [k, t] : ema.state_dict()) saved[k] = t.clone();
  ema.set(model);
  CHECK(ema.state_dict().at("weight").to_vector<double>()[0] == Approx(3));
  ema.load_state_dict(saved);
  CHECK(ema.state_dict().at("weight").to_vector<double>()[0] == Approx(1.38));
  saved.erase("count");
  REQUIRE_THROWS_WITH(ema.load_state_dict(saved), Catch::Contains("missing tensor 'count'"));
  REQUIRE_THROWS_WITH(ModelEma(model, 1.5), Catch::Contains("decay must be in [0, 1]"));
}

TEST_CASE("optim: gradient utilities and EMA run on CUDA without leaving the device",
          "[cuda][optim]") {
  if (!test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  TensorList params = params_with_grads({{3, -4}, {0, 12}});
  for (Tensor& p : params) {
    Tensor d = p.detach().to(gpu).set_requires_grad(true);
    d.set_grad(p.grad().to(gpu));
    p = d;
  }
  const Tensor norm = clip_grad_norm(params, 6.5);
  CHECK(norm.device() == gpu);
  CHECK(norm.item() == Approx(13));
  CHECK(params[1].grad().to_vector<float>()[1] == Approx(6));
  const Tensor flag = grads_nonfinite(params);
  CHECK(flag.device() == gpu);
  CHECK(flag.item() == 0);
  params[0].grad().fill_(NAN);
  CHECK(grads_nonfinite(params).item() == 1);

  TinyModel model;
  model.to(gpu);
  ModelEma ema(model, 0.9);
  model.weight.fill_(3);
  ema.update(model);
  CHECK(ema.state_dict().at("weight").device() == gpu);
  CHECK(ema.state_dict().at("weight").to_vector<double>()[1] == Approx(2.1));
}
