// Mixed precision and EMA evaluation in the trainer: bf16 / fp16 runs on the CPU (emulated
// 16-bit math) against fp32, the loss scaler's state in checkpoints and exact fp16 resume,
// version-1 training states, and the EMA's evaluation columns in summary.csv.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/device_runtime.h"
#include "core/precision.h"
#include "core/random.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "support/test_util.h"
#include "train/graph_step.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct Run {
  TrainResult result;
  std::map<std::string, Tensor> weights;
  std::vector<std::string> log;
  std::string dir;
};

// Trains the tiny CSKA-ViT (256 images, batch 32: 8 updates per epoch; 100 test images) with
// `sets` applied.
Run train_tiny(const std::vector<std::string>& sets, const std::string& dir = "",
               const std::string& resume = "", int64_t epochs = 1,
               Device device = Device::cpu()) {
  Config config = Config::parse(test::tiny_experiment_yaml(256, 100, 32, epochs, 0.1));
  for (const std::string& s : sets) config.set(s);
  Run run;
  run.dir = dir.empty() ? test::train_scratch_dir("precision") : dir;
  TrainerSetup setup;
  setup.run_dir = run.dir;
  setup.resume = resume;
  setup.device = device;
  setup.log = [&](const std::string& line) { run.log.push_back(line); };
  Trainer trainer(config, setup);
  run.result = trainer.fit();
  run.weights = trainer.model().state_dict();
  return run;
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

// The largest |a - b| over every tensor of two state dicts with the same names.
double max_abs_diff(const std::map<std::string, Tensor>& a,
                    const std::map<std::string, Tensor>& b) {
  double worst = 0.0;
  for (const auto& [name, t] : a) {
    const std::vector<double> x = t.to_vector<double>(), y = b.at(name).to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  }
  return worst;
}

// Runs `validate` with `args` and returns what it printed ("" when it failed).
std::string run_validate(const std::string& args, const std::string& dir) {
  const std::string out = dir + "/validate_stdout.txt";
  const int status = std::system((std::string(SKA_VALIDATE_EXE) + " " + args + " >" + out +
                                  " 2>" + dir + "/validate_stderr.txt")
                                     .c_str());
  if (status != 0) return "";
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The top-1 and loss of `validate --json` output ({..., "top1": X, ..., "loss": L}).
std::pair<double, double> top1_and_loss(const std::string& json) {
  const auto number_after = [&](const std::string& key) {
    const size_t at = json.find("\"" + key + "\":");
    return at == std::string::npos ? -1.0 : std::strtod(json.c_str() + at + key.size() + 3, nullptr);
  };
  return {number_after("top1"), number_after("loss")};
}

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("train.precision must be fp32, bf16 or fp16", "[cpu][train][amp]") {
  Config config = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  config.set("train.precision=fp8");
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("precision_bad");
  REQUIRE_THROWS_WITH(Trainer(config, setup),
                      Contains("train.precision") && Contains("fp8") && Contains("bf16"));
}

TEST_CASE("bf16 and fp16 training on the CPU track fp32 and keep f32 master weights",
          "[cpu][train][amp][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const Run fp32 = train_tiny({});
  const Run bf16 = train_tiny({"train.precision=bf16"});
  const Run fp16 = train_tiny({"train.precision=fp16"});
  REQUIRE(mentions(bf16.log, "autocast to bf16 with f32 master weights"));
  REQUIRE(mentions(fp16.log, "dynamic loss scaling"));
  for (const Run* r : {&bf16, &fp16}) {
    REQUIRE(r->result.steps == 8);
    REQUIRE(r->result.final_eval.count == 100);
    REQUIRE(std::isfinite(r->result.final_eval.loss));
    for (const auto& [name, t] : r->weights) {
      INFO(name);
      REQUIRE(t.dtype() == DType::kF32);
    }
  }
  // 16-bit rounding changes the trajectory a little (so autocast did act), but not much: after
  // 8 AdamW steps of lr 3e-3 (each moving a weight by up to 3e-3) every weight is within 0.01 of
  // the fp32 run's.
  const double bf16_diff = max_abs_diff(bf16.weights, fp32.weights);
  const double fp16_diff = max_abs_diff(fp16.weights, fp32.weights);
  INFO("max |w - w_fp32|: bf16 " << bf16_diff << ", fp16 " << fp16_diff);
  CHECK(bf16_diff > 0.0);
  CHECK(fp16_diff > 0.0);
  CHECK(bf16_diff < 0.01);
  CHECK(fp16_diff < 0.01);
  CHECK(std::abs(bf16.result.final_eval.loss - fp32.result.final_eval.loss) < 0.05);
  CHECK(std::abs(fp16.result.final_eval.loss - fp32.result.final_eval.loss) < 0.05);

  // The fp16 run's checkpoint holds the scaler: 8 finite steps at the initial scale.
  const Checkpoint c = load_checkpoint(resolve_checkpoint(fp16.dir));
  CHECK(c.state.loss_scale == 65536.0);
  CHECK(c.state.loss_scale_growth_tracker == 8);
  CHECK(c.state.info.at("precision") == "fp16");
  const Checkpoint c32 = load_checkpoint(resolve_checkpoint(fp32.dir));
  CHECK(c32.state.loss_scale == 1.0);
  CHECK(c32.state.info.at("precision") == "fp32");
}

TEST_CASE("fp16 resume after k steps is bit-identical to straight training, scaler included",
          "[cpu][train][amp][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::vector<std::string> sets = {"train.precision=fp16", "train.ema_decay=0.9",
                                         "train.max_steps=12"};
  const Run straight = train_tiny(sets, "", "", 2);
  const std::string split_dir = test::train_scratch_dir("precision_split");
  // k = 5 stops mid-epoch; 2k - 2 = 12 crosses the epoch boundary and its (EMA) evaluation.
  train_tiny({"train.precision=fp16", "train.ema_decay=0.9", "train.max_steps=5"}, split_dir, "",
             2);
  const Run resumed = train_tiny(sets, split_dir, split_dir, 2);
  std::string diff;
  INFO("first differing tensor: " << diff);
  REQUIRE(test::bitwise_equal(straight.weights, resumed.weights, &diff));
  const Checkpoint a = load_checkpoint(resolve_checkpoint(straight.dir));
  const Checkpoint b = load_checkpoint(resolve_checkpoint(split_dir));
  REQUIRE(test::bitwise_equal(a.ema, b.ema, &diff));
  REQUIRE(test::bitwise_equal(a.state.optimizer, b.state.optimizer, &diff));
  CHECK(a.state.loss_scale == b.state.loss_scale);
  CHECK(a.state.loss_scale_growth_tracker == 12);
  CHECK(b.state.loss_scale_growth_tracker == 12);
  CHECK(a.state.best_ema_top1 == b.state.best_ema_top1);
}

TEST_CASE("EMA weights are evaluated every epoch and written beside the model's",
          "[cpu][train][amp][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const Run r = train_tiny({"train.ema_decay=0.9"}, "", "", 2);
  const auto rows = read_csv(r.dir + "/summary.csv");
  REQUIRE(rows.size() == 3);
  REQUIRE(rows[0] == std::vector<std::string>{"epoch", "train_loss", "eval_loss", "eval_top1",
                                              "eval_top5", "lr", "ema_eval_loss", "ema_eval_top1",
                                              "ema_eval_top5"});
  for (size_t i = 1; i < rows.size(); ++i) {
    INFO("epoch row " << i);
    REQUIRE(rows[i].size() == 9);
    const double loss = std::stod(rows[i][2]), ema_loss = std::stod(rows[i][6]);
    const double ema_top1 = std::stod(rows[i][7]), ema_top5 = std::stod(rows[i][8]);
    CHECK(std::isfinite(ema_loss));
    CHECK(ema_loss != loss);  // different weights, different numbers
    CHECK(ema_loss > 0.5);    // a cross-entropy over 10 classes, early in training
    CHECK(ema_top5 >= ema_top1);
  }
  REQUIRE(r.result.final_ema_eval.count == 100);
  CHECK(r.result.final_ema_eval.loss == Approx(std::stod(rows[2][6])).epsilon(1e-5));
  CHECK(r.result.best_ema_top1 >= r.result.final_ema_eval.top1);
  CHECK(r.result.best_ema_epoch >= 0);
  REQUIRE(mentions(r.log, "| EMA eval_loss"));
  // metrics.jsonl carries them too.
  std::ifstream jsonl(r.dir + "/metrics.jsonl");
  int with_ema = 0;
  for (std::string line; std::getline(jsonl, line);) {
    with_ema += line.find("\"ema_eval_top1\"") != std::string::npos;
  }
  CHECK(with_ema == 2);

  // Without EMA the columns are the old ones.
  const Run plain = train_tiny({"train.max_steps=2"});
  REQUIRE(read_csv(plain.dir + "/summary.csv")[0].size() == 6);
}

TEST_CASE("version-1 training states still load (no loss scaler then)", "[cpu][train][amp]") {
  // A version-1 file as the previous build wrote it: the header without the scaler's tracker and
  // the EMA's best, no tensors, FNV-1a checksum.
  const std::string header =
      R"({"batch":3,"best_epoch":0,"best_top1":12.5,"epoch":1,"info":{"optimizer":"adamw"},)"
      R"("loss_scale":1.0,"lr":0.001,"nonfinite_total":0,"rngs":{"cpu":{"offset":9,"seed":4}},)"
      R"("step":19,"steps_per_epoch":16})";
  std::string bytes = "SKATRAIN";
  auto put = [&](auto v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{1});
  put(uint32_t{0});
  put(uint64_t{header.size()});
  bytes += header;
  put(uint64_t{0});
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : bytes) {
    h ^= static_cast<uint8_t>(ch);
    h *= 0x100000001b3ull;
  }
  put(h);
  const std::string path = test::train_scratch_dir("v1") + "/train_state.bin";
  std::ofstream(path, std::ios::binary) << bytes;
  const TrainState s = read_train_state(path);
  CHECK(s.step == 19);
  CHECK(s.best_top1 == 12.5);
  CHECK(s.loss_scale == 1.0);
  CHECK(s.loss_scale_growth_tracker == 0);
  CHECK(s.best_ema_top1 == -1.0);
  CHECK(s.rngs.at("cpu").offset == 9);
  // A version-2 file round-trips the new fields.
  TrainState t = s;
  t.loss_scale = 8192.0;
  t.loss_scale_growth_tracker = 77;
  t.best_ema_top1 = 55.5;
  t.best_ema_epoch = 4;
  write_train_state(path, t);
  const TrainState u = read_train_state(path);
  CHECK(u.loss_scale == 8192.0);
  CHECK(u.loss_scale_growth_tracker == 77);
  CHECK(u.best_ema_top1 == 55.5);
  CHECK(u.best_ema_epoch == 4);
}

