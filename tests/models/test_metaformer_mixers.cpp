// The MetaFormer family's own token mixers (mhsa, sepconv, pooling, identity): shapes, options,
// f64 gradient checks at tiny sizes, a pooling reference, and CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <algorithm>
#include <string>

#include "core/random.h"
#include "models/metaformer.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::tolerance_for;

namespace {

// A mixer from an inline YAML spec (a bare name or a map), in f64 on the CPU.
nn::ModulePtr make_mixer(const std::string& spec, const models::MixerArgs& args) {
  Config config = Config::parse("mixer: " + spec);
  nn::ModulePtr mixer = models::build_mixer_from_node(config.root()["mixer"], args);
  config.check_unused();
  mixer->to(DType::kF64);
  return mixer;
}

// Checks d sum(mixer(x) * w) / d(x, every parameter) against central differences.
void check_mixer_gradients(const nn::ModulePtr& mixer, const Shape& x_shape) {
  TensorList inputs = {ska::test::uniform(x_shape, 5).set_requires_grad(true)};
  for (const Tensor& p : mixer->parameters(true)) inputs.push_back(p);
  ska::test::check_gradients([&](const TensorList& in) { return (*mixer)(in[0]); }, inputs);
}

// The same mixer built twice from one seed, one on CUDA: outputs and input gradients agree.
void check_mixer_cuda_parity(const std::string& spec, const models::MixerArgs& args,
                             const Shape& x_shape) {
  if (!ska::test::cuda_available_or_skip()) return;
  manual_seed(3);
  nn::ModulePtr cpu = make_mixer(spec, args);
  manual_seed(3);
  nn::ModulePtr gpu = make_mixer(spec, args);
  cpu->to(DType::kF32);
  gpu->to(DType::kF32);
  gpu->to(Device::cuda(0));
  const Tensor x = ska::test::uniform(x_shape, 9, -1.0, 1.0, DType::kF32);
  const Tensor x_cpu = x.clone().set_requires_grad(true);
  const Tensor x_gpu = x.to(Device::cuda(0)).set_requires_grad(true);
  const Tensor y_cpu = (*cpu)(x_cpu), y_gpu = (*gpu)(x_gpu);
  ska::test::require_close(y_gpu, y_cpu, tolerance_for(DType::kF32), spec + " output");
  const Tensor w = ska::test::uniform(y_cpu.shape(), 10, -1.0, 1.0, DType::kF32);
  sum(mul(y_cpu, w)).backward();
  sum(mul(y_gpu, w.to(Device::cuda(0)))).backward();
  ska::test::require_close(x_gpu.grad(), x_cpu.grad(), tolerance_for(DType::kF32),
                           spec + " input gradient");
}

const models::MixerArgs kGridArgs = models::metaformer_mixer_args(6, models::TokenGrid{3, 4, false});

}  // namespace

TEST_CASE("mhsa: heads, widths, biases and parameter names", "[cpu][mixers]") {
  const models::MixerArgs args = models::metaformer_mixer_args(64, models::TokenGrid{2, 2, false});
  nn::ModulePtr plain = make_mixer("mhsa", args);  // head_dim 32 -> 2 heads, no biases
  CHECK(plain->num_parameters() == 4 * 64 * 64);
  nn::ModulePtr narrow = make_mixer("mhsa", models::metaformer_mixer_args(16, args.grid));  // one 32-wide head
  CHECK(narrow->state_dict().at("qkv.weight").shape() == Shape{96, 16});
  nn::ModulePtr biased = make_mixer("{type: mhsa, heads: 3, head_dim: 8, qkv_bias: true}", args);
  CHECK(biased->state_dict().at("qkv.bias").shape() == Shape{72});
  CHECK(biased->state_dict().count("proj.bias") == 0);
  CHECK((*biased)(ska::test::uniform({2, 4, 64}, 1)).shape() == Shape{2, 4, 64});
}

TEST_CASE("mhsa gradients (class token included)", "[cpu][mixers]") {
  const models::MixerArgs args = models::vit_mixer_args(8, models::TokenGrid{2, 2, true});
  check_mixer_gradients(
      make_mixer("{type: mhsa, heads: 2, head_dim: 4, qkv_bias: true, proj_bias: true}", args),
      {2, 5, 8});
}

