// The training step decides on the device: a skipped update (non-finite loss or gradients)
// leaves the weights, the optimizer state (update counts included) and the EMA exactly as they
// were, so training with a poisoned batch equals training without it; the statistics read back
// count what happened; a diverging run stops with train.max_nonfinite_steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "backend/profiler.h"
#include "core/random.h"
#include "data/datasets/dataset.h"
#include "data/pipeline/loader.h"
#include "distributed/communicator.h"
#include "models/cait.h"
#include "models/model.h"
#include "ops/linear.h"
#include "optim/ema.h"
#include "optim/optimizer.h"
#include "support/test_util.h"
#include "train/evaluate.h"
#include "train/graph_step.h"
#include "train/train_step.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using Catch::Matchers::Contains;

namespace {

struct StepRun : test::TrainedState {
  std::map<std::string, Tensor> initial;  // the weights before the updates (run_dropout_steps)
};

StepRun step_run(const test::TrainedState& state) {
  StepRun r;
  static_cast<test::TrainedState&>(r) = state;
  return r;
}

// a and b hold the same weights, optimizer state and EMA, bit for bit (the first tensor that
// differs named).
void require_same_bits(const StepRun& a, const StepRun& b) {
  using Part = std::map<std::string, Tensor> StepRun::*;
  for (const Part part : {&StepRun::weights, &StepRun::optimizer, &StepRun::ema}) {
    std::string diff;
    const bool same = test::bitwise_equal(a.*part, b.*part, &diff);
    INFO("first differing tensor: " << diff);
    REQUIRE(same);
  }
}

// The training step of `model` on the CPU as the trainer runs it with one process: an EMA of decay
// 0.9, clipping at clip_grad, the update statistics; the model in training mode.
struct CpuSteps {
  CpuSteps(nn::Module& model, optim::Optimizer& optimizer, double clip_grad)
      : ema(model, 0.9),
        comm(dist::make_communicator(dist::World{}, Device::cpu())),
        train(with_clip(clip_grad)),
        step(model, optimizer, nullptr, &ema, *comm, train, DistributedOptions{}),
        stats(Device::cpu()) {
    model.train();
  }
  // One update on this batch at lr 2e-3.
  void update(const Tensor& images, const Tensor& labels) {
    stats.record(step.apply_update(step.micro_step(images, labels, true), 2e-3));
  }
  static TrainOptions with_clip(double clip_grad) {
    TrainOptions options;
    options.clip_grad = clip_grad;
    return options;
  }

