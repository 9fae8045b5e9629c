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
#include <set>
#include <sstream>

#include "app_common.h"
#include "autograd/grad_mode.h"
#include "backend/device_runtime.h"
#include "backend/profiler.h"
#include "core/allocator.h"
#include "core/memory_census.h"
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
  bool memory_census = false;  // what is live at the peak, by size (core/memory_census.h)
  // --attention, --weight-casts, ...: train.KEY's choices (train::kernel_choice_specs()), and
  // the keys of those given on the command line (the others come from the config's train:).
  ska::train::KernelChoices kernels;
  std::set<std::string> kernel_flags;
  std::string cudnn_benchmark = "on";  // time cuDNN's convolution algorithms (core/precision.h)
  std::string variants;                // --variants: kernel-choice variants timed in this process
  int rounds = 1;                      // times the variants are timed in turn
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
  int64_t peak_reserved_bytes = 0;   // held from the system, cache included (peak_reserved)
  // CPU: the same requests under the CUDA allocator's block rules (set_host_device_rules), what
  // a GPU run would reserve but for its kernels' workspaces; -1 on a GPU.
  int64_t device_rules_reserved_bytes = -1;
  int64_t device_rules_requested_bytes = -1;  // the replayed tensors' own bytes, scratch left out
  std::optional<ska::MemoryCensus> census;    // with --memory-census
};

constexpr size_t kCensusLineSizes = 8;   // sizes the text line lists
constexpr size_t kCensusJsonSizes = 64;  // and --json

// "live at the peak of tensors: N tensors, X MiB: 24 x 66.00 MiB, ..." (the largest totals first).
std::string describe_census(const ska::MemoryCensus& c, ska::Device device) {
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "live at the peak of tensors: " << c.peak_storages << " tensors, " << mib(c.peak_bytes)
      << " MiB" << (device.is_cpu() ? " (CPU kernels' scratch left out)" : "") << ":";
  for (size_t i = 0; i < c.at_peak.size() && i < kCensusLineSizes; ++i) {
    out << (i == 0 ? " " : ", ") << c.at_peak[i].count << " x ";
    const int64_t bytes = c.at_peak[i].bytes;
    out.precision(2);  // two sizes apart by 1% read apart
    if (bytes >= (int64_t{1} << 20)) {
      out << mib(bytes) << " MiB";
    } else if (bytes >= 1024) {
      out << static_cast<double>(bytes) / 1024.0 << " KiB";
    } else {
      out << bytes << " B";
    }
  }
  if (c.at_peak.size() > kCensusLineSizes) {
    int64_t rest = 0;
    for (size_t i = kCensusLineSizes; i < c.at_peak.size(); ++i)
      rest += c.at_peak[i].bytes * c.at_peak[i].count;
    out.precision(1);
    out << "; " << c.at_peak.size() - kCensusLineSizes << " other sizes, " << mib(rest) << " MiB";
  }
  return out.str();
}

// Times `iters` calls of `step` after `warmup` untimed ones; the device is synchronised around
// each timed call so the time covers the queued GPU work.
template <typename Step>
Measurement time_steps(const BenchmarkOptions& o, ska::Device device, Step step) {
  for (int i = 0; i < o.warmup; ++i) step();
  ska::synchronize(device);
  ska::Allocator& allocator = ska::allocator_for(device);
  allocator.reset_peak();
  if (o.memory_census) ska::reset_memory_census_peak();
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
  m.peak_reserved_bytes = stats.peak_reserved;
  if (device.is_cpu()) {
    const ska::DeviceRulesStats rules = ska::host_device_rules_stats();
    m.device_rules_reserved_bytes = rules.peak_reserved;
    m.device_rules_requested_bytes = rules.peak_requested;
  }
  if (o.memory_census) m.census = ska::memory_census(device);
  return m;
}

// Returns the allocator's cached blocks (an earlier --variants entry's) before a variant is
// timed, so that its peak memory is its own. Never with a CUDA Graph (whose pool must stay).
void release_cached_blocks(ska::Device device) {
  ska::synchronize(device);
  ska::allocator_for(device).empty_cache();
}

// One entry of --variants: what it is called and the kernels' choices it runs with.
struct Variant {
  std::string label;
  ska::train::KernelChoices kernels;
  std::vector<Measurement> rounds;  // one per round
  Measurement result;               // the round with the median time
};