TEST_CASE("sepconv: parameters and gradients", "[cpu][mixers]") {
  nn::ModulePtr mixer = make_mixer("sepconv", kGridArgs);
  // pwconv1 6x12, StarReLU 2, depthwise 12x7x7, pwconv2 12x6, no biases.
  CHECK(mixer->num_parameters() == 72 + 2 + 12 * 49 + 72);
  check_mixer_gradients(mixer, {2, 12, 6});
  check_mixer_gradients(make_mixer("{type: sepconv, kernel_size: 3, bias: true}", kGridArgs),
                        {1, 12, 6});
}

TEST_CASE("pooling: avgpool3x3(x) - x without counting the padding", "[cpu][mixers]") {
  nn::ModulePtr mixer = make_mixer("pooling", models::metaformer_mixer_args(1, models::TokenGrid{2, 3, false}));
  CHECK(mixer->num_parameters() == 0);
  // Grid [[1, 2, 3], [4, 5, 6]]: the corner (0, 0) averages {1, 2, 4, 5} over 4 taps.
  const Tensor x = ska::test::values({1, 2, 3, 4, 5, 6}, {1, 6, 1});
  const Tensor expected =
      ska::test::values({3.0 - 1, 3.5 - 2, 4.0 - 3, 3.0 - 4, 3.5 - 5, 4.0 - 6}, {1, 6, 1});
  ska::test::require_close((*mixer)(x), expected, tolerance_for(DType::kF64), "pooling");
  check_mixer_gradients(make_mixer("pooling", kGridArgs), {2, 12, 6});
}

TEST_CASE("identity mixer passes tokens through", "[cpu][mixers]") {
  nn::ModulePtr mixer = make_mixer("identity", kGridArgs);
  const Tensor x = ska::test::uniform({1, 12, 6}, 2);
  ska::test::require_close((*mixer)(x), x, tolerance_for(DType::kF64), "identity");
}

TEST_CASE("metaformer mixers reject a wrong token count", "[cpu][mixers]") {
  nn::ModulePtr mixer = make_mixer("sepconv", kGridArgs);
  REQUIRE_THROWS_AS((*mixer)(ska::test::uniform({1, 11, 6}, 2)), ShapeError);
}

TEST_CASE("metaformer mixers: CUDA parity", "[cuda][mixers]") {
  check_mixer_cuda_parity("{type: mhsa, heads: 2, head_dim: 4, qkv_bias: true}", kGridArgs,
                          {2, 12, 6});
  check_mixer_cuda_parity("sepconv", kGridArgs, {2, 12, 6});
  check_mixer_cuda_parity("pooling", kGridArgs, {2, 12, 6});
}

TEST_CASE("every registered mixer initialises its layers as the hosting family says",
          "[cpu][mixers]") {
  // The MetaFormer family asks for trunc_normal(.02) with zero biases (its reference resets every
  // Linear and Conv2d): each mixer must honour MixerArgs.init itself, since the family no longer
  // re-draws any mixer's weights.
  models::register_builtin_models();
  for (const std::string& type : models::mixer_registry().names()) {
    INFO("mixer " << type);
    manual_seed(1);
    const models::MixerArgs args = models::metaformer_mixer_args(64, models::TokenGrid{4, 4, false});
    Config config = Config::parse("mixer: {type: " + type + "}");
    const nn::ModulePtr mixer = models::build_mixer_from_node(config.root()["mixer"], args);
    int64_t layers = 0;
    for (const auto& [name, module] : mixer->named_modules()) {
      Tensor weight, bias;
      if (auto* linear = dynamic_cast<nn::Linear*>(module)) {
        weight = linear->weight;
        bias = linear->bias;
      } else if (auto* conv = dynamic_cast<nn::Conv2d*>(module)) {
        weight = conv->weight;
        bias = conv->bias;
      } else {
        continue;
      }
      INFO("layer " << name << " " << weight.str());
      ++layers;
      const std::vector<double> w = weight.to_vector<double>();
      double sum_sq = 0.0, largest = 0.0;
      for (double v : w) {
        sum_sq += v * v;
        largest = std::max(largest, std::abs(v));
      }
      // N(0, .02) (timm truncates at +-2, far out): PyTorch's default for these widths is
      // U(-1/8, 1/8) or wider, with a standard deviation of .07 or more.
      CHECK(largest <= 0.12);
      if (w.size() >= 1000) CHECK(std::sqrt(sum_sq / w.size()) == Approx(0.02).epsilon(0.1));
      if (bias.defined()) {
        for (double v : bias.to_vector<double>()) CHECK(v == 0.0);
      }
    }
    const bool weightless = type == "identity" || type == "pooling";
    CHECK((layers == 0) == weightless);
  }
}