  optim::ModelEma ema;
  std::unique_ptr<dist::Communicator> comm;
  TrainOptions train;
  TrainStep step;
  UpdateStats stats;
};

// Three updates of a tiny CSKA-ViT on fixed random batches; with `poison`, a batch of NaN
// images is stepped between the second and the third.
StepRun run_steps(const std::string& optimizer, bool poison, double clip_grad) {
  Config config = Config::parse(test::tiny_experiment_yaml(64, 64, 4, 1, 0.0));
  config.set("optim.name=" + optimizer);
  manual_seed(11);
  nn::ModulePtr model = models::build_model(config.root()["model"]);
  auto opt = optim::make_optimizer(optim::OptimizerOptions::from_config(config.root()["optim"]),
                                   model->named_parameters(true));
  CpuSteps steps(*model, *opt, clip_grad);
  const Tensor labels = Tensor::from_vector<int64_t>({1, 4, 7, 9}, {4}, DType::kI64);
  for (int i = 0; i < 4; ++i) {
    if (i == 2 && !poison) continue;
    Tensor images = test::uniform({4, 1, 28, 28}, 100 + i).to(DType::kF32);
    if (i == 2) images.fill_(std::numeric_limits<double>::quiet_NaN());
    steps.update(images, labels);
  }
  return step_run(test::trained_state(*model, *opt, steps.ema, steps.stats));
}

// Six updates of a tiny CaiT on the CPU (layer dropout p, no other dropout; AdamW with weight
// decay, an EMA, clipping at clip_grad), its layers drawn on the host or, with on_device, on the
// device (move_draws_to_device: what train.cuda_graph sets up). `dropped`: the layers the device
// draws left out over the six steps (on_device only).
StepRun run_cait_layer_dropout(bool on_device, double p, double clip_grad, int* dropped = nullptr) {
  const std::string yaml =
      "family: cait\nimage_size: 16\nin_channels: 1\nnum_classes: 4\ndim: 8\ndepth: 3\n"
      "cls_depth: 2\nheads: 2\nhead_dim: 4\nmlp_dim: 8\nmixer: cska\ndropout: 0\n"
      "emb_dropout: 0\nlayer_dropout: " +
      std::to_string(p) + "\n";
  manual_seed(13);
  nn::ModulePtr model = models::build_model(Config::parse(yaml).root());
  optim::OptimizerOptions options;
  options.weight_decay = 0.05;
  auto opt = optim::make_optimizer(options, model->named_parameters(true));
  if (on_device) {
    CHECK_THAT(move_draws_to_device(*model, *opt, Device::cpu()), Contains("layer_dropout"));
    CHECK(nn::host_draws_in_training(*model).empty());
  }
  CpuSteps steps(*model, *opt, clip_grad);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 3, 1, 2}, {4}, DType::kI64);
  for (int i = 0; i < 6; ++i) {
    steps.update(test::uniform({4, 1, 16, 16}, 200 + i).to(DType::kF32), labels);
    if (dropped == nullptr) continue;
    for (const auto& [name, module] : model->named_modules()) {
      if (auto* stack = dynamic_cast<models::CaitLayerStack*>(module)) {
        for (float kept : stack->kept_on_device().to_vector<float>()) *dropped += kept == 0.0f;
      }
    }
  }
  return step_run(test::trained_state(*model, *opt, steps.ema, steps.stats));
}

}  // namespace

TEST_CASE("CaiT's layer dropout drawn on the device trains as the host's draw does",
          "[cpu][train][optim]") {
  // The device's rule keeps the layers the host's keeps (the same generator here), a dropped
  // layer is multiplied out instead of skipped, and the optimizer's grad gates leave its
  // parameters alone: weights, EMA and every optimizer state the host's run has, bit for bit;
  // the device's run also holds zero state for parameters it has not stepped yet.
  for (const double p : {0.4, 0.9}) {
    for (const double clip : {0.0, 1.0}) {
      INFO("layer_dropout " << p << ", train.clip_grad " << clip);
      int dropped = 0;
      const StepRun host = run_cait_layer_dropout(false, p, clip);
      const StepRun device = run_cait_layer_dropout(true, p, clip, &dropped);
      CHECK(dropped > 0);
      std::string diff;
      CHECK(test::bitwise_equal(host.weights, device.weights, &diff));
      CHECK(test::bitwise_equal(host.ema, device.ema, &diff));
      INFO("first differing tensor: " << diff);
      for (const auto& [name, t] : device.optimizer) {
        INFO(name);
        if (host.optimizer.count(name) != 0) {
          CHECK(test::bitwise_equal(host.optimizer.at(name), t));
        } else {
          CHECK(test::bitwise_equal(t, Tensor::zeros(t.shape(), t.dtype())));
        }
      }
      CHECK(host.optimizer.size() <= device.optimizer.size());
      CHECK(host.stats.loss_sum == device.stats.loss_sum);
    }
  }
}