TEST_CASE("validate reproduces the trainer's bf16 evaluation, EMA included",
          "[cpu][train][amp][apps][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const Run r = train_tiny({"train.precision=bf16", "train.ema_decay=0.9"});
  REQUIRE(r.result.final_eval.count == 100);
  // The run folder's config.yaml is the resolved config; validate takes it and the run folder.
  const std::string common = "--json --config " + r.dir + "/config.yaml --checkpoint " + r.dir;
  const auto [top1, loss] = top1_and_loss(run_validate(common, r.dir));
  CHECK(top1 == Approx(r.result.final_eval.top1).margin(1e-9));
  CHECK(loss == Approx(r.result.final_eval.loss).margin(1e-9));
  const auto [ema_top1, ema_loss] = top1_and_loss(run_validate(common + " --ema", r.dir));
  CHECK(ema_top1 == Approx(r.result.final_ema_eval.top1).margin(1e-9));
  CHECK(ema_loss == Approx(r.result.final_ema_eval.loss).margin(1e-9));
  // In fp32 the figures move (the trainer evaluated under bf16 autocast).
  const auto [fp32_top1, fp32_loss] =
      top1_and_loss(run_validate(common + " --set train.precision=fp32", r.dir));
  CHECK(fp32_top1 >= 0);
  CHECK(fp32_loss > 0);
  CHECK(std::abs(fp32_loss - r.result.final_eval.loss) > 1e-6);
}

