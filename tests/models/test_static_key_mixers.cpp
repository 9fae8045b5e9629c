// The lsa / ska / cska token mixers: parameter counts in the paper's models, flavour defaults and
// overrides, golden fixtures, f64 gradient checks of every activation and scale, CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "backend/profiler.h"
#include "core/random.h"
#include "models/metaformer.h"
#include "models/model.h"
#include "models/model_golden.h"
#include "models/swin_cvt_golden.h"
#include "models/vit.h"
#include "nn/mixers/attention_core.h"
#include "ops/autocast.h"
#include "support/test_util.h"

using namespace ska;

namespace {

// A mixer built from `mixer: <yaml>` for a width and token grid; check_unused() must pass.
nn::ModulePtr make_mixer(const std::string& mixer_yaml, int64_t dim, models::TokenGrid grid,
                         const std::string& family) {
  Config cfg = Config::parse("mixer: " + mixer_yaml);
  REQUIRE((family == "vit" || family == "metaformer"));
  const models::MixerArgs args = family == "metaformer" ? models::metaformer_mixer_args(dim, grid)
                                                        : models::vit_mixer_args(dim, grid);
  nn::ModulePtr mixer = models::build_mixer(cfg.root(), "mixer", args);
  cfg.check_unused();
  return mixer;
}

std::map<std::string, Shape> parameter_shapes(const nn::Module& m) {
  std::map<std::string, Shape> out;
  for (const auto& [name, t] : m.named_parameters()) out[name] = t.shape();
  return out;
}

const models::TokenGrid kVitGrid{8, 8, true};  // ViT-S on CIFAR: 64 patches + cls

}  // namespace

TEST_CASE("static-key mixers have the paper's parameter counts", "[cpu][mixers]") {
  SECTION("ViT-S blocks (C = 512, 8x8 patches + cls)") {
    CHECK(make_mixer("lsa", 512, kVitGrid, "vit")->num_parameters() ==
          3 * 512 * 512 + 512 * 512 + 512 + 1);
    CHECK(make_mixer("ska", 512, kVitGrid, "vit")->num_parameters() ==
          512 * 1280 + 10 * 65 * 64 + 640 * 512 + 512 + 1);
    CHECK(make_mixer("cska", 512, kVitGrid, "vit")->num_parameters() ==
          512 * 1024 + (9 * 65 * 512 + 8 * 65) + 8 * 65 * 64 + 512 * 512 + 512 + 1);
  }
  SECTION("CSKAFormer-S18 stage 1 (C = 128, 28x28): CSTU with h = 8, d = 16, 784 keys") {
    const nn::ModulePtr cstu = make_mixer("cska", 128, {28, 28, false}, "metaformer");
    CHECK(cstu->num_parameters() == 128 * 256 + (9 * 784 * 128 + 8 * 784) + 128 * 128);
    CHECK(parameter_shapes(*cstu).at("to_k.weight") == Shape{8 * 784, 16, 3, 3});
  }
  SECTION("SKAFormer-S18 stages 2 and 3: STU with q = x, heads of 32") {
    const nn::ModulePtr stage2 = make_mixer("ska", 320, {14, 14, false}, "metaformer");
    CHECK(stage2->num_parameters() == 320 * 320 + 10 * 196 * 32 + 320 * 320);
    const nn::ModulePtr stage3 = make_mixer("ska", 512, {7, 7, false}, "metaformer");
    CHECK(stage3->num_parameters() == 512 * 512 + 16 * 49 * 32 + 512 * 512);
  }
  SECTION("Table 4 ablations: StarReLU adds its scale and bias; no scaling adds nothing") {
    const int64_t base = make_mixer("cska", 128, {28, 28, false}, "metaformer")->num_parameters();
    CHECK(make_mixer("{type: cska, activation: starrelu}", 128, {28, 28, false}, "metaformer")
              ->num_parameters() == base + 2);
    CHECK(make_mixer("{type: cska, scale: false}", 128, {28, 28, false}, "metaformer")
              ->num_parameters() == base);
  }
}