TEST_CASE("a skipped update changes nothing: training equals training without that batch",
          "[cpu][train][optim]") {
  for (const std::string optimizer : {"adamw", "lamb", "sgd"}) {
    for (double clip : {0.0, 1.0}) {
      INFO(optimizer << ", train.clip_grad " << clip);
      const StepRun clean = run_steps(optimizer, false, clip);
      const StepRun poisoned = run_steps(optimizer, true, clip);
      require_same_bits(clean, poisoned);
      if (optimizer != "sgd") {  // three applied updates, counted on the device
        for (const auto& [name, t] : poisoned.optimizer) {
          if (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0) {
            REQUIRE(t.item() == 3);
          }
        }
      }
      CHECK(clean.stats.applied == 3);
      CHECK(clean.stats.skipped == 0);
      CHECK(poisoned.stats.applied == 3);
      CHECK(poisoned.stats.skipped == 1);
      CHECK(poisoned.stats.longest_skip_run == 1);
      CHECK(poisoned.stats.loss_sum == clean.stats.loss_sum);
      CHECK(std::isfinite(clean.stats.loss_sum));
      CHECK(clean.stats.loss_sum > 0);
    }
  }
}

TEST_CASE("update statistics: windows, runs of skipped updates carried across reads",
          "[cpu][train]") {
  UpdateStats stats(Device::cpu());
  const Tensor ok = Tensor::zeros({}, DType::kU8), skip = Tensor::ones({}, DType::kU8);
  const auto outcome = [](double loss, const Tensor& flag) {
    return UpdateOutcome{Tensor::full({}, loss, DType::kF32), flag};
  };
  stats.record(outcome(2.0, ok));
  stats.record(outcome(NAN, skip));
  stats.record(outcome(NAN, skip));
  UpdateStats::Window w = stats.read();
  CHECK(w.loss_sum == 2.0);
  CHECK(w.applied == 1);
  CHECK(w.skipped == 2);
  CHECK(w.longest_skip_run == 2);
  stats.record(outcome(NAN, skip));  // the run goes on in the next window
  stats.record(outcome(0.5, ok));
  stats.record(outcome(NAN, skip));
  w = stats.read();
  CHECK(w.loss_sum == 0.5);
  CHECK(w.applied == 1);
  CHECK(w.skipped == 2);
  CHECK(w.longest_skip_run == 3);
  w = stats.read();  // nothing since
  CHECK(w.applied == 0);
  CHECK(w.skipped == 0);
  CHECK(w.loss_sum == 0.0);
}

TEST_CASE("the optimizers' update counts: saved, restored, validated", "[cpu][optim]") {
  Tensor p = Tensor::from_vector<float>({1, 2}, {2});
  p.set_requires_grad(true);
  optim::OptimizerOptions options;
  auto opt = optim::make_optimizer(options, optim::NamedTensors{{"p", p}});
  p.set_grad(Tensor::from_vector<float>({0.5, -0.5}, {2}));
  opt->step();
  opt->step(Tensor::ones({}, DType::kU8));  // skipped: the count stays
  opt->step(Tensor::zeros({}, DType::kU8));
  std::map<std::string, Tensor> state = opt->state_dict();
  CHECK(state.at("p.step").item() == 2);
  CHECK(state.at("p.step").dtype() == DType::kI64);
  CHECK(state.at("p.step").device() == Device::cpu());
  opt->step();  // the saved count is a copy, not the live one
  CHECK(state.at("p.step").item() == 2);
  auto fresh = optim::make_optimizer(options, optim::NamedTensors{{"p", p}});
  fresh->load_state_dict(state);
  CHECK(fresh->state_dict().at("p.step").item() == 2);
  state["p.step"] = Tensor::scalar(-1.0, DType::kI64);
  REQUIRE_THROWS_WITH(fresh->load_state_dict(state), Contains("p.step' is -1"));
  REQUIRE_THROWS_WITH(opt->step(Tensor::ones({2}, DType::kU8)),
                      Contains("skip must be one u8 element"));
}

TEST_CASE("a diverging run stops after train.max_nonfinite_steps skipped updates in a row",
          "[cpu][train]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // lr 1e30 sends the weights to ~1e30 in one update; every later loss is non-finite.
  Config config = Config::parse(test::tiny_experiment_yaml(256, 64, 8, 1, 0.0));
  config.set("optim.lr=1e30");
  config.set("train.clip_grad=0");
  config.set("train.max_nonfinite_steps=4");
  config.set("train.log_every=3");
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("diverge");
  Trainer trainer(config, setup);
  REQUIRE_THROWS_WITH(trainer.fit(), Contains("training diverged: ") &&
                                         Contains("consecutive updates with non-finite loss") &&
                                         Contains("train.max_nonfinite_steps = 4"));
  // Found at the first read with a run of 4 or more: step 6 (3 and 6 are the reads).
  CHECK(trainer.state().step == 6);
  CHECK(trainer.state().nonfinite_total >= 4);
}

