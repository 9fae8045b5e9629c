// Every model of the zoo (configs/models/*.yaml), at full size and reduced to a layer or two a
// stage (test::zoo_config), on CUDA against the CPU: a training forward (dropout and drop-path
// drawn from the same Philox streams on both), the logits, and the gradient of every parameter,
// in strict f32 and under bf16 autocast, with the CPU's f64 pass as the exact result where a
// quantity is too ill-conditioned for the two to agree closely.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/precision.h"
#include "core/random.h"
#include "models/model.h"
#include "ops/autocast.h"
#include "train/options.h"
#include "support/test_util.h"

using namespace ska;
using train::KernelChoices;

namespace {

double sum_of_squares(const Tensor& t) {
  double s = 0.0;
  for (double v : t.to_vector<double>()) s += v * v;
  return s;
}

// The Euclidean distance between a and b.
double distance(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
  return std::sqrt(s);
}

struct Pass {
  Tensor logits;  // on the CPU, f64
  // On the CPU, f64; undefined for parameters the pass did not reach (a layer dropped whole).
  std::vector<std::pair<std::string, Tensor>> grads;
};

// One training-mode forward and backward of `model` on `device` (cross-entropy of the images),
// the random draws reseeded first so that every pass draws the same masks.
Pass run_pass(nn::Module& model, const Tensor& images, const Tensor& labels, Device device,
              bool bf16, bool training = true, DType dtype = DType::kF32) {
  for (const auto& [name, p] : model.named_parameters(true)) p.zero_grad();
  manual_seed(123);
  // Each device has its own generator, seeded differently (as PyTorch's): give the device's the
  // host's seed, so that both passes draw the same dropout and drop-path masks.
  default_generator(device).set_state(default_generator(Device::cpu()).seed(), 0);
  model.train(training);
  Tensor logits, loss;
  {
    const AutocastGuard autocast(DType::kBF16, bf16);  // the loss too, as the trainer does
    logits = model(images.to(device, dtype));
    loss = cross_entropy(logits, labels.to(device));
  }
  loss.backward();
  Pass out;
  out.logits = logits.to(Device::cpu(), DType::kF64);
  for (const auto& [name, p] : model.named_parameters(true)) {
    out.grads.emplace_back(name, p.grad().defined() ? p.grad().to(Device::cpu(), DType::kF64)
                                                    : Tensor());
  }
  return out;
}

struct Setup {
  nn::ModulePtr model;
  Tensor images, labels;
};

// Model `name` of configs/models/ at full size or reduced (test::zoo_config), seeded weights,
// and seeded images (two; 16 for CvT).
Setup build(const std::string& name, bool reduced) {
  Config config = test::zoo_config(name, reduced);
  // CaiT's layer dropout draws on the host generator, which the CPU pass's dropout masks share
  // and the CUDA pass's do not: the two passes would drop different layers. Every layer is kept
  // (the layers' arithmetic is what is compared; the draw is tested on the CPU).
  if (config.root().has("layer_dropout")) config.set("layer_dropout=0");
  manual_seed(0);
  Setup s;
  s.model = models::build_model(config.root());
  const int64_t size = config.root().get<int64_t>("image_size");
  const int64_t channels = config.root().get<int64_t>("in_channels", 3);
  // CvT's convolutional projections normalise with batch statistics: over two images its last
  // stage has 8 values per channel, and under bf16 the CPU's own gradients come out NMSE 0.3 to
  // 0.9 from the f64 ones; over 16 images, 3e-4.
  const int64_t batch = config.root().get<std::string>("family") == "cvt" ? 16 : 2;
  s.images = test::uniform({batch, channels, size, size}, 5, -2.0, 2.0, DType::kF32);
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % 2;
  s.labels = Tensor::from_vector(labels, {batch});
  return s;
}

// The logits' NMSE between the CPU and `device` with `choices` applied (training mode or not);
// the defaults are restored afterwards.
double logits_nmse(const std::string& name, bool reduced, Device device, bool bf16, bool training,
                   const KernelChoices& choices) {
  choices.apply();
  Setup s = build(name, reduced);
  const Pass cpu = run_pass(*s.model, s.images, s.labels, Device::cpu(), bf16, training);
  s.model->to(device);
  const Pass other = run_pass(*s.model, s.images, s.labels, device, bf16, training);
  KernelChoices{}.apply();
  return test::nmse(other.logits, cpu.logits);
}

// After a mismatch: the logits' NMSE with one thing at a time taken out of the picture (dropout
// and drop-path by evaluation mode, then each fast path switched back to its reference), as
// warnings, so that one run names the part to blame.
void localize(const std::string& name, bool reduced, Device device, bool bf16) {
  struct Variant {
    const char* what;
    bool training;
    KernelChoices choices;
  };
  std::vector<Variant> variants = {{"as tested", true, {}}, {"evaluation mode", false, {}}};
  for (const char* attention : {"scalar", "unfused"}) {
    KernelChoices k;
    k.attention = attention;
    variants.push_back({attention, true, k});
    variants.push_back({attention, false, k});
  }
  KernelChoices reference;
  reference.elementwise = "reference";
  reference.norm_output = "f32";
  variants.push_back({"reference elementwise, f32 norm outputs", true, reference});
  reference.attention = "unfused";
  variants.push_back({"all references, unfused attention", false, reference});
  for (const Variant& v : variants) {
    try {
      WARN(name << (bf16 ? " bf16" : " f32") << ", " << v.what
                << (v.training ? " (training)" : " (evaluation)") << ": logits NMSE "
                << logits_nmse(name, reduced, device, bf16, v.training, v.choices));
    } catch (const std::exception& e) {
      KernelChoices{}.apply();
      WARN(name << ", " << v.what << ": " << e.what());
    }
  }
}

// Whether `actual` (the device's) agrees with `cpu` (the CPU twin's, same precision), `exact`
// being the CPU's f64 result: within the NMSE bound of the CPU's; or, where the quantity is
// ill-conditioned in this precision (a sum that cancels, such as the gradient of a key bias
// that softmax ignores) and the CPU is itself far from the f64 result, no further from it than
// 4 times the CPU (plus `floor`, a negligible share of the whole gradient).
bool agrees(const Tensor& actual, const Tensor& cpu, const Tensor& exact, double bound,
            double floor) {
  if (test::nmse(actual, cpu) < bound) return true;
  const double error = distance(actual, exact), cpu_error = distance(cpu, exact);
  UNSCOPED_INFO("NMSE against the CPU " << test::nmse(actual, cpu) << " (bound " << bound
                << "); distance to the f64 result " << error << ", the CPU's " << cpu_error
                << ", floor " << floor);
  return error <= 4.0 * cpu_error + floor;
}

// Runs model `name` on the CPU and then on `device` (f32 with TF32 off, or bf16 autocast on both:
// the CPU emulates 16-bit rounding), and on the CPU in f64 as the exact result, and compares (see
// agrees). NMSE bounds: f32 only reorders sums; bf16 keeps 8 mantissa bits, so every op rounds at
// about 4e-3 relative. One-element parameters (temperatures, StarReLU's scale and bias) have
// gradients that sum a whole activation with cancellation: one such error says little (the
// CPU's own bf16 error reaches several times the value), so where one misses the NMSE bound they
// are judged together: the device's distance to the f64 results over all of them, against the
// CPU's. Returns whether all agreed.
bool compare_devices(const std::string& name, Device device, bool bf16, bool reduced = false) {
  INFO(name << (reduced ? " (reduced)" : "") << (bf16 ? " under bf16 autocast" : " in f32")
            << " on " << device);
  const Tf32Guard strict(Tf32Policy{false, false});
  Setup s = build(name, reduced);
  const Pass cpu = run_pass(*s.model, s.images, s.labels, Device::cpu(), bf16);
  s.model->to(device);
  const Pass other = run_pass(*s.model, s.images, s.labels, device, bf16);
  s.model->to(Device::cpu());
  s.model->to(DType::kF64);
  const Pass exact =
      run_pass(*s.model, s.images, s.labels, Device::cpu(), false, true, DType::kF64);
  double total = 0.0;  // the whole gradient's norm, for the floor
  for (const auto& [param, g] : exact.grads) total += g.defined() ? sum_of_squares(g) : 0.0;
  const double floor = (bf16 ? 1e-6 : 1e-9) * std::sqrt(total);

  const double bound = bf16 ? 2e-3 : 1e-8, grad_bound = bf16 ? 1e-2 : 1e-6;
  bool ok = agrees(other.logits, cpu.logits, exact.logits, bound, 0.0);
  CHECK(ok);
  REQUIRE(other.grads.size() == cpu.grads.size());
  double scalar_error = 0.0, scalar_cpu_error = 0.0;  // sums of squared distances
  std::string scalars_missed;
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    const std::string& param = cpu.grads[i].first;
    const Tensor &g = other.grads[i].second, &g_cpu = cpu.grads[i].second;
    INFO("gradient of " << param);
    REQUIRE(other.grads[i].first == param);
    REQUIRE(g.defined() == g_cpu.defined());
    if (!g_cpu.defined()) continue;
    // A gradient that is exactly zero on the CPU must be zero on the other device too.
    if (sum_of_squares(g_cpu) == 0.0) {
      CHECK(sum_of_squares(g) == 0.0);
      continue;
    }
    if (g.numel() == 1) {
      scalar_error += std::pow(distance(g, exact.grads[i].second), 2);
      scalar_cpu_error += std::pow(distance(g_cpu, exact.grads[i].second), 2);
      if (test::nmse(g, g_cpu) >= grad_bound) scalars_missed += " " + param;
      continue;
    }
    const bool grad_ok = agrees(g, g_cpu, exact.grads[i].second, grad_bound, floor);
    ok = ok && grad_ok;
    CHECK(grad_ok);
  }
  if (!scalars_missed.empty()) {
    INFO("one-element gradients beyond the NMSE bound:" << scalars_missed);
    INFO("distance to the f64 results over all one-element gradients " << std::sqrt(scalar_error)
         << ", the CPU's " << std::sqrt(scalar_cpu_error) << ", floor " << floor);
    const bool scalars_ok = std::sqrt(scalar_error) <= 4.0 * std::sqrt(scalar_cpu_error) + floor;
    ok = ok && scalars_ok;
    CHECK(scalars_ok);
  }
  return ok;
}

}  // namespace