TEST_CASE("train.cuda_graph: where the step can be captured, and the choices", "[cpu][train]") {
  TrainOptions t;
  CHECK(cuda_graph_obstacle(Device::cpu(), 1, "single", t, "") == "it needs a CUDA device");
  CHECK(cuda_graph_obstacle(Device::cuda(0), 1, "single", t, "").empty());
  CHECK_THAT(cuda_graph_obstacle(Device::cuda(0), 2, "single", t, ""), Contains("one worker only"));
  t.accumulate = 2;
  CHECK_THAT(cuda_graph_obstacle(Device::cuda(0), 1, "single", t, ""),
             Contains("train.accumulate"));
  t.accumulate = 1;
  t.precision = Precision::kFP16;
  CHECK_THAT(cuda_graph_obstacle(Device::cuda(0), 1, "single", t, ""), Contains("use bf16"));
  t.precision = Precision::kBF16;
  CHECK(cuda_graph_obstacle(Device::cuda(0), 1, "single", t, "").empty());

  Config config = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  config.set("train.cuda_graph=yes");
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("cuda_graph_bad");
  REQUIRE_THROWS_WITH(Trainer(config, setup), Contains("train.cuda_graph") && Contains("yes") &&
                                                  Contains("auto"));
}

TEST_CASE("train.cudnn_benchmark: a boolean, on by default", "[cpu][train]") {
  CHECK(TrainOptions{}.kernels.cudnn_benchmark);
  Config off = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  off.set("train.cudnn_benchmark=false");
  CHECK_FALSE(TrainOptions::from_config(off.root()["train"]).kernels.cudnn_benchmark);
  Config bad = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  bad.set("train.cudnn_benchmark=fastest");
  REQUIRE_THROWS_WITH(TrainOptions::from_config(bad.root()["train"]),
                      Contains("train.cudnn_benchmark") && Contains("fastest"));
}