TEST_CASE("a checkpoint whose world_size is not a number is an error naming it",
          "[cpu][train][hardening]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::string yaml = test::tiny_experiment_yaml(64, 32, 16, 1, 0.0);
  const std::string dir = test::train_scratch_dir("bad_world");
  test::train_until(yaml, 2, dir, "");
  const std::string checkpoint = resolve_checkpoint(dir);
  for (const std::string bad : {"abc", "99999999999999999999", "0"}) {
    TrainState state = read_train_state(checkpoint + "/train_state.bin");
    state.info["world_size"] = bad;
    write_train_state(checkpoint + "/train_state.bin", state);
    // Before: std::stoi threw std::invalid_argument / std::out_of_range (not an error of ours).
    REQUIRE_THROWS_WITH(test::train_until(yaml, 4, dir, dir),
                        Contains("world_size '" + bad + "' is not a number of workers") &&
                            Contains(checkpoint));
  }
}

namespace {

// How run_dropout_steps trains: f32, or under bf16 autocast with the parameters' casts and the
// linear layers' gradients as train.weight_casts and train.linear_grads say.
struct StepPrecision {
  bool bf16 = false;
  std::string weight_casts = "per_use";
  std::string linear_grads = "autocast";
};

// What run_dropout_steps does after its first two eager updates: three more (kEager); three
// replays of the step captured then (kReplays); or, with a grad-ready hook on the first parameter
// (the last gradient of the backward pass) reading a value back to the host, a capture tried by
// capture_step under train.cuda_graph `mode` and failing (on the CPU always, on CUDA in the
// backward pass, with most gradients written into the graph's memory), then three more eager
// updates (kFailedCapture; `warnings` collects what capture_step logged).
struct AfterTwo {
  enum Kind { kEager, kReplays, kFailedCapture } kind = kEager;
  std::string mode = "auto";
  std::vector<std::string>* warnings = nullptr;
};

// Five updates of a tiny ViT with dropout 0.2 on `gpu` (CUDA, or the CPU without a graph), as
// `after` says (the images are the captured step's fixed input buffer).
StepRun run_dropout_steps(Device gpu, const std::string& optimizer, const std::string& mixer,
                          const AfterTwo& after, const StepPrecision& precision = {}) {
  Config config = Config::parse(test::tiny_experiment_yaml(64, 64, 4, 1, 0.2));
  config.set("optim.name=" + optimizer);
  config.set("model.mixer.type=" + mixer);
  manual_seed(11);
  nn::ModulePtr model = models::build_model(config.root()["model"]);
  model->to(gpu);
  if (after.kind == AfterTwo::kFailedCapture) {
    model->named_parameters(true).front().second.register_grad_ready_hook(
        [](const Tensor& g) { (void)sum(g).item(); });
  }
  StepRun r;
  for (const auto& [name, t] : model->state_dict()) r.initial[name] = t.to(Device::cpu()).clone();
  auto opt = optim::make_optimizer(optim::OptimizerOptions::from_config(config.root()["optim"]),
                                   model->named_parameters(true));
  optim::ModelEma ema(*model, 0.9);
  auto comm = dist::make_communicator(dist::World{}, gpu);
  TrainOptions train;
  train.clip_grad = 1.0;
  if (precision.bf16) train.precision = Precision::kBF16;
  train.kernels.weight_casts = precision.weight_casts;
  train.kernels.linear_grads = precision.linear_grads;
  struct Restore {
    ~Restore() { set_linear_f32_grads(false); }
  } restore;
  set_linear_f32_grads(precision.linear_grads == "f32");
  TrainStep step(*model, *opt, nullptr, &ema, *comm, train, DistributedOptions{});
  UpdateStats stats(gpu);
  model->train();
  const Tensor images = test::uniform({4, 1, 28, 28}, 100).to(gpu, DType::kF32);
  const Tensor labels = Tensor::from_vector<int64_t>({1, 4, 7, 9}, {4}, DType::kI64).to(gpu);
  const std::function<void()> eager = [&] {
    stats.record(step.apply_update(step.micro_step(images, labels, true), 2e-3));
  };
  Generator& gen = default_generator(gpu);
  for (int i = 0; i < 2; ++i) eager();
  if (after.kind == AfterTwo::kReplays) {
    gen.begin_capture(gpu);
    DeviceGraph captured(gpu, eager);
    const CapturedDraws draws = gen.end_capture();
    for (int i = 0; i < 3; ++i) {
      gen.before_replay(draws);
      captured.replay();
    }
    synchronize(gpu);
  } else {
    if (after.kind == AfterTwo::kFailedCapture) {
      const auto graphed = capture_step(after.mode, step, *opt, stats, gen, images, labels, 2e-3,
                                        [&](const std::string& line) {
                                          if (after.warnings) after.warnings->push_back(line);
                                        });
      CHECK(graphed == nullptr);
    }
    for (int i = 0; i < 3; ++i) eager();
  }
  static_cast<test::TrainedState&>(r) = test::trained_state(*model, *opt, ema, stats);
  return r;
}

// A failed capture under auto leaves the run where five eager updates take it, bit for bit.
void check_failed_capture_falls_back(Device device) {
  const StepRun eager = run_dropout_steps(device, "adamw", "cska", {});
  std::vector<std::string> warnings;
  const StepRun fallen_back =
      run_dropout_steps(device, "adamw", "cska", {AfterTwo::kFailedCapture, "auto", &warnings});
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("train.cuda_graph: auto") && Contains("eager steps"));
  require_same_bits(eager, fallen_back);
  CHECK(eager.stats.applied == fallen_back.stats.applied);
  CHECK(eager.stats.loss_sum == fallen_back.stats.loss_sum);
  REQUIRE_THROWS_WITH(run_dropout_steps(device, "adamw", "cska", {AfterTwo::kFailedCapture, "on"}),
                      Contains("train.cuda_graph: on") && Contains("could not be captured"));
}

}  // namespace