TEST_CASE("static-key mixer flavours and overrides", "[cpu][mixers]") {
  SECTION("ska ViT flavour: qv, static k over all tokens, temperature, proj with bias") {
    const auto shapes = parameter_shapes(*make_mixer("ska", 16, {2, 2, true}, "vit"));
    CHECK(shapes.at("qv.weight") == Shape{2 * 640, 16});
    CHECK(shapes.at("k") == Shape{10, 5, 64});
    CHECK(shapes.at("temperature") == Shape{1});
    CHECK(shapes.count("proj.bias") == 1);
  }
  SECTION("ska MetaFormer flavour: no q projection, fixed scale, proj without bias") {
    const auto shapes = parameter_shapes(*make_mixer("ska", 64, {2, 2, false}, "metaformer"));
    CHECK(shapes.at("v.weight") == Shape{64, 64});
    CHECK(shapes.at("k") == Shape{2, 4, 32});
    CHECK(shapes.count("temperature") == 0);
    CHECK(shapes.count("proj.bias") == 0);
  }
  SECTION("overrides: flavour, heads, head_dim, biases, learnable temperature") {
    const auto shapes = parameter_shapes(*make_mixer(
        "{type: ska, flavour: vit, heads: 3, head_dim: 4, qkv_bias: true, proj_bias: false}", 8,
        {2, 2, false}, "metaformer"));
    CHECK(shapes.at("qv.bias") == Shape{24});
    CHECK(shapes.at("k") == Shape{3, 4, 4});
    CHECK(shapes.count("proj.bias") == 0);
    const auto learnable = parameter_shapes(
        *make_mixer("{type: cska, temperature: learnable}", 32, {2, 2, false}, "metaformer"));
    CHECK(learnable.count("temperature") == 1);
  }
  SECTION("cska ViT flavour: one temperature (the cls row), cls_k, conv over all keys") {
    const auto shapes = parameter_shapes(*make_mixer("cska", 16, {2, 2, true}, "vit"));
    CHECK(shapes.at("to_k.weight") == Shape{8 * 5, 64, 3, 3});
    CHECK(shapes.at("cls_k") == Shape{8, 5, 64});
    CHECK(shapes.count("temperature") == 1);
    const auto scaled =
        parameter_shapes(*make_mixer("{type: cska, scale: true}", 16, {2, 2, true}, "vit"));
    CHECK(scaled.count("temperature") == 1);  // shared by the conv rows and the cls row
  }
  SECTION("init follows the host family: trunc_normal(.02) + zero bias in MetaFormer") {
    const auto metaformer = make_mixer("cska", 64, {4, 4, false}, "metaformer")->state_dict();
    const double std = std::sqrt(mean(pow(metaformer.at("qv.weight"), 2.0)).item());
    CHECK(std == Approx(0.02).epsilon(0.1));
    CHECK(amax(abs(metaformer.at("to_k.bias"))).item() == 0.0);
    const auto vit = make_mixer("cska", 64, {4, 4, true}, "vit")->state_dict();
    CHECK(amax(abs(vit.at("qv.weight"))).item() <= 1.0 / std::sqrt(64.0));
    CHECK(amax(abs(vit.at("qv.weight"))).item() > 0.1);  // U(+-1/8), not trunc_normal(.02)
    const double key_std = std::sqrt(mean(pow(vit.at("cls_k"), 2.0)).item());
    CHECK(key_std == Approx(1.0).epsilon(0.1));  // static keys: randn
  }
  SECTION("identity queries need heads * head_dim == width") {
    REQUIRE_THROWS_WITH(make_mixer("{type: ska, heads: 3}", 64, {2, 2, false}, "metaformer"),
                        Catch::Contains("mixer.query"));
  }
  SECTION("tokens must match the static keys") {
    const nn::ModulePtr mixer = make_mixer("ska", 64, {2, 2, false}, "metaformer");
    REQUIRE_THROWS_AS((*mixer)(Tensor::zeros({1, 5, 64})), ShapeError);
  }
}

