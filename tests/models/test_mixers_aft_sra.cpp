// AFT (full, simple, local, conv) and SRA token mixers: golden outputs and gradients against
// scripts/golden_models/mixers_aft_sra.py, f64 gradient checks, invariants, CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/random.h"
#include "models/model.h"
#include "models/vit.h"
#include "models/model_golden.h"
#include "nn/mixers/aft.h"
#include "nn/mixers/sra.h"
#include "support/test_util.h"

using namespace ska;

namespace {

// A mixer from a map holding `type:` and options, on a grid.
nn::ModulePtr build_mixer(const ConfigNode& node, int64_t dim, models::TokenGrid grid) {
  models::register_builtin_models();
  const models::MixerArgs args = models::vit_mixer_args(dim, grid);
  return models::mixer_registry().get(node, "type")(node, args);
}

nn::ModulePtr build_mixer(const std::string& yaml, int64_t dim, models::TokenGrid grid) {
  Config cfg = Config::parse(yaml);
  nn::ModulePtr mixer = build_mixer(cfg.root(), dim, grid);
  cfg.check_unused();
  return mixer;
}

void check_mixer_gradients(const std::string& yaml, models::TokenGrid grid, int64_t dim = 4) {
  manual_seed(17);
  const nn::ModulePtr mixer = build_mixer(yaml, dim, grid);
  mixer->to(DType::kF64);
  // Move every parameter off its init (aft_conv's gamma / beta start at 0).
  for (auto [name, p] : mixer->named_parameters()) {
    p.copy_(add(p.detach(), mul(test::uniform(p.shape(), 99 + p.numel()), 0.3)));
  }
  Tensor x = test::uniform({2, grid.tokens(), dim}, 23);
  x.set_requires_grad(true);
  TensorList inputs = {x};
  for (const auto& [name, p] : mixer->named_parameters()) inputs.push_back(p);
  test::check_gradients([&](const TensorList& in) { return (*mixer)(in[0]); }, inputs);
}

}  // namespace

TEST_CASE("aft and sra match the PyTorch reference", "[cpu][models][mixers][golden]") {
  for (const std::string case_name :
       {"mixer_aft_full", "mixer_aft_simple", "mixer_aft_local", "mixer_aft_conv",
        "mixer_aft_conv_cls", "mixer_sra", "mixer_sra_cls"}) {
    SECTION(case_name) { test::check_model_golden(case_name); }
  }
}

TEST_CASE("aft and sra gradients (f64 central differences)", "[cpu][models][mixers]") {
  const models::TokenGrid grid{2, 3, false}, with_cls{3, 2, true};
  SECTION("aft_full") { check_mixer_gradients("{type: aft_full, factor_dim: 3}", with_cls); }
  SECTION("aft_simple") { check_mixer_gradients("{type: aft_simple}", grid); }
  SECTION("aft_local") {
    check_mixer_gradients("{type: aft_local, factor_dim: 2, window: 2}", with_cls);
  }
  SECTION("aft_conv") { check_mixer_gradients("{type: aft_conv, heads: 2, kernel: 3}", grid); }
  SECTION("aft_conv with a class token") {
    check_mixer_gradients("{type: aft_conv, heads: 4, kernel: 3}", with_cls);
  }
  SECTION("sra, sr 2") { check_mixer_gradients("{type: sra, heads: 2, sr: 2}", {4, 2, true}); }
  SECTION("sra, sr 1") {
    check_mixer_gradients("{type: sra, head_dim: 2, sr: 1, qkv_bias: false}", grid);
  }
}

TEST_CASE("aft_local with window 0 is aft_simple", "[cpu][models][mixers]") {
  const models::TokenGrid grid{3, 3, false};
  manual_seed(5);
  const nn::ModulePtr local = build_mixer("{type: aft_local, window: 0, factor_dim: 4}", 8, grid);
  const nn::ModulePtr simple = build_mixer("{type: aft_simple}", 8, grid);
  simple->load_state_dict(local->state_dict(), /*strict=*/false);
  const Tensor x = test::uniform({2, 9, 8}, 31, -1, 1, DType::kF32);
  test::require_close((*local)(x), (*simple)(x), test::tolerance_for(DType::kF32), "window 0");
}