TEST_CASE("train.cuda_graph: a failed capture is an error under on, eager steps under auto",
          "[cpu][train]") {
  // On the CPU every capture fails (a CUDA Graph needs CUDA) before the step runs.
  check_failed_capture_falls_back(Device::cpu());
}

TEST_CASE("train.cuda_graph on CUDA: a capture failing in the backward pass falls back exactly",
          "[cuda][train][graph]") {
  if (!test::cuda_available_or_skip()) return;
  check_failed_capture_falls_back(Device::cuda(0));
}

TEST_CASE("train.weight_casts: per_step trains to the bits of per_use, linear_grads: f32 close",
          "[cpu][train]") {
  // The multi_cast calls each run makes (one a micro-step with the casts up front).
  const auto multi_casts = [] {
    int64_t calls = 0;
    for (const profiler::KernelTime& k : profiler::stop()) {
      if (k.name == "multi_cast") calls += k.calls;
    }
    return calls;
  };
  profiler::start();
  const StepRun per_use = run_dropout_steps(Device::cpu(), "adamw", "cska", {}, {true});
  CHECK(multi_casts() == 0);
  profiler::start();
  const StepRun per_step =
      run_dropout_steps(Device::cpu(), "adamw", "cska", {}, {true, "per_step", "autocast"});
  CHECK(multi_casts() == 5);
  require_same_bits(per_use, per_step);
  // The linear layers' weight gradients in f32 (not rounded to bf16): not the same bits, but
  // the five updates move the weights the same way (Adam's steps are about lr each, so compare
  // the directions: cosine of the two changes over every weight).
  const StepRun f32 =
      run_dropout_steps(Device::cpu(), "adamw", "cska", {}, {true, "per_step", "f32"});
  std::string diff;
  CHECK_FALSE(test::bitwise_equal(per_use.weights, f32.weights, &diff));
  double dot = 0.0, a2 = 0.0, b2 = 0.0;
  for (const auto& [name, w] : per_use.weights) {
    const std::vector<double> init = per_use.initial.at(name).to_vector<double>();
    const std::vector<double> a = w.to_vector<double>(),
                              b = f32.weights.at(name).to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) {
      dot += (a[i] - init[i]) * (b[i] - init[i]);
      a2 += (a[i] - init[i]) * (a[i] - init[i]);
      b2 += (b[i] - init[i]) * (b[i] - init[i]);
    }
  }
  REQUIRE(a2 > 0.0);
  CHECK(dot / std::sqrt(a2 * b2) > 0.9999);  // 0.9999987 on the CPU (2026-11-27)
}