TEST_CASE("train.cudnn_deterministic: a boolean, off by default, applied process-wide",
          "[cpu][train]") {
  CHECK_FALSE(TrainOptions{}.kernels.cudnn_deterministic);
  Config on = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  on.set("train.cudnn_deterministic=true");
  const KernelChoices k = TrainOptions::from_config(on.root()["train"]).kernels;
  CHECK(k.cudnn_deterministic);
  CHECK_THAT(k.describe(), Contains("[deterministic cuDNN]"));
  k.apply();
  CHECK(cudnn_deterministic());
  KernelChoices{}.apply();
  CHECK_FALSE(cudnn_deterministic());
  Config bad = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  bad.set("train.cudnn_deterministic=always");
  REQUIRE_THROWS_WITH(TrainOptions::from_config(bad.root()["train"]),
                      Contains("train.cudnn_deterministic") && Contains("always"));
}

TEST_CASE("train.attention, train.elementwise, train.norm_output: the kernels' fast paths",
          "[cpu][train]") {
  const KernelChoices defaults;
  CHECK(defaults.attention == "fused");
  CHECK(defaults.attention_backward == "one_block");
  CHECK(defaults.attention_forward == "one_block");
  CHECK(defaults.attention_registers == "compiler");
  CHECK(defaults.attention_schedule == "per_head");
  CHECK(defaults.elementwise == "fast");
  CHECK(defaults.norm_output == "autocast");
  CHECK(defaults.residual_norm == "fused");
  CHECK(defaults.gelu_dropout == "fused");
  CHECK(defaults.dropout_add == "fused");
  CHECK(defaults.talking_heads == "unfused");
  CHECK(defaults.conv_logits == "auto");
  CHECK(defaults.conv_logits_grad_w == "per_tap");
  CHECK(defaults.depthwise_conv == "auto");
  CHECK(defaults.describe().empty());
  Config config = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  config.set("train.attention=scalar");
  config.set("train.attention_backward=split");
  config.set("train.attention_forward=tiled");
  config.set("train.attention_registers=capped");
  config.set("train.attention_schedule=persistent");
  config.set("train.elementwise=reference");
  config.set("train.norm_output=f32");
  config.set("train.residual_norm=unfused");
  config.set("train.gelu_dropout=unfused");
  config.set("train.dropout_add=unfused");
  config.set("train.talking_heads=fused");
  config.set("train.conv_logits=conv");
  config.set("train.conv_logits_grad_w=per_row");
  config.set("train.depthwise_conv=direct");
  const KernelChoices k = TrainOptions::from_config(config.root()["train"]).kernels;
  CHECK(k.describe() ==
        " [attention: scalar] [attention_backward: split] [attention_forward: tiled]"
        " [attention_registers: capped] [attention_schedule: persistent]"
        " [elementwise: reference] [norm_output: f32] "
        "[residual_norm: unfused]"
        " [gelu_dropout: unfused] [dropout_add: unfused] [talking_heads: fused]"
        " [conv_logits: conv] [conv_logits_grad_w: per_row] [depthwise_conv: direct]");
  // apply() sets the process-wide switches (each setter returns the previous setting).
  k.apply();
  CHECK(nn::conv_logits_form() == nn::ConvLogitsForm::kConv);
  CHECK(nn::fused_attention_enabled());
  CHECK_FALSE(nn::norm_autocast_outputs_enabled());
  CHECK_FALSE(nn::fused_residual_norm_enabled());
  CHECK_FALSE(nn::fused_gelu_dropout_enabled());
  CHECK_FALSE(nn::fused_dropout_add_enabled());
  CHECK(nn::fused_talking_heads_enabled());
  CHECK_FALSE(set_cuda_attention_tensor_cores(true));
  CHECK_FALSE(set_cuda_elementwise_fast_paths(true));
  CHECK_FALSE(set_cuda_attention_one_block_backward(true));
  CHECK_FALSE(set_cuda_attention_one_pass_backward(false));
  CHECK_FALSE(set_cuda_attention_one_block_forward(true));
  CHECK(set_cuda_attention_register_cap(true));
  CHECK(set_cuda_attention_persistent(true));
  CHECK(set_cuda_conv_logits_grad_w_rows(true));
  CHECK(set_cuda_depthwise_conv(DepthwiseConv::kDirect) == DepthwiseConv::kDirect);
  KernelChoices one_pass;
  one_pass.attention_backward = "one_pass";
  one_pass.apply();
  CHECK(set_cuda_attention_one_pass_backward(true));
  CHECK(set_cuda_attention_one_block_backward(true));
  KernelChoices timed;
  timed.depthwise_conv = "auto";
  timed.apply();
  CHECK(set_cuda_depthwise_conv(DepthwiseConv::kTimed) == DepthwiseConv::kTimed);
  KernelChoices unfused;
  unfused.attention = "unfused";
  unfused.apply();
  CHECK_FALSE(nn::fused_attention_enabled());
  Config old_name = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  old_name.set("train.attention=mma");  // the mma.sync kernels' name before they were the default
  CHECK(TrainOptions::from_config(old_name.root()["train"]).kernels.attention == "fused");
  KernelChoices wmma;
  wmma.attention = "wmma";
  wmma.apply();
  CHECK(nn::fused_attention_enabled());
  CHECK_FALSE(set_cuda_attention_mma(false));
  CHECK(set_cuda_attention_tensor_cores(true));
  KernelChoices gemm;
  gemm.conv_logits = "gemm";
  gemm.apply();
  CHECK(nn::conv_logits_form() == nn::ConvLogitsForm::kGemm);
  defaults.apply();
  CHECK(nn::conv_logits_form() == nn::ConvLogitsForm::kAuto);
  CHECK(nn::fused_attention_enabled());
  CHECK(nn::norm_autocast_outputs_enabled());
  CHECK(nn::fused_residual_norm_enabled());
  CHECK(nn::fused_gelu_dropout_enabled());
  CHECK(nn::fused_dropout_add_enabled());
  CHECK_FALSE(nn::fused_talking_heads_enabled());
  CHECK(set_cuda_attention_mma(true));
  CHECK(set_cuda_attention_one_block_backward(true));
  CHECK_FALSE(set_cuda_attention_one_pass_backward(false));
  CHECK(set_cuda_attention_one_block_forward(true));
  CHECK_FALSE(set_cuda_attention_register_cap(false));
  CHECK_FALSE(set_cuda_attention_persistent(false));
  CHECK(set_cuda_attention_tensor_cores(true));
  CHECK(set_cuda_elementwise_fast_paths(true));
  CHECK(set_cuda_depthwise_conv(DepthwiseConv::kTimed) == DepthwiseConv::kTimed);
  // A value outside the choices names the key and the choices.
  Config bad = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  bad.set("train.attention=flash");
  REQUIRE_THROWS_WITH(TrainOptions::from_config(bad.root()["train"]),
                      Contains("train.attention") && Contains("flash") && Contains("unfused"));
  Config bad_depthwise = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  bad_depthwise.set("train.depthwise_conv=native");
  REQUIRE_THROWS_WITH(TrainOptions::from_config(bad_depthwise.root()["train"]),
                      Contains("train.depthwise_conv") && Contains("native") && Contains("direct"));
}