TEST_CASE("zoo: a training pass reseeded repeats itself on the CPU (the parity harness)",
          "[cpu][models]") {
  // The CUDA comparison below relies on reseeding to draw the same dropout masks on both
  // devices; here the CPU is compared with itself through the same harness, dropout on.
  CHECK(compare_devices("cait_s", Device::cpu(), false));
}

namespace {

// Every model is compared even after one fails or throws; the first failures are localized.
void compare_zoo(bool reduced) {
  int localized = 0;
  for (const std::string& name : test::zoo_models()) {
    for (const bool bf16 : {false, true}) {
      bool ok = false;
      CHECK_NOTHROW(ok = compare_devices(name, Device::cuda(0), bf16, reduced));
      if (!ok && localized++ < 4) localize(name, reduced, Device::cuda(0), bf16);
    }
  }
}

}  // namespace

TEST_CASE("zoo on CUDA: logits and every parameter gradient of every model match the CPU",
          "[cuda][models][slow]") {
  if (!test::cuda_available_or_skip()) return;
  compare_zoo(false);
}

TEST_CASE("zoo on CUDA, reduced: logits and every parameter gradient of every model match the CPU",
          "[cuda][models]") {
  if (!test::cuda_available_or_skip()) return;
  compare_zoo(true);
}

TEST_CASE(
    "zoo on CUDA: cska models with conv logits as a matrix product or by "
    "grid_conv_logits match the CPU",
    "[cuda][models][slow]") {
  if (!test::cuda_available_or_skip()) return;
  // train.conv_logits: gemm or direct on both devices (the CPU's equality with the convolution is
  // tested in f64 on the CPU), against the same exact f64 result. direct runs this project's
  // kernels in bf16 (f32 takes the convolution).
  const std::string form = GENERATE(as<std::string>{}, "gemm", "direct");
  CAPTURE(form);
  KernelChoices gemm;
  gemm.conv_logits = form;
  gemm.apply();
  for (const char* name :
       {"cska_vit_s", "cska_cait_s", "cska_swin_t", "cska_cvt_13", "cskaformer_s18"}) {
    for (const bool bf16 : {false, true}) {
      if (form == "direct" && !bf16) continue;  // f32 on CUDA takes the convolution
      bool ok = false;
      CHECK_NOTHROW(ok = compare_devices(name, Device::cuda(0), bf16));
      CHECK(ok);
    }
  }
  KernelChoices{}.apply();
}