namespace {

// One bf16 evaluation of the tiny CSKA-ViT (depth 2, so that two blocks read their own weights)
// over 230 random images in batches of 50 (the last one partial), on `device`, with the
// parameters cast per use or once for the pass; `multi_casts` and `copies` count the kernel
// calls it made.
struct EvalRun {
  EvalSums sums;
  int64_t multi_casts = 0, copies = 0;
};
EvalRun evaluate_tiny(Device device, bool cast_params_once) {
  Config config = Config::parse(test::tiny_experiment_yaml(64, 64, 4, 1, 0.1));
  config.set("model.depth=2");
  manual_seed(5);
  nn::ModulePtr model = models::build_model(config.root()["model"]);
  model->to(device);
  model->train();  // evaluation switches to eval mode (no dropout) and back
  manual_seed(6);
  const Tensor images = (test::uniform({230, 28, 28, 1}, 21, 0.0, 255.0)).to(DType::kU8);
  std::vector<int64_t> labels(230);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
  const data::InMemoryDataset set("random", images, Tensor::from_vector(labels, {230}), 10);
  data::LoaderOptions lo;
  lo.batch_size = 50;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.workers = 0;
  lo.mean = {0.5};
  lo.std = {0.25};
  data::DataLoader loader(set, lo);
  profiler::start();
  EvalRun r;
  r.sums =
      evaluate_sums(*model, loader, device, {AutocastState{true, DType::kBF16}, cast_params_once});
  for (const profiler::KernelTime& k : profiler::stop()) {
    if (k.name == "multi_cast") r.multi_casts += k.calls;
    if (k.name == "copy") r.copies += k.calls;
  }
  REQUIRE(model->is_training());
  return r;
}

void check_eval_casts_once(Device device) {
  // CSKA's logits as the convolution: under conv_logits auto, the first call of a shape times
  // each form (with cudnn_benchmark on, as an earlier test may have left it), which would add
  // kernels to whichever pass met that shape first.
  KernelChoices choices;
  choices.conv_logits = "conv";
  choices.apply();
  const EvalRun per_use = evaluate_tiny(device, false);
  const EvalRun once = evaluate_tiny(device, true);
  KernelChoices{}.apply();
  REQUIRE(per_use.sums.count == 230);
  CHECK(once.sums.count == 230);
  // The same logits, so the same sums to the bit.
  CHECK(once.sums.loss_sum == per_use.sums.loss_sum);
  CHECK(once.sums.top1 == per_use.sums.top1);
  CHECK(once.sums.top5 == per_use.sums.top5);
  CHECK(per_use.multi_casts == 0);
  CHECK(once.multi_casts == 1);  // one call for the pass, not one a batch
  // Per use, each of the 5 batches casts every weight and bias it reads (20 on the CPU: the
  // difference was 250 - 150 on 2026-11-27); once, none of them.
  INFO("copy kernels: per use " << per_use.copies << ", once " << once.copies);
  CHECK(per_use.copies - once.copies >= 5 * 8);
  CHECK((per_use.copies - once.copies) % 5 == 0);
}

}  // namespace