TEST_CASE("train's kernel choices: every key reads every value it lists, and nothing else",
          "[cpu][train]") {
  const KernelChoices defaults;
  std::set<std::string> keys;
  for (const KernelChoiceSpec& spec : kernel_choice_specs()) {
    INFO("train." << spec.key);
    CHECK(keys.insert(spec.key).second);
    const std::string& default_value = defaults.*spec.member;
    CHECK(std::find(spec.values.begin(), spec.values.end(), default_value) != spec.values.end());
    CHECK(std::string(spec.help).find(default_value) != std::string::npos);
    for (const std::string& value : spec.values) {
      Config config = Config::parse("train: {epochs: 1}\n");
      config.set(std::string("train.") + spec.key + "=" + value);
      const KernelChoices k = TrainOptions::from_config(config.root()["train"]).kernels;
      CHECK(k.*spec.member == value);
      // Only this member moved, and the status line names it.
      for (const KernelChoiceSpec& other : kernel_choice_specs()) {
        if (other.member != spec.member) CHECK(k.*other.member == defaults.*other.member);
      }
      const std::string tag = std::string(" [") + spec.key + ": " + value + "]";
      CHECK(k.describe() == (value == default_value ? std::string() : tag));
    }
    Config bad = Config::parse("train: {epochs: 1}\n");
    bad.set(std::string("train.") + spec.key + "=nonsense");
    REQUIRE_THROWS_WITH(TrainOptions::from_config(bad.root()["train"]),
                        Contains(std::string("train.") + spec.key) && Contains("nonsense") &&
                            Contains(spec.values.back()));
  }
  CHECK(keys.size() == 21);
  // A status line names only what can change the run: CUDA-only choices not on the CPU, training
  // ones not in evaluation, autocast ones not in f32.
  KernelChoices some;
  some.attention_loads = "sync";   // CUDA only
  some.gelu_dropout = "unfused";   // training only
  some.weight_casts = "per_step";  // autocast only
  some.attention = "unfused";      // anywhere
  some.cudnn_benchmark = false;    // CUDA only
  CHECK(some.describe() ==
        " [attention: unfused] [attention_loads: sync] [gelu_dropout: unfused] [weight_casts: "
        "per_step] [cuDNN heuristics]");
  CHECK(some.describe({false, true, true}) ==
        " [attention: unfused] [gelu_dropout: unfused] [weight_casts: per_step]");
  CHECK(some.describe({true, false, true}) ==
        " [attention: unfused] [attention_loads: sync] [weight_casts: per_step] [cuDNN "
        "heuristics]");
  CHECK(some.describe({false, false, false}) == " [attention: unfused]");
  // The two switches that were benchmark flags only are train keys too, applied process-wide.
  KernelChoices k;
  k.norm_backward = "split";
  k.norm_forward = "held";
  k.attention_loads = "sync";
  k.projections = "stacked";
  k.apply();
  CHECK(nn::stacked_projections_enabled());
  CHECK_FALSE(set_cuda_layer_norm_fused_backward(true));
  CHECK(set_cuda_layer_norm_held_forward(false));
  CHECK_FALSE(set_cuda_attention_async_loads(true));
  defaults.apply();
  CHECK_FALSE(nn::stacked_projections_enabled());
  CHECK(set_cuda_layer_norm_fused_backward(true));
  CHECK_FALSE(set_cuda_layer_norm_held_forward(false));
  CHECK(set_cuda_attention_async_loads(true));
}