TEST_CASE("MetaFormer-flavour ska/cska match the PyTorch reference in f64",
          "[cpu][mixers][golden]") {
  for (const char* name :
       {"mixer_ska_metaformer", "mixer_ska_metaformer_gelu_noscale", "mixer_cska_metaformer",
        "mixer_cska_metaformer_starrelu", "mixer_cska_metaformer_relu_noscale"}) {
    SECTION(name) { test::check_model_golden(name); }
  }
}

TEST_CASE(
    "cska models match the PyTorch references with conv logits as a matrix product or by "
    "grid_conv_logits",
    "[cpu][mixers][golden]") {
  const nn::ConvLogitsForm form = GENERATE(nn::ConvLogitsForm::kGemm, nn::ConvLogitsForm::kDirect);
  CAPTURE(form == nn::ConvLogitsForm::kGemm ? "gemm" : "direct");
  const nn::ConvLogitsFormGuard guard(form);
  for (const char* name : {"mixer_cska_metaformer", "mixer_cska_metaformer_starrelu", "vit_cska",
                           "vit_cska_authors_order", "cait_cska"}) {
    SECTION(name) { test::check_model_golden(name); }
  }
  for (const char* name : {"swin_cska", "cvt_cska", "cvt_cska_static"}) {
    SECTION(name) { test::require_golden_model(name); }
  }
}

TEST_CASE("lsa, ska and cska gradients match central differences", "[cpu][mixers]") {
  struct GradCase {
    std::string mixer;
    models::TokenGrid grid;
    std::string family;
  };
  std::vector<GradCase> cases = {{"{type: lsa, heads: 2, head_dim: 2}", {2, 2, true}, "vit"}};
  for (const char* type : {"ska", "cska"}) {
    for (const char* activation : {"softmax", "gelu", "relu", "starrelu"}) {
      for (const char* scale : {"true", "false"}) {
        const std::string options = std::string("{type: ") + type + ", heads: 2, head_dim: 2, " +
                                    "activation: " + activation + ", scale: " + scale + "}";
        cases.push_back({options, {2, 2, true}, "vit"});
        cases.push_back({options, {2, 3, false}, "metaformer"});
      }
    }
  }
  for (const GradCase& c : cases) {
    INFO(c.mixer << " (" << c.family << ")");
    // The same weights whatever ran before in this process (relu's kink must stay clear of the
    // finite differences' steps).
    manual_seed(7);
    const nn::ModulePtr mixer = make_mixer(c.mixer, 4, c.grid, c.family);
    mixer->to(DType::kF64);
    TensorList inputs = {test::uniform({2, c.grid.tokens(), 4}, 17).set_requires_grad(true)};
    for (const Tensor& p : mixer->parameters()) inputs.push_back(p);
    test::check_gradients([&](const TensorList& in) { return (*mixer)(in[0]); }, inputs);
  }
}

