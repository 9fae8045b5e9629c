// benchmark: images/s and peak memory of a model from its config, in training (the trainer's own
// step: forward and loss under autocast, backward, non-finite check, clipping, the optimizer and
// the EMA of the config's optim/train sections) or inference (no-grad forward), on the CPU or a
// GPU, after warm-up.
// Usage: benchmark --config cska_vit_s [--mode train|infer] [--batch 128] [--device cuda]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "app_common.h"
#include "autograd/grad_mode.h"
#include "backend/device_runtime.h"
#include "backend/profiler.h"
#include "core/allocator.h"
#include "core/precision.h"
#include "core/random.h"
#include "data/eval_transform.h"
#include "distributed/communicator.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "ops/autocast.h"
#include "ops/mac_counter.h"
#include "ops/ops.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/graph_step.h"
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
  bool profile = false;  // then `iters` more steps with every kernel timed
  bool capture_range = false;  // the timed steps between cudaProfilerStart and Stop
  int top = 25;          // kernels listed by --profile
  std::string attention = "fused";  // or wmma, scalar (no tensor cores), or unfused: matmul, softmax,
                                    // matmul (nn::attend_qk)
  std::string attention_backward = "split";  // or one_block (device_runtime.h)
  std::string attention_forward = "tiled";   // or one_block (device_runtime.h)
  std::string cudnn_benchmark = "on";  // time cuDNN's convolution algorithms (core/precision.h)
  std::string elementwise = "fast";    // or reference (set_cuda_elementwise_fast_paths)
  std::string norm_output = "autocast";  // or f32 (nn::set_norm_autocast_outputs)
  std::string norm_backward = "split";   // or fused (set_cuda_layer_norm_fused_backward)
  std::string attention_loads = "async";  // or sync (set_cuda_attention_async_loads)
  std::string residual_norm = "unfused";  // or fused (nn::set_fused_residual_norm)
  std::string gelu_dropout = "unfused";   // or fused (nn::set_fused_gelu_dropout)
  std::string dropout_add = "unfused";    // or fused (nn::set_fused_dropout_add)
  std::string talking_heads = "unfused";  // or fused (nn::set_fused_talking_heads)
  std::string weight_casts = "per_use";   // or per_step (train.weight_casts)
  std::string linear_grads = "autocast";  // or f32 (set_linear_f32_grads)
  std::string conv_logits = "auto";       // or conv, gemm, direct (nn::set_conv_logits_form)
  std::string depthwise_conv = "cudnn";  // or direct, auto (set_cuda_depthwise_conv)
  double peak_tflops = 0.0;         // the MFU reference; 0: the GPU's bf16 dense peak
  bool cuda_graph = false;          // infer: replay the forward as one captured CUDA Graph
};

// Model FLOPs: 2 per multiply-accumulate of one image's forward (the MAC counter's convention,
// matmul / linear / conv2d), times 3 for training (backward = twice the forward), as MFU is
// usually reported. What a step does beyond that (recomputed attention weights, norms,
// elementwise work) is not counted.
struct FlopRate {
  double gflops_per_image = 0.0;
  double tflops = 0.0;       // achieved: gflops_per_image * images/s
  double peak_tflops = 0.0;  // 0: unknown
  std::string peak_of;       // what the peak is of
  double mfu() const { return peak_tflops > 0 ? tflops / peak_tflops : 0.0; }
};

int64_t forward_macs_per_image(ska::nn::Module& model, const ska::Tensor& images) {
  const bool training = model.is_training();
  model.eval();
  ska::NoGradGuard no_grad;
  ska::MacCounter macs;
  model(images.narrow(0, 0, 1));
  if (training) model.train();
  return macs.total();
}