TEST_CASE("train.attention=unfused trains the tiny CSKA-ViT to the fused run's weights",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const Run fused = train_tiny({});
  const Run unfused = train_tiny({"train.attention=unfused"});
  KernelChoices{}.apply();  // the switches are process-wide: back to the defaults
  CHECK(mentions(unfused.log, "kernels (train.KEY: value): [attention: unfused]"));
  CHECK_FALSE(mentions(fused.log, "kernels ("));
  // The same math, rounded in another order (so not the same bits: the other path did run): 8
  // AdamW updates later the weights still agree.
  std::string diff;
  CHECK_FALSE(test::bitwise_equal(fused.weights, unfused.weights, &diff));
  for (const auto& [name, w] : fused.weights) {
    INFO(name);
    test::require_close(unfused.weights.at(name), w, test::tolerance_for(DType::kF32), name);
  }
}

TEST_CASE("train.cuda_graph on the CPU: on is an error, auto trains eagerly like off",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  REQUIRE_THROWS_WITH(train_tiny({"train.cuda_graph=on"}),
                      Contains("train.cuda_graph: on, but it needs a CUDA device"));
  const Run off = train_tiny({});
  const Run autoed = train_tiny({"train.cuda_graph=auto"});
  CHECK(mentions(autoed.log, "train.cuda_graph: auto: eager steps (it needs a CUDA device)"));
  std::string diff;
  INFO("first differing tensor: " << diff);
  CHECK(test::bitwise_equal(off.weights, autoed.weights, &diff));
}