TEST_CASE("evaluation with the parameters cast once a pass: the sums of per-use casts",
          "[cpu][train][amp]") {
  check_eval_casts_once(Device::cpu());
}

TEST_CASE("evaluation with the parameters cast once a pass: the same on CUDA",
          "[cuda][train][amp]") {
  if (!test::cuda_available_or_skip()) return;
  check_eval_casts_once(Device::cuda(0));
}

TEST_CASE("CUDA Graph: replays of the captured training step equal eager steps bit for bit",
          "[cuda][train]") {
  if (!test::cuda_available_or_skip()) return;
  struct Case {
    std::string optimizer, mixer;
    bool bf16;
  };
  for (const Case& c : std::vector<Case>{{"adamw", "cska", false},
                                         {"lamb", "cska", false},
                                         {"sgd", "cska", false},
                                         {"adamw", "mhsa", false},
                                         {"adamw", "cska", true}}) {
    INFO(c.optimizer << ", " << c.mixer << (c.bf16 ? ", bf16 autocast, casts per step" : ""));
    // bf16: the parameters cast up front and the linear layers' gradients written in f32.
    const StepPrecision precision{c.bf16, c.bf16 ? "per_step" : "per_use",
                                  c.bf16 ? "f32" : "autocast"};
    const StepRun eager = run_dropout_steps(Device::cuda(0), c.optimizer, c.mixer, {}, precision);
    const StepRun replayed =
        run_dropout_steps(Device::cuda(0), c.optimizer, c.mixer, {AfterTwo::kReplays}, precision);
    require_same_bits(eager, replayed);
    CHECK(eager.stats.applied == replayed.stats.applied);
    CHECK(eager.stats.loss_sum == replayed.stats.loss_sum);
  }
}

TEST_CASE("evaluation counts NaN logits as misses, ranking as torch.topk does", "[cpu][train]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto hits = [](std::vector<float> row, int64_t label) {
    int64_t top1 = 0, top5 = 0;
    count_hits(row.data(), static_cast<int64_t>(row.size()), label, top1, top5);
    return std::make_pair(top1, top5);
  };
  using P = std::pair<int64_t, int64_t>;
  CHECK(hits({0.1f, 0.9f, 0.3f}, 1) == P{1, 1});
  CHECK(hits({0.1f, 0.9f, 0.3f}, 2) == P{0, 1});
  CHECK(hits({0.5f, 0.5f, 0.1f}, 0) == P{1, 1});  // ties: the lower index first
  CHECK(hits({0.5f, 0.5f, 0.1f}, 1) == P{0, 1});
  // A diverged model: every logit NaN, or the label's. A miss for any label (the old counting
  // ranked nothing above a NaN and scored such a row 100%).
  for (int64_t label = 0; label < 3; ++label) CHECK(hits({nan, nan, nan}, label) == P{0, 0});
  CHECK(hits({0.1f, nan, 0.3f}, 1) == P{0, 0});
  // NaN elsewhere ranks above the label (torch.topk puts NaN first).
  CHECK(hits({nan, 0.9f, 0.3f}, 1) == P{0, 1});
  CHECK(hits({nan, nan, nan, nan, nan, 1.0f}, 5) == P{0, 0});
  CHECK(hits({nan, nan, nan, nan, 2.0f, 1.0f}, 5) == P{0, 0});
  CHECK(hits({nan, nan, nan, 3.0f, 2.0f, 1.0f}, 5) == P{0, 0});
  CHECK(hits({nan, nan, nan, 3.0f, 0.0f, 1.0f}, 5) == P{0, 1});
  // Infinities rank as numbers.
  CHECK(hits({inf, 0.9f, -inf}, 0) == P{1, 1});
  CHECK(hits({inf, 0.9f, -inf}, 2) == P{0, 1});
}
