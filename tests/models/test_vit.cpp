// The `vit` family: exact parameter counts of the paper's configs, golden models against our
// PyTorch reference (scripts/golden_models/vit.py), config errors, resolution and CUDA parity.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "io/safetensors.h"
#include "models/model.h"
#include "models/model_golden.h"
#include "models/vit.h"
#include "support/test_util.h"

using namespace ska;

namespace {

std::string model_config_path(const std::string& name) {
  return std::string(SKA_SOURCE_DIR) + "/configs/models/" + name + ".yaml";
}

int64_t trainable_parameters(Config cfg) {
  const nn::ModulePtr model = models::build_model(cfg.root());
  cfg.check_unused();
  return model->num_parameters(true);
}

// The SPT LayerNorm + Linear shrink by 2 * 160 + 160 * 512 with one input channel instead of 3;
// the head grows by 90 * (512 + 1) with 100 classes.
constexpr int64_t kOneChannelDelta = -(2 * 160 + 160 * 512);
constexpr int64_t kHundredClassesDelta = 90 * (512 + 1);

}  // namespace

namespace {

// Builds the config three times (as is, 100 classes, one input channel) and checks the counts.
void check_config_counts(const std::string& config, int64_t params) {
  CHECK(trainable_parameters(Config::load(model_config_path(config))) == params);
  Config hundred = Config::load(model_config_path(config));
  hundred.set("num_classes=100");
  CHECK(trainable_parameters(hundred) == params + kHundredClassesDelta);
  Config grey = Config::load(model_config_path(config));
  grey.set("in_channels=1");
  CHECK(trainable_parameters(grey) == params + kOneChannelDelta);
}

}  // namespace

// Full-size models (10M parameters each, built three times): [slow].
TEST_CASE("vit_s has the paper's parameter count", "[cpu][models][vit][slow]") {
  check_config_counts("vit_s", 9622512);
}
TEST_CASE("ska_vit_s has the paper's parameter count", "[cpu][models][vit][slow]") {
  check_config_counts("ska_vit_s", 9478896);
}
TEST_CASE("cska_vit_s has the paper's parameter count", "[cpu][models][vit][slow]") {
  check_config_counts("cska_vit_s", 10049568);
}

TEST_CASE("vit derives the token grid and key count from the resolution", "[cpu][models][vit]") {
  // 16x16 images with 4x4 patches: 16 patches + cls, so static keys [h, 17, d] and a conv with
  // h * 17 outputs; a forward pass at that resolution works.
  Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_cska.yaml");
  cfg.set("image_size=16");
  cfg.set("patch_size=4");
  const nn::ModulePtr model = models::build_model(cfg.root());
  const auto state = model->state_dict();
  CHECK(state.at("pos_embed").shape() == Shape{1, 17, 16});
  CHECK(state.at("blocks.0.mixer.cls_k").shape() == Shape{2, 17, 4});
  CHECK(state.at("blocks.0.mixer.to_k.weight").shape() == Shape{34, 4, 3, 3});
  model->eval();
  const Tensor logits = (*model)(test::uniform({2, 2, 16, 16}, 3, -1.0, 1.0, DType::kF32));
  CHECK(logits.shape() == Shape{2, 3});
}

TEST_CASE("vit config errors name the path", "[cpu][models][vit]") {
  SECTION("patch size must divide the image") {
    Config cfg = Config::load(model_config_path("vit_s"));
    cfg.set("patch_size=5");
    REQUIRE_THROWS_WITH(models::build_model(cfg.root()),
                        Catch::Contains("patch_size") && Catch::Contains("multiple"));
  }
  SECTION("unknown mixer type suggests the closest") {
    Config cfg = Config::load(model_config_path("vit_s"));
    cfg.set("mixer=cksa");
    REQUIRE_THROWS_WITH(models::build_model(cfg.root()),
                        Catch::Contains("mixer") && Catch::Contains("cska"));
  }
  SECTION("unknown mixer option is rejected by check_unused") {
    Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_cska.yaml");
    cfg.set("mixer.activaton=gelu");
    models::build_model(cfg.root());
    REQUIRE_THROWS_WITH(cfg.check_unused(), Catch::Contains("activaton"));
  }
  SECTION("bad activation choice") {
    Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_ska.yaml");
    cfg.set("mixer.activation=tanh");
    REQUIRE_THROWS_WITH(models::build_model(cfg.root()), Catch::Contains("mixer.activation"));
  }
}

TEST_CASE("vit golden models match the PyTorch reference in f64", "[cpu][models][vit][golden]") {
  for (const char* name : {"vit_lsa", "vit_ska", "vit_cska", "vit_cska_authors_order"}) {
    SECTION(name) { test::check_model_golden(name); }
  }
}

TEST_CASE("vit authors_row_order changes the result", "[cpu][models][vit]") {
  // Same weights, the two row orders: the outputs must differ (the option is not a no-op).
  Config ours = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_cska.yaml");
  Config authors = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_cska.yaml");
  authors.set("mixer.authors_row_order=true");
  const nn::ModulePtr a = models::build_model(ours.root());
  const nn::ModulePtr b = models::build_model(authors.root());
  b->load_state_dict(a->state_dict());
  a->eval();
  b->eval();
  const Tensor images = test::uniform({1, 2, 8, 8}, 5, -1.0, 1.0, DType::kF32);
  const double difference = sum(abs(sub((*a)(images), (*b)(images)))).item();
  CHECK(difference > 1e-4);
}

TEST_CASE("vit models agree on CUDA and CPU", "[cuda][models][vit]") {
  if (!test::cuda_available_or_skip()) return;
  for (const char* name : {"vit_lsa", "vit_ska", "vit_cska"}) {
    SECTION(name) {
      Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/" + name + ".yaml");
      test::check_module_cuda_parity([&] { return models::build_model(cfg.root()); },
                                     test::uniform({2, 2, 8, 8}, 9, -1.0, 1.0, DType::kF32));
    }
  }
}

TEST_CASE("vit dropout acts only in training", "[cpu][models][vit]") {
  Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/vit_ska.yaml");
  const nn::ModulePtr model = models::build_model(cfg.root());
  const Tensor images = test::uniform({2, 2, 8, 8}, 7, -1.0, 1.0, DType::kF32);
  model->eval();
  test::require_close((*model)(images), (*model)(images), {0.0, 0.0}, "eval is deterministic");
  model->train();
  const double difference = sum(abs(sub((*model)(images), (*model)(images)))).item();
  CHECK(difference > 1e-6);
}
