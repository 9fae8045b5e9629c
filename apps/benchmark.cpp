// benchmark: images/s and peak memory of a model from its config, in training (the trainer's own
// step: forward and loss under autocast, backward, non-finite check, clipping, the optimizer and
// the EMA of the config's optim/train sections) or inference (no-grad forward), on the CPU or a
// GPU, after warm-up.
// Usage: benchmark --config cska_vit_s [--mode train|infer] [--batch 128] [--device cuda]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app_common.h"
#include "autograd/grad_mode.h"
#include "backend/device_runtime.h"
#include "data/eval_transform.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "distributed/communicator.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/options.h"
#include "train/train_step.h"

namespace {

struct BenchmarkOptions {
  ska::apps::ConfigOptions config;
  std::string mode = "train";
  int64_t batch = 64;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string precision = "fp32";  // autocast, as train.precision (f32 weights)
  int warmup = 3;
  int iters = 10;
  bool json = false;
};

struct Measurement {
  double median_ms = 0.0;
  double images_per_s = 0.0;
  int64_t peak_bytes = 0;
};

// Times `iters` calls of `step` after `warmup` untimed ones; the device is synchronised around
// each timed call so the time covers the queued GPU work.
template <typename Step>
Measurement time_steps(const BenchmarkOptions& o, ska::Device device, Step step) {
  for (int i = 0; i < o.warmup; ++i) step();
  ska::synchronize(device);
  ska::Allocator& allocator = ska::allocator_for(device);
  allocator.reset_peak();
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ska::synchronize(device);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  Measurement m;
  m.median_ms = ms[ms.size() / 2];
  m.images_per_s = static_cast<double>(o.batch) * 1000.0 / m.median_ms;
  m.peak_bytes = allocator.stats().peak_allocated;
  return m;
}

int run_benchmark(BenchmarkOptions o) {
  using namespace ska;
  o.config.print_config_to_stderr = o.json;
  const Config config = apps::load_config(o.config);
  const ConfigNode model_cfg = apps::model_section(config);
  const models::ModelInput input = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  const ConfigNode data = apps::data_section(config);  // validated like the other commands
  if (!data.is_null()) data::read_eval_transform(data, input.image_size, input.in_channels);
  config.check_unused();
  SKA_CHECK(o.mode == "train" || o.mode == "infer", ValueError, "--mode must be train or infer, got '",
            o.mode, "'");
  const Device device = Device::parse(o.device);
  const DType dtype = dtype_from_name(o.dtype);
  SKA_CHECK(dtype == DType::kF32 || device.is_cuda(), ValueError, "--dtype ", o.dtype,
            " needs --device cuda (the CPU computes in f32)");
  SKA_CHECK(o.precision == "fp32" || o.precision == "bf16" || o.precision == "fp16", ValueError,
            "--precision must be fp32, bf16 or fp16, got '", o.precision, "'");
  SKA_CHECK(o.precision == "fp32" || dtype == DType::kF32, ValueError,
            "--precision ", o.precision, " autocasts an f32 model; it cannot be combined with --dtype ",
            o.dtype);
  model->to(device);
  if (dtype != DType::kF32) model->to(dtype);

  manual_seed(0);
  const Tensor images = randn({o.batch, input.in_channels, input.image_size, input.image_size},
                              DType::kF32, Device::cpu())
                            .to(device, dtype);
  std::vector<int64_t> label_values(static_cast<size_t>(o.batch));
  for (int64_t i = 0; i < o.batch; ++i) label_values[static_cast<size_t>(i)] = i % input.num_classes;
  const Tensor labels = Tensor::from_vector(label_values, {o.batch}).to(device);

  Measurement m;
  std::string step_description;
  if (o.mode == "infer") {
    model->eval();
    NoGradGuard no_grad;
    const AutocastGuard autocast(o.precision == "fp16" ? DType::kF16 : DType::kBF16,
                                 o.precision != "fp32");
    m = time_steps(o, device, [&] { (*model)(images); });
  } else {
    // The trainer's step with the experiment's optim and train sections (defaults without them).
    const ConfigNode root = config.root();
    const bool experiment = root.has("optim") || root.has("train");
    const optim::OptimizerOptions optim_options =
        experiment && root.has("optim") ? optim::OptimizerOptions::from_config(root["optim"])
                                        : optim::OptimizerOptions{};
    train::TrainOptions train =
        experiment && root.has("train") ? train::TrainOptions::from_config(root["train"])
                                        : train::TrainOptions{};
    train.precision = train::precision_from_name(o.precision);
    train.accumulate = 1;
    model->train();
    auto optimizer = optim::make_optimizer(optim_options, model->named_parameters(true));
    std::unique_ptr<optim::ModelEma> ema;
    if (train.ema_decay > 0) ema = std::make_unique<optim::ModelEma>(*model, train.ema_decay);
    std::unique_ptr<optim::LossScaler> scaler;
    if (train.precision == train::Precision::kFP16) scaler = std::make_unique<optim::LossScaler>();
    const auto comm = dist::make_communicator(dist::World{}, device);
    train::TrainStep step(*model, *optimizer, scaler.get(), ema.get(), *comm, train,
                          train::DistributedOptions{});
    train::UpdateStats stats(device);
    std::ostringstream what;
    what << optimizer->name();
    if (train.clip_grad > 0) what << ", clip " << train.clip_grad;
    if (ema) what << ", EMA " << train.ema_decay;
    step_description = what.str();
    m = time_steps(o, device, [&] {
      stats.record(step.apply_update(step.micro_step(images, labels, true), optim_options.lr));
    });
    stats.read();
  }
  const std::string name = apps::resolve_config_path(o.config.config);
  if (o.json) {
    nlohmann::json j = {{"config", name},       {"mode", o.mode},
                        {"device", device.str()}, {"dtype", o.dtype}, {"precision", o.precision},
                        {"batch", o.batch},       {"images_per_s", m.images_per_s},
                        {"median_ms", m.median_ms}, {"peak_bytes", m.peak_bytes},
                        {"trainable_params", model->num_parameters(true)},
                        {"step", step_description}};
    std::cout << j.dump() << std::endl;
  } else {
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << name << "  " << o.mode << "  " << device.str() << "  "
         << (o.precision == "fp32" ? o.dtype : o.precision + " autocast") << "  batch "
         << o.batch << ":  " << m.images_per_s << " images/s  (" << m.median_ms
         << " ms/step, median of " << o.iters << "), peak memory "
         << static_cast<double>(m.peak_bytes) / (1024.0 * 1024.0) << " MiB";
    if (!step_description.empty()) line << " (step: " << step_description << ")";
    std::cout << line.str() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ska::apps::limit_openmp_spinning(argv);
  CLI::App app{"Measures training or inference images/s and peak memory of a model", "benchmark"};
  BenchmarkOptions o;
  ska::apps::add_config_options(app, o.config);
  app.add_option("--mode", o.mode,
                 "train (the trainer's step: the config's optimizer, clipping and EMA) or infer")
      ->check(CLI::IsMember({"train", "infer"}));
  ska::apps::add_batch_option(app, o.batch, "images per step");
  app.add_option("--device", o.device, "cpu, cuda or cuda:N");
  app.add_option("--precision", o.precision,
                 "fp32, or bf16 / fp16 autocast with f32 weights (what train.precision does)");
  app.add_option("--dtype", o.dtype, "f32, or bf16 / f16 on CUDA (weights and activations)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", o.iters, "timed steps (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "print one JSON object");
  return ska::apps::run_main(app, argc, argv, [&] { return run_benchmark(o); });
}