// The bytes a training-mode forward pass (under the step's autocast) keeps for its backward pass,
// per image: the device allocator's requested bytes after the forward less those before, at n and
// at 2n images (n = 2, or 1 for a batch under 4), their difference over n. That is the saved
// activations, the output and the dropout masks; the weights' autocast copies, which do not grow
// with the batch, cancel. -1 for a batch of 1. Both forwards start from seed 0, so that layer
// dropout (CaiT's) skips the same blocks in both (it counts the blocks that draw keeps); it runs
// after the timed steps, whose draws it would otherwise change.
double activation_bytes_per_image(ska::nn::Module& model, const ska::Tensor& images,
                                  const std::string& precision) {
  using namespace ska;
  const int64_t n = images.size(0) >= 4 ? 2 : 1;
  if (images.size(0) < 2 * n) return -1.0;
  Allocator& allocator = allocator_for(images.device());
  const AutocastGuard autocast(precision == "fp16" ? DType::kF16 : DType::kBF16,
                               precision != "fp32");
  const auto kept = [&](int64_t count) {
    manual_seed(0);
    synchronize(images.device());
    const int64_t before = allocator.stats().requested;
    const Tensor out = model(images.narrow(0, 0, count));
    return allocator.stats().requested - before;
  };
  const int64_t one = kept(n), two = kept(2 * n);
  return static_cast<double>(two - one) / static_cast<double>(n);
}

