// Tests of the `swin` family: parameter counts of the CIFAR configs (reference table), golden logits and
// gradients against scripts/golden_models/swin.py, window-attention gradient checks, CUDA parity.
#include <catch2/catch.hpp>

#include "models/swin.h"
#include "models/swin_cvt_golden.h"

using namespace ska;
using namespace ska::test;

TEST_CASE("swin configs reproduce the reference parameter counts", "[cpu][slow][models][swin]") {
  // 100 classes: + 90 * (768 + 1); one input channel: - 2 * 2 * 2 * 96 in the first merge.
  require_param_count("swin_t", 26598646, 26598646 + 69210 - 768);
  require_param_count("ska_swin_t", 24577270, 24577270 + 69210 - 768);
  require_param_count("cska_swin_t", 26883574, 26883574 + 69210 - 768);
}

TEST_CASE("swin shift masks are non-trainable parameters", "[cpu][models][swin]") {
  nn::ModulePtr model = build_model_file(repo_path("configs/models/swin_t.yaml"));
  // 6 shifted blocks (1 + 1 + 3 + 1) x 2 masks of 16 x 16.
  CHECK(model->num_parameters(false) - model->num_parameters(true) == 6 * 2 * 256);
  bool found = false;
  for (const auto& [name, p] : model->named_parameters())
    if (name == "stages.2.blocks.5.attn.left_right_mask") found = !p.requires_grad();
  CHECK(found);
}

TEST_CASE("swin models match the PyTorch reference", "[cpu][models][swin][golden]") {
  for (const char* name : {"swin_mhsa", "swin_ska", "swin_cska"}) require_golden_model(name);
}

TEST_CASE("window attention gradients", "[cpu][models][swin]") {
  for (const char* kind : {"mhsa", "ska", "cska"}) {
    for (bool shifted : {false, true}) {
      INFO(kind << (shifted ? " shifted" : " regular"));
      models::WindowAttentionOptions o;
      o.kind = nn::attention_kind(kind);
      o.dim = 3;
      o.heads = 2;
      o.head_dim = 2;
      o.window = 2;
      o.grid_h = 4;
      o.grid_w = 2;
      o.shifted = shifted;
      auto attn = std::make_shared<models::WindowAttention>(o);
      attn->to(DType::kF64);
      TensorList inputs = {uniform({2, 4, 2, 3}, 7).set_requires_grad()};
      for (const auto& [name, p] : attn->named_parameters(true)) inputs.push_back(p);
      check_gradients([&](const TensorList& in) { return (*attn)(in[0]); }, inputs);
    }
  }
}

TEST_CASE("swin config errors name the path", "[cpu][models][swin]") {
  Config bad_mixer = Config::load(repo_path("configs/models/swin_t.yaml"));
  bad_mixer.set("mixer=skaa");
  REQUIRE_THROWS_WITH(models::build_model(bad_mixer.root()),
                      Catch::Contains("mixer") && Catch::Contains("did you mean 'ska'"));
  Config bad_grid = Config::load(repo_path("configs/models/swin_t.yaml"));
  bad_grid.set("image_size=24");
  REQUIRE_THROWS_WITH(models::build_model(bad_grid.root()),
                      Catch::Contains("downscaling_factors") && Catch::Contains("window_size"));
}

TEST_CASE("swin models on CUDA match the CPU", "[cuda][models][swin]") {
  for (const char* name : {"swin_mhsa", "swin_ska", "swin_cska"}) {
    INFO(name);
    require_model_cuda_parity(name);
  }
}