// text's parts between `sep`s, each without surrounding blanks.
std::vector<std::string> split_on(const std::string& text, char sep) {
  const auto trimmed = [](const std::string& t) {
    const size_t b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
  };
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(trimmed(part));
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

// --variants "a=x,b=y;c=z;default": the command line's choices first ("command line"), then each
// ';'-separated item: those choices with its ','-separated train.KEY=value overrides ("default":
// none). The keys and values are checked as the train section checks them (a typo is an error
// with a suggestion).
std::vector<Variant> parse_variants(const std::string& text,
                                    const ska::train::KernelChoices& base) {
  using namespace ska;
  std::vector<Variant> out{{"command line", base, {}, {}}};
  if (text.empty()) return out;
  for (const std::string& item : split_on(text, ';')) {
    SKA_CHECK(!item.empty(), ValueError, "--variants '", text,
              "': an empty variant (write 'default' for the command line's choices)");
    train::KernelChoices k;
    try {
      Config config = Config::parse("train: {}\n", "--variants");
      for (const train::KernelChoiceSpec& spec : train::kernel_choice_specs()) {
        config.set(std::string("train.") + spec.key + "=" + base.*spec.member);
      }
      config.set(std::string("train.cudnn_benchmark=") + (base.cudnn_benchmark ? "true" : "false"));
      config.set(std::string("train.cudnn_deterministic=") +
                 (base.cudnn_deterministic ? "true" : "false"));
      if (item != "default") {
        for (const std::string& assignment : split_on(item, ',')) {
          SKA_CHECK(assignment.find('=') != std::string::npos, ValueError,
                    "expected KEY=VALUE, got '", assignment, "'");
          config.set("train." + assignment);
        }
      }
      k = train::KernelChoices::from_config(config.root()["train"]);
      config.check_unused();
    } catch (const Error& e) {
      SKA_FAIL(ValueError, "--variants '", item, "': ", e.what(),
               " (a variant takes train's kernel keys: --help lists them)");
    }
    out.push_back({item, k, {}, {}});
  }
  return out;
}

// Times every variant `rounds` times, in turn (variant 1, 2, ..., then again), through
// `measure`, which applies the variant's choices and times its steps; each variant's result is
// its round with the (lower) median time. Each round's figure goes to stderr as it is taken, so
// a run cut short still leaves what it measured.
void time_variants(std::vector<Variant>& variants, int rounds,
                   const std::function<Measurement(const ska::train::KernelChoices&)>& measure) {
  for (int r = 0; r < rounds; ++r) {
    for (Variant& v : variants) {
      v.rounds.push_back(measure(v.kernels));
      if (variants.size() > 1) {
        std::fprintf(stderr, "variant %s, round %d: %.1f images/s (%.3f ms/step)\n",
                     v.label.c_str(), r + 1, v.rounds.back().images_per_s,
                     v.rounds.back().median_ms);
      }
    }
  }
  for (Variant& v : variants) {
    std::vector<Measurement> sorted = v.rounds;
    std::sort(sorted.begin(), sorted.end(),
              [](const Measurement& a, const Measurement& b) { return a.median_ms < b.median_ms; });
    v.result = sorted[(sorted.size() - 1) / 2];  // the lower median: of two, the faster
  }
}

// The --variants table: images/s, ms/step and peak memory of each, and its speed against the
// first (the command line's choices).
void print_variants(const std::vector<Variant>& variants, int rounds, int iters) {
  std::printf("variants (%d round%s of %d steps each, in turn; the lower median round):\n", rounds,
              rounds == 1 ? "" : "s", iters);
  size_t width = 8;
  for (const Variant& v : variants) width = std::max(width, v.label.size());
  const int w = static_cast<int>(width);
  std::printf("  %-*s %10s %9s %8s %9s\n", w, "variant", "images/s", "ms/step", "vs first",
              "peak MiB");
  const double first = variants.front().result.median_ms;
  for (const Variant& v : variants) {
    std::printf("  %-*s %10.1f %9.3f %8.3f %9.1f\n", w, v.label.c_str(), v.result.images_per_s,
                v.result.median_ms, first / v.result.median_ms,
                static_cast<double>(v.result.peak_bytes) / (1024.0 * 1024.0));
  }
  std::printf("  ('vs first' above 1: faster than the command line's choices)\n");
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
  const auto per_step = [&](ska::profiler::KernelTime& k) {
    k.ms /= o.iters;
    k.bytes /= o.iters;
    k.flops /= o.iters;
  };
  for (ska::profiler::KernelTime& c : p.calls) per_step(c);
  std::map<std::string, ska::profiler::KernelTime> families;
  for (ska::profiler::KernelTime& k : p.kernels) {
    per_step(k);
    ska::profiler::KernelTime& f = families[k.family];
    f.name = f.family = k.family;
    f.calls += k.calls;
    f.ms += k.ms;
    f.bytes += k.bytes;
    f.flops += k.flops;
  }
  for (auto& entry : families) p.families.push_back(entry.second);
  std::sort(p.families.begin(), p.families.end(),
            [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return p;
}

// What a kernel's calls reached: TFLOP/s for the products, else GB/s of their operands' bytes
// (profiler::Traffic: a lower bound on the traffic).
std::string rate_of(const ska::profiler::KernelTime& k) {
  char text[32];
  if (k.ms <= 0.0) return "-";
  if (k.flops > 0.0) {
    std::snprintf(text, sizeof text, "%.3g TFLOP/s", k.flops / (k.ms * 1e9));
  } else {
    std::snprintf(text, sizeof text, "%.3g GB/s", k.bytes / (k.ms * 1e6));
  }
  return text;
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
  std::printf("\n%-24s %-14s %10s %7s %11s %14s\n", "kernel", "family", "ms/step", "share",
              "calls/step", "rate");
  int shown = 0;
  for (const auto& k : p.kernels) {
    if (shown++ == top) break;
    std::printf("%-24s %-14s %10.3f %6.1f%% %11.1f %14s\n", k.name.c_str(), k.family.c_str(), k.ms,
                100.0 * k.ms / p.step_ms, static_cast<double>(k.calls) / iters, rate_of(k).c_str());
  }
  // The same time by operands: which copy, which convolution.
  std::printf("\n%-24s %10s %7s %11s %14s  %s\n", "kernel", "ms/step", "share", "calls/step",
              "rate", "operands");
  shown = 0;
  for (const auto& c : p.calls) {
    if (shown++ == top) break;
    std::printf("%-24s %10.3f %6.1f%% %11.1f %14s  %s\n", c.name.c_str(), c.ms,
                100.0 * c.ms / p.step_ms, static_cast<double>(c.calls) / iters, rate_of(c).c_str(),
                c.operands.c_str());
  }
  std::printf(
      "(rate: TFLOP/s of the products; else GB/s of each operand read or written once, "
      "a lower bound)\n");
}

nlohmann::json profile_json(const Profile& p, int iters) {
  const auto rows = [&](const std::vector<ska::profiler::KernelTime>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& k : list) {
      nlohmann::json row = {{"name", k.name},
                            {"family", k.family},
                            {"ms_per_step", k.ms},
                            {"calls_per_step", static_cast<double>(k.calls) / iters},
                            {"bytes_per_step", k.bytes},
                            {"flops_per_step", k.flops}};
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
  // On the CPU, every allocation from the model's weights on replayed under the CUDA
  // allocator's rules, for the peak a GPU run would reserve.
  if (apps::device_option(o.device).is_cpu()) set_host_device_rules(true);
  // Likewise every storage counted by size for --memory-census, the weights' included.
  if (o.memory_census) set_memory_census(true);
  const Config config = apps::load_config(o.config);
  const ConfigNode model_cfg = apps::model_section(config, {"train", "optim"});
  const models::ModelInput input = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  const ConfigNode data = apps::data_section(config);  // validated like the other commands
  if (!data.is_null()) data::read_eval_transform(data, input.image_size, input.in_channels);
  // The trainer's step with the experiment's optim and train sections (defaults without them),
  // read whole so that a typo in them is reported.
  const ConfigNode root = config.root();
  const optim::OptimizerOptions optim_options =
      root.has("optim") ? optim::OptimizerOptions::from_config(root["optim"])
                        : optim::OptimizerOptions{};
  train::TrainOptions train =
      root.has("train") ? train::TrainOptions::from_config(root["train"]) : train::TrainOptions{};
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
  // The config's train: kernel choices (train.KEY), with those the command line gives over them.
  train::KernelChoices kernels = train.kernels;
  for (const train::KernelChoiceSpec& spec : train::kernel_choice_specs()) {
    if (o.kernel_flags.count(spec.key) != 0) kernels.*spec.member = o.kernels.*spec.member;
  }
  kernels.cudnn_benchmark = o.cudnn_benchmark == "on";
  std::vector<Variant> variants = parse_variants(o.variants, kernels);
  SKA_CHECK(o.rounds == 1 || variants.size() > 1, ValueError, "--rounds ", o.rounds,
            " needs --variants (rounds time the variants in turn)");
  SKA_CHECK(variants.size() == 1 || (!o.cuda_graph && !o.profile && !o.capture_range), ValueError,
            "--variants times each variant's eager steps; it takes neither --cuda-graph, "
            "--profile nor --capture-range");
  kernels.apply();

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
    train::KernelChoices current = kernels;  // a --variants entry's while it is timed
    const auto forward = [&] {
      std::optional<AutocastParamCasts> casts;
      if (o.precision != "fp32" && current.weight_casts == "per_step") casts.emplace(params);
      return (*model)(images);
    };
    std::function<void()> step = [&] { forward(); };
    std::unique_ptr<DeviceGraph> graph;
    Tensor graph_output;  // written in place by every replay
    if (o.cuda_graph) {
      step();  // warm-up outside the capture: algorithm choices, constants placed on the device
      synchronize(device);
      try {
        const ForbidDraws host_draws(default_generator(Device::cpu()),
                                     "capturing the forward as a CUDA Graph (--cuda-graph), whose "
                                     "replays would all repeat them");
        graph = std::make_unique<DeviceGraph>(device, [&] { graph_output = forward(); });
      } catch (const Error& e) {
        SKA_FAIL(DeviceError, "--cuda-graph: the forward of ", o.config.config,
                 " could not be captured: ", e.what());
      }
      step = [&] { graph->replay(); };
    }
    time_variants(variants, o.rounds, [&](const train::KernelChoices& k) {
      current = k;
      k.apply();
      if (variants.size() > 1) release_cached_blocks(device);
      return time_steps(o, device, step);
    });
    current = kernels;
    kernels.apply();
    m = variants.front().result;
    if (o.profile) profile = profile_steps(o, device, step);
  } else {
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
    // A step of its own for each --variants entry (TrainStep reads train.weight_casts).
    const auto make_step = [&](const train::KernelChoices& k) {
      train.kernels = k;
      return std::make_unique<train::TrainStep>(*model, *optimizer, scaler.get(), ema.get(), *comm,
                                                train, train::DistributedOptions{});
    };
    std::unique_ptr<train::TrainStep> step = make_step(kernels);
    train::UpdateStats stats(device);
    std::ostringstream what;
    what << optimizer->name();
    if (train.clip_grad > 0) what << ", clip " << train.clip_grad;
    if (ema) what << ", EMA " << train.ema_decay;
    step_description = what.str();
    const std::function<void()> eager_step = [&] {
      stats.record(step->apply_update(step->micro_step(images, labels, true), optim_options.lr));
    };
    std::function<void()> train_step = eager_step;
    std::unique_ptr<train::GraphedStep> graphed;  // the trainer's train.cuda_graph step
    if (o.cuda_graph) {
      // As the trainer does: host draws that can move to the device do (CaiT's layer dropout).
      std::string moved;
      const std::string obstacle =
          train::prepare_capture(*model, *optimizer, device, 1, comm->backend(), train, &moved);
      SKA_CHECK(obstacle.empty(), ValueError, "--cuda-graph: ", obstacle);
      // Warm-up outside the capture: algorithm choices, optimizer state, constants on the device.
      for (int i = 0; i < 2; ++i) eager_step();
      try {
        graphed = std::make_unique<train::GraphedStep>(
            *step, *optimizer, stats, default_generator(device), images, labels, optim_options.lr);
      } catch (const Error& e) {
        SKA_FAIL(DeviceError, "--cuda-graph: the training step of ", o.config.config,
                 " could not be captured: ", e.what());
      }
      train_step = [&] { graphed->run(images, labels, optim_options.lr); };
    }
    time_variants(variants, o.rounds, [&](const train::KernelChoices& k) {
      if (variants.size() > 1) {
        k.apply();
        step = make_step(k);
        release_cached_blocks(device);
      }
      return time_steps(o, device, train_step);
    });
    if (variants.size() > 1) {
      kernels.apply();
      step = make_step(kernels);
    }
    m = variants.front().result;
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
                        {"peak_reserved_bytes", m.peak_reserved_bytes},
                        {"trainable_params", model->num_parameters(true)},
                        {"step", step_description},
                        {"cuda_graph", o.cuda_graph},
                        {"cudnn_benchmark", o.cudnn_benchmark}};
    if (m.device_rules_reserved_bytes >= 0) {
      j["device_rules_reserved_bytes"] = m.device_rules_reserved_bytes;
      j["device_rules_requested_bytes"] = m.device_rules_requested_bytes;
    }
    if (m.census) {
      nlohmann::json sizes = nlohmann::json::array();
      for (size_t i = 0; i < m.census->at_peak.size() && i < kCensusJsonSizes; ++i) {
        sizes.push_back({m.census->at_peak[i].bytes, m.census->at_peak[i].count});
      }
      j["memory_census"] = {{"peak_bytes", m.census->peak_bytes},
                            {"storages", m.census->peak_storages},
                            {"sizes", sizes}};
    }
    for (const train::KernelChoiceSpec& spec : train::kernel_choice_specs()) {
      j[spec.key] = kernels.*spec.member;
    }
    j["conv_logits_auto"] = ska::nn::conv_logits_auto_choices();
    j["depthwise_conv_auto"] = ska::cuda_depthwise_conv_choices();
    j["gemm_algorithm_timed"] = ska::cuda_gemm_choices();
    j["gflops_per_image"] = flops.gflops_per_image;
    if (activations >= 0) j["activation_bytes_per_image"] = activations;
    j["tflops"] = flops.tflops;
    if (flops.peak_tflops > 0) {
      j["peak_tflops"] = flops.peak_tflops;
      j["peak_of"] = flops.peak_of;
      j["mfu"] = flops.mfu();
    }
    if (profile) j["profile"] = profile_json(*profile, o.iters);
    if (variants.size() > 1) {
      nlohmann::json rows = nlohmann::json::array();
      for (const Variant& v : variants) {
        nlohmann::json choices;
        for (const train::KernelChoiceSpec& spec : train::kernel_choice_specs()) {
          choices[spec.key] = v.kernels.*spec.member;
        }
        choices["cudnn_benchmark"] = v.kernels.cudnn_benchmark;
        choices["cudnn_deterministic"] = v.kernels.cudnn_deterministic;
        nlohmann::json round_ms = nlohmann::json::array();
        for (const Measurement& r : v.rounds) round_ms.push_back(r.median_ms);
        rows.push_back({{"variant", v.label},
                        {"images_per_s", v.result.images_per_s},
                        {"median_ms", v.result.median_ms},
                        {"round_ms", round_ms},
                        {"peak_bytes", v.result.peak_bytes},
                        {"peak_requested_bytes", v.result.peak_requested_bytes},
                        {"peak_reserved_bytes", v.result.peak_reserved_bytes},
                        {"kernels", choices}});
      }
      j["variants"] = rows;
      j["rounds"] = o.rounds;
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << name << "  " << o.mode << "  " << device.str() << "  "
         << (o.precision == "fp32" ? o.dtype : o.precision + " autocast") << "  batch " << o.batch
         << ":  " << m.images_per_s << " images/s  (" << m.median_ms << " ms/step, median of "
         << o.iters << "), peak memory " << static_cast<double>(m.peak_bytes) / (1024.0 * 1024.0)
         << " MiB (tensors " << static_cast<double>(m.peak_requested_bytes) / (1024.0 * 1024.0)
         << " MiB, reserved " << static_cast<double>(m.peak_reserved_bytes) / (1024.0 * 1024.0)
         << " MiB";
    if (m.device_rules_reserved_bytes >= 0) {
      line << "; under the CUDA allocator's rules, kernels' scratch left out: "
           << static_cast<double>(m.device_rules_reserved_bytes) / (1024.0 * 1024.0)
           << " MiB reserved for "
           << static_cast<double>(m.device_rules_requested_bytes) / (1024.0 * 1024.0)
           << " MiB of tensors";
    }
    line << ")";
    if (o.cuda_graph) line << " [CUDA Graph]";
    line << kernels.describe({device.is_cuda(), o.mode == "train", o.precision != "fp32"});
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
    if (m.census) line << "\n  " << describe_census(*m.census, device);
    for (const std::string& choice : ska::nn::conv_logits_auto_choices()) {
      line << "\n  " << choice;
    }
    for (const std::string& choice : ska::cuda_depthwise_conv_choices()) {
      line << "\n  " << choice;
    }
    for (const std::string& choice : ska::cuda_gemm_choices()) {
      line << "\n  " << choice;
    }
    std::cout << line.str() << std::endl;
    if (variants.size() > 1) print_variants(variants, o.rounds, o.iters);
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
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->check(ska::apps::integer_in(0, 1000000));
  app.add_option("--iters", o.iters, "timed steps (the median is reported)")
      ->check(ska::apps::integer_in(1, 1000000));
  app.add_flag("--json", o.json, "print one JSON object");
  app.add_flag("--profile", o.profile,
               "then time every kernel over --iters more steps: where a step's time goes, by op "
               "family and by kernel (NVTX ranges name each kernel for Nsight)");
  app.add_option("--top", o.top, "kernels listed by --profile")
      ->check(ska::apps::integer_in(1, 100000));
  app.add_flag("--memory-census", o.memory_census,
               "also print what is live at the peak of tensors (the timed steps'), by size: "
               "how many tensors of each size and their MiB (a locked count per tensor made or "
               "freed, in the timed steps too)");
  app.add_flag("--capture-range", o.capture_range,
               "CUDA: the timed steps between cudaProfilerStart and cudaProfilerStop, so that "
               "ncu --profile-from-start off (scripts/gpu_kernels.sh) or nsys profile "
               "--capture-range=cudaProfilerApi record those steps only");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "CUDA: capture the step (infer: the forward; train: the whole training step) once "
               "as a CUDA Graph and time its replays (what the kernel launches cost)");
  app.add_option("--variants", o.variants,
                 "kernel-choice variants timed in this process after the command line's "
                 "choices: ';'-separated, each 'default' or ','-separated KEY=VALUE of train's "
                 "kernel keys (e.g. 'attention_backward=one_block;weight_casts=per_step,"
                 "linear_grads=f32'); prints a table ('variants' in --json)");
  app.add_option("--rounds", o.rounds,
                 "with --variants: times the list is timed in turn (each variant's median round "
                 "is reported; interleaving evens out drift)")
      ->check(ska::apps::integer_in(1, 10000));
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the peak TFLOP/s MFU is reported against (default: the GPU's bf16 dense peak "
                 "from a table of NVIDIA data sheets; none on the CPU)")
      ->check(ska::apps::number_above(0.0, /*inclusive=*/true));
  app.add_option("--cudnn-benchmark", o.cudnn_benchmark,
                 "on: time cuDNN's convolution algorithms on the first call of each shape and "
                 "keep the fastest (train.cudnn_benchmark's default); off: cuDNN's heuristics")
      ->check(CLI::IsMember({"on", "off"}));
  // The kernels' choices, as train.KEY takes them (--help shows each default).
  std::vector<std::pair<std::string, CLI::Option*>> kernel_options;
  for (const ska::train::KernelChoiceSpec& spec : ska::train::kernel_choice_specs()) {
    std::string flag = std::string("--") + spec.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string help =
        std::string(spec.help) + " (unless given: the config's train." + spec.key + ", if set)";
    CLI::Option* option = app.add_option(flag, o.kernels.*spec.member, help)
                              ->check(CLI::IsMember(spec.values))
                              ->capture_default_str();
    kernel_options.emplace_back(spec.key, option);
  }
  return ska::apps::run_main(app, argc, argv, [&] {
    for (const auto& [key, option] : kernel_options) {
      if (option->count() > 0) o.kernel_flags.insert(key);
    }
    return run_benchmark(o);
  });
}