TEST_CASE("cska under autocast: the logits stay 16-bit from their products to the attention",
          "[cpu][mixers][autocast]") {
  // ViT flavour: the class row scaled by a learnable f32 temperature, the grid rows unscaled; the
  // diagonal mask in the kernels. Neither the forward nor the backward pass has an f32 tensor of
  // the logits' size (a cat in f32, the mask on it, casts each way, as before). The direct conv
  // logits write the grid rows into the logits' tensor: the forward pass copies the class row
  // alone, where the convolution's logits are copied in.
  const nn::ConvLogitsForm form = GENERATE(nn::ConvLogitsForm::kConv, nn::ConvLogitsForm::kDirect);
  const bool direct = form == nn::ConvLogitsForm::kDirect;
  CAPTURE(direct);
  const nn::ConvLogitsFormGuard guard(form);
  for (const bool authors_order : {false, true}) {
    INFO("authors_row_order " << authors_order);
    manual_seed(11);
    const nn::ModulePtr mixer =
        make_mixer(std::string("{type: cska, heads: 4, head_dim: 8, authors_row_order: ") +
                       (authors_order ? "true}" : "false}"),
                   32, kVitGrid, "vit");
    const Tensor x = test::uniform({2, kVitGrid.tokens(), 32}, 19, -1, 1, DType::kF32);
    const Tensor xg = x.clone().set_requires_grad(true);
    Tensor y;
    std::vector<profiler::KernelTime> forward, calls;
    {
      AutocastGuard autocast(DType::kBF16);
      forward = test::kernels_of([&] { y = (*mixer)(xg); });
      calls = test::kernels_of([&] { sum(y.to(DType::kF32)).backward(); });
      calls.insert(calls.end(), forward.begin(), forward.end());
    }
    for (const auto& c : calls) {
      INFO(c.name << ": " << c.operands);
      CHECK(c.operands.find("65, 65] f32") == std::string::npos);
      CHECK(c.operands.find("64, 65] f32") == std::string::npos);
      CHECK(c.name != "where");
    }
    int64_t grid_row_copies = 0;
    for (const auto& c : forward) {
      if (c.name == "copy" && c.operands.find("64, 65] bf16") != std::string::npos) {
        grid_row_copies += c.calls;
      }
    }
    CHECK(grid_row_copies == (direct ? 0 : 1));
    // The fused op reads the logits in rows padded to 16 bytes (empty_aligned_rows: 65 keys in
    // rows of 72), and its backward writes their gradient so.
    for (const char* kernel : {"attention_forward", "attention_backward"}) {
      INFO(kernel);
      int64_t padded = 0;
      for (const auto& c : calls) {
        if (c.name == kernel &&
            c.operands.find("[2, 4, 65, 65] bf16 (strided)") != std::string::npos)
          padded += c.calls;
      }
      CHECK(padded == 1);
    }
    // The values of the f32 mixer within bf16's tolerance, the temperature's gradient in f32.
    const Tensor reference = (*mixer)(x);
    test::require_close(y.to(DType::kF32), reference, test::tolerance_for(DType::kBF16), "output");
    for (const auto& [name, p] : mixer->named_parameters()) {
      INFO(name);
      CHECK(p.grad().dtype() == DType::kF32);
    }
  }
}

TEST_CASE("static-key mixers agree on CUDA and CPU", "[cuda][mixers]") {
  if (!test::cuda_available_or_skip()) return;
  struct ParityCase {
    const char* mixer;
    models::TokenGrid grid;
    const char* family;
  };
  const ParityCase cases[] = {
      {"lsa", {4, 4, true}, "vit"},
      {"ska", {4, 4, true}, "vit"},
      {"cska", {4, 4, true}, "vit"},
      {"{type: ska, head_dim: 8}", {4, 4, false}, "metaformer"},
      {"cska", {4, 4, false}, "metaformer"},
      {"{type: cska, activation: starrelu, scale: false}", {4, 4, false}, "metaformer"},
  };
  for (const ParityCase& c : cases) {
    SECTION(std::string(c.mixer) + " " + c.family) {
      test::check_module_cuda_parity(
          [&] { return make_mixer(c.mixer, 32, c.grid, c.family); },
          test::uniform({2, c.grid.tokens(), 32}, 23, -1.0, 1.0, DType::kF32));
    }
    if (std::string(c.mixer).find("cska") == std::string::npos) continue;
    SECTION(std::string(c.mixer) + " " + c.family + ", conv logits as a matrix product") {
      const nn::ConvLogitsFormGuard gemm(nn::ConvLogitsForm::kGemm);
      test::check_module_cuda_parity(
          [&] { return make_mixer(c.mixer, 32, c.grid, c.family); },
          test::uniform({2, c.grid.tokens(), 32}, 23, -1.0, 1.0, DType::kF32));
    }
    // In f32 the direct form takes the convolution on CUDA and the reference loops on the CPU;
    // tests/cuda/test_conv_logits.cpp runs its kernels (bf16) against both.
    SECTION(std::string(c.mixer) + " " + c.family + ", conv logits direct (CPU loops, CUDA conv)") {
      const nn::ConvLogitsFormGuard direct(nn::ConvLogitsForm::kDirect);
      test::check_module_cuda_parity(
          [&] { return make_mixer(c.mixer, 32, c.grid, c.family); },
          test::uniform({2, c.grid.tokens(), 32}, 23, -1.0, 1.0, DType::kF32));
    }
  }
}