TEST_CASE("aft stays finite on large inputs (shifted exponents)", "[cpu][models][mixers]") {
  const models::TokenGrid grid{3, 3, true};
  manual_seed(6);
  for (const std::string yaml :
       {"{type: aft_full}", "{type: aft_local}", "{type: aft_conv, heads: 2}"}) {
    INFO(yaml);
    const nn::ModulePtr mixer = build_mixer(yaml, 8, grid);
    const Tensor x = mul(test::uniform({1, grid.tokens(), 8}, 3, -1, 1, DType::kF32), 500.0);
    CHECK(std::isfinite(sum(abs((*mixer)(x))).item()));
  }
}

TEST_CASE("aft_conv at init equals aft_simple with the same projections", "[cpu][models][mixers]") {
  // heads = C: aft_conv's K has one channel per channel, as aft_simple's.
  const models::TokenGrid grid{3, 3, false};
  manual_seed(8);
  const nn::ModulePtr conv = build_mixer("{type: aft_conv, heads: 4, kernel: 3}", 4, grid);
  const nn::ModulePtr simple = build_mixer("{type: aft_simple}", 4, grid);
  simple->load_state_dict(conv->state_dict(), /*strict=*/false);
  const Tensor x = test::uniform({2, 9, 4}, 41, -1, 1, DType::kF32);
  test::require_close((*conv)(x), (*simple)(x), test::tolerance_for(DType::kF32),
                      "gamma = beta = 0");
}

TEST_CASE("aft and sra parameter counts and option errors", "[cpu][models][mixers]") {
  const models::TokenGrid grid{4, 4, true};  // T = 17
  const int64_t c = 8, proj = c * c + c;
  CHECK(build_mixer("{type: aft_simple}", c, grid)->num_parameters() == 4 * proj);
  CHECK(build_mixer("{type: aft_full, factor_dim: 5}", c, grid)->num_parameters() ==
        4 * proj + 2 * 17 * 5);
  CHECK(build_mixer("{type: aft_conv, heads: 2, kernel: 5}", c, grid)->num_parameters() ==
        3 * proj + (c * 2 + 2) + 2 * 25 + 2 + 2);
  CHECK(build_mixer("{type: sra, heads: 2, sr: 2}", c, grid)->num_parameters() ==
        4 * proj + (c * c * 4 + c) + 2 * c);  // q, kv (2x), proj; sr conv; norm
  REQUIRE_THROWS_WITH(build_mixer("{type: aft_conv, kernel: 4}", c, grid),
                      Catch::Contains("kernel"));
  REQUIRE_THROWS_WITH(build_mixer("{type: sra, heads: 3}", c, grid), Catch::Contains("heads"));
  REQUIRE_THROWS_WITH(build_mixer("{type: sra, sr: 5}", c, grid), Catch::Contains("sr"));
  REQUIRE_THROWS_WITH(build_mixer("{type: aft_local, windw: 2}", c, grid),
                      Catch::Contains("windw"));
}

TEST_CASE("aft and sra CUDA match the CPU", "[cuda][models][mixers]") {
  if (!test::cuda_available_or_skip()) return;
  const models::TokenGrid grid{4, 4, true};
  for (const std::string yaml :
       {"{type: aft_full, factor_dim: 8}", "{type: aft_simple}", "{type: aft_local, window: 2}",
        "{type: aft_conv, heads: 2, kernel: 3}", "{type: sra, heads: 2, sr: 2}"}) {
    INFO(yaml);
    test::check_module_cuda_parity(
        [&] {
          const nn::ModulePtr mixer = build_mixer(yaml, 8, grid);
          // Off the init: aft_conv's gamma / beta start at 0, which would hide its kernels.
          for (auto [name, p] : mixer->named_parameters()) p.copy_(add(p.detach(), 0.3));
          return mixer;
        },
        test::uniform({2, grid.tokens(), 8}, 4, -1.0, 1.0, DType::kF32));
  }
}