struct Measurement {
  double median_ms = 0.0;
  double images_per_s = 0.0;
  int64_t peak_bytes = 0;            // the allocator's blocks (MemoryStats::peak_allocated)
  int64_t peak_requested_bytes = 0;  // the tensors' own bytes (MemoryStats::peak_requested)
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
  if (o.capture_range) ska::start_device_profiler_capture();
  for (int i = 0; i < o.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ska::synchronize(device);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  if (o.capture_range) ska::stop_device_profiler_capture();
  std::sort(ms.begin(), ms.end());
  Measurement m;
  m.median_ms = ms[ms.size() / 2];
  m.images_per_s = static_cast<double>(o.batch) * 1000.0 / m.median_ms;
  const ska::MemoryStats stats = allocator.stats();
  m.peak_bytes = stats.peak_allocated;
  m.peak_requested_bytes = stats.peak_requested;
  return m;
}

// Where a step's time goes: `iters` more steps with the kernel profiler on (one synchronisation
// at the end), per op family and per kernel, per step and as a share of the step.
struct Profile {
  double step_ms = 0.0;
  std::vector<ska::profiler::KernelTime> kernels;  // per step, the longest first
  std::vector<ska::profiler::KernelTime> families;
  std::vector<ska::profiler::KernelTime> calls;  // per kernel and operands, per step
};

template <typename Step>
Profile profile_steps(const BenchmarkOptions& o, ska::Device device, Step step) {
  ska::synchronize(device);
  ska::profiler::start();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) step();
  ska::synchronize(device);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  Profile p;
  p.kernels = ska::profiler::stop(&p.calls);
  p.step_ms = total_ms / o.iters;
  for (ska::profiler::KernelTime& c : p.calls) c.ms /= o.iters;
  std::map<std::string, ska::profiler::KernelTime> families;
  for (ska::profiler::KernelTime& k : p.kernels) {
    k.ms /= o.iters;
    ska::profiler::KernelTime& f = families[k.family];
    f.name = f.family = k.family;
    f.calls += k.calls;
    f.ms += k.ms;
  }
  for (auto& entry : families) p.families.push_back(entry.second);
  std::sort(p.families.begin(), p.families.end(),
            [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return p;
}

void print_profile(const Profile& p, int iters, int top) {
  double kernels_ms = 0.0;
  for (const auto& k : p.kernels) kernels_ms += k.ms;
  std::printf("profile: %d steps, %.3f ms per step (wall, synchronised); kernels %.3f ms (%.1f%%), "
              "the rest is host time between kernels\n",
              iters, p.step_ms, kernels_ms, 100.0 * kernels_ms / p.step_ms);
  std::printf("\n%-14s %10s %7s %11s\n", "family", "ms/step", "share", "calls/step");
  for (const auto& f : p.families) {
    std::printf("%-14s %10.3f %6.1f%% %11.1f\n", f.name.c_str(), f.ms, 100.0 * f.ms / p.step_ms,
                static_cast<double>(f.calls) / iters);
  }
  std::printf("\n%-24s %-14s %10s %7s %11s\n", "kernel", "family", "ms/step", "share",
              "calls/step");
  int shown = 0;
  for (const auto& k : p.kernels) {
    if (shown++ == top) break;
    std::printf("%-24s %-14s %10.3f %6.1f%% %11.1f\n", k.name.c_str(), k.family.c_str(), k.ms,
                100.0 * k.ms / p.step_ms, static_cast<double>(k.calls) / iters);
  }
  // The same time by operands: which copy, which convolution.
  std::printf("\n%-24s %10s %7s %11s  %s\n", "kernel", "ms/step", "share", "calls/step",
              "operands");
  shown = 0;
  for (const auto& c : p.calls) {
    if (shown++ == top) break;
    std::printf("%-24s %10.3f %6.1f%% %11.1f  %s\n", c.name.c_str(), c.ms,
                100.0 * c.ms / p.step_ms, static_cast<double>(c.calls) / iters,
                c.operands.c_str());
  }
}

nlohmann::json profile_json(const Profile& p, int iters) {
  const auto rows = [&](const std::vector<ska::profiler::KernelTime>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& k : list) {
      nlohmann::json row = {{"name", k.name},
                            {"family", k.family},
                            {"ms_per_step", k.ms},
                            {"calls_per_step", static_cast<double>(k.calls) / iters}};
      if (!k.operands.empty()) row["operands"] = k.operands;
      out.push_back(std::move(row));
    }
    return out;
  };
  return {{"step_ms", p.step_ms},
          {"families", rows(p.families)},
          {"kernels", rows(p.kernels)},
          {"calls", rows(p.calls)}};
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
  const Device device = apps::device_option(o.device);
  const DType dtype = dtype_from_name(o.dtype);
  SKA_CHECK(!o.cuda_graph || device.is_cuda(), ValueError, "--cuda-graph needs --device cuda");
  SKA_CHECK(!o.capture_range || device.is_cuda(), ValueError,
            "--capture-range needs --device cuda (it marks the timed steps for Nsight)");
  SKA_CHECK(!(o.cuda_graph && o.profile), ValueError,
            "--profile times each kernel call, which a CUDA Graph replay does not make: use one "
            "or the other");
  SKA_CHECK(dtype == DType::kF32 || device.is_cuda(), ValueError, "--dtype ", o.dtype,
            " needs --device cuda (the CPU computes in f32)");
  SKA_CHECK(o.precision == "fp32" || o.precision == "bf16" || o.precision == "fp16", ValueError,
            "--precision must be fp32, bf16 or fp16, got '", o.precision, "'");
  SKA_CHECK(o.precision == "fp32" || dtype == DType::kF32, ValueError,
            "--precision ", o.precision, " autocasts an f32 model; it cannot be combined with --dtype ",
            o.dtype);
  model->to(device);
  if (dtype != DType::kF32) model->to(dtype);
  train::KernelChoices kernels;
  kernels.attention = o.attention;
  kernels.attention_backward = o.attention_backward;
  kernels.attention_forward = o.attention_forward;
  kernels.elementwise = o.elementwise;
  kernels.norm_output = o.norm_output;
  kernels.residual_norm = o.residual_norm;
  kernels.gelu_dropout = o.gelu_dropout;
  kernels.dropout_add = o.dropout_add;
  kernels.talking_heads = o.talking_heads;
  kernels.weight_casts = o.weight_casts;
  kernels.linear_grads = o.linear_grads;
  kernels.conv_logits = o.conv_logits;
  kernels.depthwise_conv = o.depthwise_conv;
  kernels.cudnn_benchmark = o.cudnn_benchmark == "on";
  kernels.apply();
  set_cuda_layer_norm_fused_backward(o.norm_backward == "fused");
  set_cuda_attention_async_loads(o.attention_loads == "async");

  manual_seed(0);
  const Tensor images = randn({o.batch, input.in_channels, input.image_size, input.image_size},
                              DType::kF32, Device::cpu())
                            .to(device, dtype);
  std::vector<int64_t> label_values(static_cast<size_t>(o.batch));
  for (int64_t i = 0; i < o.batch; ++i) label_values[static_cast<size_t>(i)] = i % input.num_classes;
  const Tensor labels = Tensor::from_vector(label_values, {o.batch}).to(device);

  FlopRate flops;
  flops.gflops_per_image = 2e-9 * static_cast<double>(forward_macs_per_image(*model, images)) *
                           (o.mode == "train" ? 3.0 : 1.0);
  if (o.peak_tflops > 0) {
    flops.peak_tflops = o.peak_tflops;
    flops.peak_of = "--peak-tflops";
  } else if (device.is_cuda()) {
    const std::string gpu = cuda_device_name(device.index);
    flops.peak_tflops = profiler::bf16_dense_peak_tflops(gpu);
    flops.peak_of = gpu + " bf16 dense";
  }

  Measurement m;
  std::optional<Profile> profile;
  std::string step_description;
  double activations = -1.0;  // train: what the forward pass keeps per image
  if (o.mode == "infer") {
    model->eval();
    NoGradGuard no_grad;
    const AutocastGuard autocast(o.precision == "fp16" ? DType::kF16 : DType::kBF16,
                                 o.precision != "fp32");
    // --weight-casts per_step: the parameters cast in one call a forward pass, as evaluation
    // casts them once a pass (train::EvalPrecision).
    const TensorList params = model->parameters(false);
    const auto forward = [&] {
      std::optional<AutocastParamCasts> casts;
      if (o.precision != "fp32" && o.weight_casts == "per_step") casts.emplace(params);
      return (*model)(images);
    };
    std::function<void()> step = [&] { forward(); };
    std::unique_ptr<DeviceGraph> graph;
    Tensor graph_output;  // written in place by every replay
    if (o.cuda_graph) {
      step();  // warm-up outside the capture: algorithm choices, constants placed on the device
      synchronize(device);
      try {
        graph = std::make_unique<DeviceGraph>(device, [&] { graph_output = forward(); });
      } catch (const Error& e) {
        SKA_FAIL(DeviceError, "--cuda-graph: the forward of ", o.config.config,
                 " could not be captured: ", e.what());
      }
      step = [&] { graph->replay(); };
    }
    m = time_steps(o, device, step);
    if (o.profile) profile = profile_steps(o, device, step);
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
    train.kernels = kernels;  // the command line's choices, as applied above
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
    const std::function<void()> eager_step = [&] {
      stats.record(step.apply_update(step.micro_step(images, labels, true), optim_options.lr));
    };
    std::function<void()> train_step = eager_step;
    std::unique_ptr<train::GraphedStep> graphed;  // the trainer's train.cuda_graph step
    if (o.cuda_graph) {
      const std::string obstacle = train::cuda_graph_obstacle(device, 1, comm->backend(), train);
      SKA_CHECK(obstacle.empty(), ValueError, "--cuda-graph: ", obstacle);
      // Warm-up outside the capture: algorithm choices, optimizer state, constants on the device.
      for (int i = 0; i < 2; ++i) eager_step();
      try {
        graphed = std::make_unique<train::GraphedStep>(step, *optimizer, stats,
                                                       default_generator(device), images, labels,
                                                       optim_options.lr);
      } catch (const Error& e) {
        SKA_FAIL(DeviceError, "--cuda-graph: the training step of ", o.config.config,
                 " could not be captured: ", e.what());
      }
      train_step = [&] { graphed->run(images, labels, optim_options.lr); };
    }
    m = time_steps(o, device, train_step);
    if (o.profile) profile = profile_steps(o, device, train_step);
    stats.read();
    activations = activation_bytes_per_image(*model, images, o.precision);
  }
  flops.tflops = flops.gflops_per_image * m.images_per_s * 1e-3;
  const std::string name = apps::resolve_config_path(o.config.config);
  if (o.json) {
    nlohmann::json j = {{"config", name},
                        {"mode", o.mode},
                        {"device", device.str()},
                        {"dtype", o.dtype},
                        {"precision", o.precision},
                        {"batch", o.batch},
                        {"images_per_s", m.images_per_s},
                        {"median_ms", m.median_ms},
                        {"peak_bytes", m.peak_bytes},
                        {"peak_requested_bytes", m.peak_requested_bytes},
                        {"trainable_params", model->num_parameters(true)},
                        {"step", step_description},
                        {"attention", o.attention},
                        {"attention_backward", o.attention_backward},
                        {"attention_forward", o.attention_forward},
                        {"cuda_graph", o.cuda_graph},
                        {"cudnn_benchmark", o.cudnn_benchmark},
                        {"elementwise", o.elementwise},
                        {"norm_output", o.norm_output},
                        {"norm_backward", o.norm_backward},
                        {"attention_loads", o.attention_loads},
                        {"residual_norm", o.residual_norm},
                        {"gelu_dropout", o.gelu_dropout},
                        {"dropout_add", o.dropout_add},
                        {"talking_heads", o.talking_heads},
                        {"weight_casts", o.weight_casts},
                        {"linear_grads", o.linear_grads},
                        {"conv_logits", o.conv_logits},
                        {"depthwise_conv", o.depthwise_conv}};
    j["conv_logits_auto"] = ska::nn::conv_logits_auto_choices();
    j["depthwise_conv_auto"] = ska::cuda_depthwise_conv_choices();
    j["gflops_per_image"] = flops.gflops_per_image;
    if (activations >= 0) j["activation_bytes_per_image"] = activations;
    j["tflops"] = flops.tflops;
    if (flops.peak_tflops > 0) {
      j["peak_tflops"] = flops.peak_tflops;
      j["peak_of"] = flops.peak_of;
      j["mfu"] = flops.mfu();
    }
    if (profile) j["profile"] = profile_json(*profile, o.iters);
    std::cout << j.dump() << std::endl;
  } else {
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << name << "  " << o.mode << "  " << device.str() << "  "
         << (o.precision == "fp32" ? o.dtype : o.precision + " autocast") << "  batch "
         << o.batch << ":  " << m.images_per_s << " images/s  (" << m.median_ms
         << " ms/step, median of " << o.iters << "), peak memory "
         << static_cast<double>(m.peak_bytes) / (1024.0 * 1024.0) << " MiB (tensors "
         << static_cast<double>(m.peak_requested_bytes) / (1024.0 * 1024.0) << " MiB)";
    if (o.attention != "fused") line << " [" << o.attention << " attention]";
    if (o.attention_backward != "split") {
      line << " [" << o.attention_backward << " attention backward]";
    }
    if (o.attention_forward != "tiled") {
      line << " [" << o.attention_forward << " attention forward]";
    }
    if (o.cuda_graph) line << " [CUDA Graph]";
    if (device.is_cuda() && o.cudnn_benchmark == "off") line << " [cuDNN heuristics]";
    if (device.is_cuda() && o.elementwise != "fast") line << " [reference elementwise kernels]";
    if (o.precision != "fp32" && o.norm_output != "autocast") line << " [f32 norm outputs]";
    if (device.is_cuda() && o.norm_backward != "split") line << " [fused norm backward]";
    if (device.is_cuda() && o.attention_loads != "async") line << " [sync attention loads]";
    if (o.residual_norm != "unfused") line << " [fused residual norm]";
    if (o.gelu_dropout != "unfused") line << " [fused GELU dropout]";
    if (o.dropout_add != "unfused") line << " [fused dropout add]";
    if (o.talking_heads != "unfused") line << " [fused talking heads]";
    if (o.precision != "fp32" && o.weight_casts != "per_use") line << " [weight casts per step]";
    if (o.mode == "train" && o.linear_grads != "autocast") line << " [f32 linear grads]";
    if (o.conv_logits != "auto") line << " [conv logits: " << o.conv_logits << "]";
    if (o.depthwise_conv != "cudnn") line << " [depthwise conv: " << o.depthwise_conv << "]";
    if (!step_description.empty()) line << " (step: " << step_description << ")";
    line.precision(3);
    line << "\n  " << flops.gflops_per_image << " GFLOP per image ("
         << (o.mode == "train" ? "3 x " : "") << "2 x MACs), " << flops.tflops << " TFLOP/s";
    if (flops.peak_tflops > 0) {
      line.precision(1);
      line << ", MFU " << 100.0 * flops.mfu() << "% of " << flops.peak_tflops << " TFLOP/s ("
           << flops.peak_of << ")";
    }
    if (activations >= 0) {
      line.precision(3);
      line << "\n  the forward pass keeps " << activations / (1024.0 * 1024.0)
           << " MiB per image for the backward pass (activations, outputs, dropout masks)";
    }
    for (const std::string& choice : ska::nn::conv_logits_auto_choices()) {
      line << "\n  " << choice;
    }
    for (const std::string& choice : ska::cuda_depthwise_conv_choices()) {
      line << "\n  " << choice;
    }
    std::cout << line.str() << std::endl;
    if (profile) print_profile(*profile, o.iters, o.top);
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
  app.add_flag("--profile", o.profile,
               "then time every kernel over --iters more steps: where a step's time goes, by op "
               "family and by kernel (NVTX ranges name each kernel for Nsight)");
  app.add_option("--top", o.top, "kernels listed by --profile")->check(CLI::PositiveNumber);
  app.add_flag("--capture-range", o.capture_range,
               "CUDA: the timed steps between cudaProfilerStart and cudaProfilerStop, so that "
               "ncu --profile-from-start off (scripts/gpu_kernels.sh) or nsys profile "
               "--capture-range=cudaProfilerApi record those steps only");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "CUDA: capture the step (infer: the forward; train: the whole training step) once "
               "as a CUDA Graph and time its replays (what the kernel launches cost)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the peak TFLOP/s MFU is reported against (default: the GPU's bf16 dense peak "
                 "from a table of NVIDIA data sheets; none on the CPU)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--attention", o.attention,
                 "fused (the fused attention op wherever the logits are q k^T; on CUDA bf16/f16 "
                 "on the tensor cores, mma.sync kernels), wmma (the same with the WMMA kernels), "
                 "scalar (the same op on CUDA's scalar f32-FMA kernels) or unfused (matmul, "
                 "softmax, matmul: the weights stored), to compare")
      ->check(CLI::IsMember({"fused", "wmma", "scalar", "unfused"}));
  app.add_option("--attention-backward", o.attention_backward,
                 "the mma.sync attention's backward for up to 80 tokens and head dims up to 64: "
                 "split (a dK/dV and a dQ kernel) or one_block (one block per head), to compare")
      ->check(CLI::IsMember({"split", "one_block"}));
  app.add_option("--attention-forward", o.attention_forward,
                 "the mma.sync attention's forward for 65 to 80 tokens and head dims up to 64: "
                 "tiled (blocks of 64 queries, key tiles of 64) or one_block (one block per head, "
                 "one key tile), to compare")
      ->check(CLI::IsMember({"tiled", "one_block"}));
  app.add_option("--cudnn-benchmark", o.cudnn_benchmark,
                 "on: time cuDNN's convolution algorithms on the first call of each shape and "
                 "keep the fastest (train.cudnn_benchmark's default); off: cuDNN's heuristics")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--elementwise", o.elementwise,
                 "CUDA elementwise kernels: fast (merged dims, 16-byte accesses, 32-bit offsets) "
                 "or reference (64-bit offsets over every dim), to compare")
      ->check(CLI::IsMember({"fast", "reference"}));
  app.add_option("--norm-output", o.norm_output,
                 "under autocast, layer norms read only by a matrix product write: autocast (its "
                 "16-bit dtype, the same bits) or f32 (cast by the product after), to compare")
      ->check(CLI::IsMember({"autocast", "f32"}));
  app.add_option("--norm-backward", o.norm_backward,
                 "CUDA layer norm backward for rows of up to 768 columns: split (a grad_x kernel "
                 "and a column reduction) or fused (one pass that reads grad_y and x once), to "
                 "compare")
      ->check(CLI::IsMember({"split", "fused"}));
  app.add_option("--attention-loads", o.attention_loads,
                 "how the CUDA tensor-core attention kernels fill their shared tiles: async "
                 "(cp.async copies, all in flight before a thread waits) or sync (a load and a "
                 "store per 16 bytes); the same bits, to compare")
      ->check(CLI::IsMember({"async", "sync"}));
  app.add_option("--residual-norm", o.residual_norm,
                 "a pre-norm block's residual add and the layer norm after it: unfused (two ops) "
                 "or fused (one kernel forward and one backward; the same bits), to compare")
      ->check(CLI::IsMember({"unfused", "fused"}));
  app.add_option("--gelu-dropout", o.gelu_dropout,
                 "an MLP's GELU and the dropout after it in training: unfused (two ops) or fused "
                 "(one kernel forward and one backward; the same bits), to compare")
      ->check(CLI::IsMember({"unfused", "fused"}));
  app.add_option(
         "--dropout-add", o.dropout_add,
         "the dropout closing a ViT or CaiT block's branch and the residual sum it feeds, in "
         "training: unfused (two ops) or fused (one kernel forward and one backward; the same "
         "bits), to compare")
      ->check(CLI::IsMember({"unfused", "fused"}));
  app.add_option("--talking-heads", o.talking_heads,
                 "CaiT's talking-heads attention weights (mix, softmax, mix): unfused (the ops) "
                 "or fused (one kernel forward and one backward, nothing between stored), to "
                 "compare")
      ->check(CLI::IsMember({"unfused", "fused"}));
  app.add_option("--weight-casts", o.weight_casts,
                 "autocast's casts of the f32 parameters: per_use (each op casts what it reads) or "
                 "per_step (all of them before each forward pass, a launch per 32; the same "
                 "bits), to compare")
      ->check(CLI::IsMember({"per_use", "per_step"}));
  app.add_option("--linear-grads", o.linear_grads,
                 "the gradients of the linear layers' f32 weights and biases under autocast: "
                 "autocast (16-bit, then cast) or f32 (written in f32 by the backward GEMM and "
                 "column sum), to compare")
      ->check(CLI::IsMember({"autocast", "f32"}));
  app.add_option("--conv-logits", o.conv_logits,
                 "CSKA's logit convolution: conv (the convolution; cuDNN on CUDA), gemm (each "
                 "query's 3x3 neighbourhood times the filters: im2col + batched GEMM) or auto (on "
                 "CUDA with --cudnn-benchmark on, the faster for each shape, timed on its first "
                 "call, the default; the choices are printed; conv elsewhere) or direct (this "
                 "project's tensor-core kernels on CUDA, no im2col; the CPU's reference loops), "
                 "to compare")
      ->check(CLI::IsMember({"conv", "gemm", "auto", "direct"}));
  app.add_option("--depthwise-conv", o.depthwise_conv,
                 "CUDA channels-last depthwise convolutions with stride 1 and 3x3 to 7x7 filters "
                 "(MetaFormer's separable convolutions): cudnn (the default), direct (this "
                 "project's kernels) or auto (with --cudnn-benchmark on, the faster for each shape "
                 "and pass, timed on its first call), to compare")
      ->check(CLI::IsMember({"cudnn", "direct", "auto"}));
  return ska::apps::run_main(app, argc, argv, [&] { return run_benchmark(o); });
}