TEST_CASE("train.cuda_graph: on trains to the same weights as eager steps", "[cuda][train]") {
  if (!ska::test::cuda_available_or_skip()) return;
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // 8 updates with dropout 0.1: 3 eager, then the capture and 5 replays.
  const Run eager = train_tiny({}, "", "", 1, Device::cuda(0));
  const Run graphed = train_tiny({"train.cuda_graph=on"}, "", "", 1, Device::cuda(0));
  CHECK(mentions(graphed.log, "train.cuda_graph: captured the training step at update 4"));
  CHECK(graphed.result.steps == eager.result.steps);
  std::string diff;
  INFO("first differing tensor: " << diff);
  CHECK(test::bitwise_equal(eager.weights, graphed.weights, &diff));
  CHECK(graphed.result.final_eval.top1 == eager.result.final_eval.top1);
}

TEST_CASE("resume on CUDA after k steps is bit-identical to straight training", "[cuda][train]") {
  if (!ska::test::cuda_available_or_skip()) return;
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // bf16 with EMA and dropout; batches from the pinned host pipeline with the step captured as a
  // CUDA Graph, or from the device-resident set with eager steps. k = 5 stops mid-epoch; 12
  // crosses the epoch boundary and its evaluation. The straight run captures at update 4, the
  // resumed one at update 9 (three eager updates after each start).
  const std::string loader =
      GENERATE(as<std::string>{}, "train.cuda_graph=on", "data.device_resident=true");
  CAPTURE(loader);
  const std::vector<std::string> common = {"train.precision=bf16", "train.ema_decay=0.9", loader};
  auto with = [&](const std::string& steps) {
    std::vector<std::string> sets = common;
    sets.push_back(steps);
    return sets;
  };
  const Device gpu = Device::cuda(0);
  const Run straight = train_tiny(with("train.max_steps=12"), "", "", 2, gpu);
  const std::string split_dir = test::train_scratch_dir("cuda_split");
  train_tiny(with("train.max_steps=5"), split_dir, "", 2, gpu);
  // Another state of the device's generator before the rebuild: the checkpoint's must win.
  default_generator(gpu).set_state(987, 654);
  const Run resumed = train_tiny(with("train.max_steps=12"), split_dir, split_dir, 2, gpu);
  if (loader == "train.cuda_graph=on") {
    CHECK(mentions(straight.log, "train.cuda_graph: captured the training step at update 4"));
    CHECK(mentions(resumed.log, "train.cuda_graph: captured the training step at update 9"));
  }
  std::string diff;
  INFO("first differing tensor: " << diff);
  REQUIRE(test::bitwise_equal(straight.weights, resumed.weights, &diff));
  const Checkpoint a = load_checkpoint(resolve_checkpoint(straight.dir));
  const Checkpoint b = load_checkpoint(resolve_checkpoint(split_dir));
  CHECK(a.state.step == 12);
  CHECK(b.state.step == 12);
  CHECK(test::bitwise_equal(a.ema, b.ema, &diff));
  CHECK(test::bitwise_equal(a.state.optimizer, b.state.optimizer, &diff));
  CHECK(a.state.best_ema_top1 == b.state.best_ema_top1);
  CHECK(resumed.result.final_eval.top1 == straight.result.final_eval.top1);
}
