// CaiT family tests: the reference parameter counts of configs/models/*cait_s.yaml, golden logits
// and gradients against scripts/golden_models/cait.py, gradient checks, layer dropout, CUDA parity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/random.h"
#include "models/cait.h"
#include "models/model_golden.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "ops/autocast.h"
#include "support/test_util.h"
#include "train/graph_step.h"

using namespace ska;
using ska::models::CaitAttention;
using ska::models::CaitAttentionOptions;
using ska::nn::AttentionKind;

namespace {

std::string model_config_path(const std::string& name) {
  return std::string(SKA_SOURCE_DIR) + "/configs/models/" + name + ".yaml";
}

// Trainable parameters of a config file after `overrides`; every key must have been read.
int64_t config_parameters(const std::string& name, const std::vector<std::string>& overrides = {}) {
  Config cfg = Config::load(model_config_path(name));
  for (const std::string& o : overrides) cfg.set(o);
  const nn::ModulePtr model = models::build_model(cfg.root());
  cfg.check_unused();
  return model->num_parameters(true);
}

nn::ModulePtr build_from_text(const std::string& yaml) {
  Config cfg = Config::parse(yaml);
  nn::ModulePtr model = models::build_model(cfg.root());
  cfg.check_unused();
  return model;
}

// A process-wide switch (get, set) turned to `on` for a scope.
template <bool (*Get)(), void (*Set)(bool)>
struct SwitchScope {
  explicit SwitchScope(bool on) : saved(Get()) { Set(on); }
  ~SwitchScope() { Set(saved); }
  bool saved;
};
using TalkingHeadsScope = SwitchScope<nn::fused_talking_heads_enabled, nn::set_fused_talking_heads>;
using StackedScope = SwitchScope<nn::stacked_projections_enabled, nn::set_stacked_projections>;

CaitAttentionOptions tiny_attention(AttentionKind logits) {
  CaitAttentionOptions o;
  o.dim = 4;
  o.heads = 2;
  o.head_dim = 3;
  o.logits = logits;
  o.grid = models::TokenGrid{2, 2, false};
  return o;
}

// Gradients of the attention's output w.r.t. its input and every parameter (f64 differences).
void check_attention_gradients(const CaitAttentionOptions& options) {
  manual_seed(7);
  CaitAttention attn(options);
  attn.to(DType::kF64);
  const int64_t tokens = options.grid.height * options.grid.width + (options.class_query ? 1 : 0);
  Tensor x = test::uniform({2, tokens, options.dim}, 11);
  x.set_requires_grad(true);
  TensorList inputs = {x};
  for (const auto& [name, p] : attn.named_parameters()) inputs.push_back(p);
  test::check_gradients([&](const TensorList& in) { return attn(in[0]); }, inputs);
}

}  // namespace

const std::vector<std::pair<std::string, int64_t>> kSpecCounts = {
    {"cait_s", 12685322}, {"ska_cait_s", 13503050}, {"cska_cait_s", 12885002}};

TEST_CASE("cait configs reproduce the reference parameter counts", "[cpu][models][cait]") {
  for (const auto& [name, count] : kSpecCounts) {
    INFO(name);
    CHECK(config_parameters(name) == count);
  }
}

// Each build initialises ~13M parameters (about 0.4 s), hence [slow].
TEST_CASE("cait configs follow num_classes and in_channels overrides",
          "[cpu][models][cait][slow]") {
  // 10 classes -> 100: +90 rows of the head (512 weights + 1 bias); 1 input channel: the patch
  // embedding loses 2 * 16 * 512 weights.
  for (const auto& [name, count] : kSpecCounts) {
    INFO(name);
    CHECK(config_parameters(name, {"num_classes=100"}) == count + 90 * 513);
    CHECK(config_parameters(name, {"in_channels=1"}) == count - 2 * 16 * 512);
  }
}

TEST_CASE("cait matches the PyTorch reference (logits and gradients)",
          "[cpu][models][cait][golden]") {
  SECTION("mhsa") { test::check_model_golden("cait_mhsa"); }
  SECTION("cska") { test::check_model_golden("cait_cska"); }
  SECTION("ska, key grid 2x finer") { test::check_model_golden("cait_ska"); }
}

TEST_CASE("cait with the fused talking heads matches the PyTorch reference",
          "[cpu][models][cait][golden]") {
  const TalkingHeadsScope fused(true);
  SECTION("the fused op runs") {
    const nn::ModulePtr model = test::build_fixture_module("cait_cska");
    model->eval();
    const Tensor logits = (*model)(test::uniform({2, 3, 16, 16}, 5, -1, 1, DType::kF32));
    CHECK(test::graph_has(logits, "talking_heads_softmax"));
  }
  SECTION("mhsa") { test::check_model_golden("cait_mhsa"); }
  SECTION("cska") { test::check_model_golden("cait_cska"); }
  SECTION("ska, key grid 2x finer") { test::check_model_golden("cait_ska"); }
  SECTION("the gradients of the attention, patch and class") {
    check_attention_gradients(tiny_attention(AttentionKind::kCska));
    CaitAttentionOptions o = tiny_attention(AttentionKind::kMhsa);
    o.class_query = true;
    check_attention_gradients(o);
  }
}

TEST_CASE("cait with stacked projections matches the PyTorch reference",
          "[cpu][models][cait][golden]") {
  const StackedScope stacked(true);
  SECTION("one product projects the patch tokens") {
    const nn::ModulePtr model = test::build_fixture_module("cait_cska");
    model->eval();
    const Tensor logits = (*model)(test::uniform({2, 3, 16, 16}, 5, -1, 1, DType::kF32));
    // Per patch layer to_q + to_v as one (2 layers), to_out, fc1 and fc2; the class layer's
    // to_q, to_kv, to_out, fc1, fc2; the patch embedding and the head.
    CHECK(test::count_nodes(logits, "linear") == 2 * 4 + 5 + 2);
    // The heads of each stacked product split in one node (q and v), and of the class layer's
    // to_kv (k and v).
    CHECK(test::count_nodes(logits, "split_heads") == 2 + 1);
  }
  SECTION("mhsa") { test::check_model_golden("cait_mhsa"); }
  SECTION("cska") { test::check_model_golden("cait_cska"); }
  SECTION("ska, key grid 2x finer") { test::check_model_golden("cait_ska"); }
  SECTION("the gradients of the patch attention") {
    for (const AttentionKind kind :
         {AttentionKind::kMhsa, AttentionKind::kSka, AttentionKind::kCska}) {
      INFO(nn::attention_kind_name(kind));
      check_attention_gradients(tiny_attention(kind));
    }
  }
}

TEST_CASE("stacked_linear: the layers' outputs from one product, or each layer's",
          "[cpu][models][cait]") {
  manual_seed(3);
  nn::Linear a(6, 4), b(6, 5), c(6, 3, false);
  a.to(DType::kF64);
  b.to(DType::kF64);
  c.to(DType::kF64);
  const Tensor x = test::uniform({2, 7, 6}, 9);
  for (const bool on : {false, true}) {
    INFO("stacked " << on);
    const StackedScope stacked(on);
    const TensorList out = nn::stacked_linear(x, {&a, &b});
    REQUIRE(out.size() == 2);
    CHECK(out[0].shape() == Shape{2, 7, 4});
    CHECK(out[1].shape() == Shape{2, 7, 5});
    test::require_close(out[0], a(x), test::tolerance_for(DType::kF64), "first");
    test::require_close(out[1], b(x), test::tolerance_for(DType::kF64), "second");
    CHECK(test::count_nodes(out[0], "linear") == 1);
    CHECK(test::graph_has(out[0], "split") == on);
    CHECK_THROWS_WITH(nn::stacked_linear(x, {&a, &c}),
                      Catch::Contains("must all have a bias or none"));
  }
  CHECK_THROWS_WITH(nn::stacked_linear(x, {}), Catch::Contains("no layers"));
}

TEST_CASE("cait talking-heads attention gradients", "[cpu][models][cait]") {
  SECTION("mhsa") { check_attention_gradients(tiny_attention(AttentionKind::kMhsa)); }
  SECTION("cska, unscaled") {
    CaitAttentionOptions o = tiny_attention(AttentionKind::kCska);
    o.scaled = false;
    check_attention_gradients(o);
  }
  SECTION("ska with a 2x finer key grid") {
    CaitAttentionOptions o = tiny_attention(AttentionKind::kSka);
    o.key_grid_factor = 2;
    check_attention_gradients(o);
  }
  SECTION("class attention") {
    CaitAttentionOptions o = tiny_attention(AttentionKind::kMhsa);
    o.class_query = true;
    check_attention_gradients(o);
  }
}

TEST_CASE("cait layer dropout acts in training only and keeps a layer", "[cpu][models][cait]") {
  manual_seed(3);
  models::CaitBlockOptions block;
  block.attention = tiny_attention(AttentionKind::kMhsa);
  block.mlp_dim = 5;
  auto stack = std::make_shared<models::CaitLayerStack>(0.999);
  std::vector<std::shared_ptr<models::CaitBlock>> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(std::make_shared<models::CaitBlock>(block));
    stack->append(blocks.back());
  }
  const Tensor x = test::uniform({1, 4, 4}, 5, -1.0, 1.0, DType::kF32);
  stack->eval();
  for (auto& b : blocks) b->eval();
  const Tensor all = (*blocks[2])((*blocks[1])((*blocks[0])(x)));
  test::require_close((*stack)(x), all, test::tolerance_for(DType::kF32), "eval runs every layer");
  // Training with p = 0.999: almost always every layer is drawn for dropping; exactly one survives.
  // (Blocks have no dropout here, so a kept block computes the same in both modes.)
  stack->train();
  for (int trial = 0; trial < 5; ++trial) {
    const Tensor y = (*stack)(x);
    int matches = 0;
    for (auto& b : blocks) matches += test::nmse(y, (*b)(x)) < 1e-12 ? 1 : 0;
    CHECK(matches == 1);
  }
}

TEST_CASE(
    "cait class layers on the class token alone give the bits of blocks on class and patches "
    "joined",
    "[cpu][models][cait]") {
  // forward_class passes the class token [B, 1, C] from block to block, every block reading the
  // same patches; the blocks' own forward takes and returns [B, 1 + N, C]. Outputs and every
  // gradient (class token, patches, parameters) must agree bit for bit, in f32 and in bf16
  // autocast.
  for (const bool autocast : {false, true}) {
    INFO((autocast ? "bf16 autocast" : "f32"));
    manual_seed(12);
    models::CaitBlockOptions block;
    block.attention = tiny_attention(AttentionKind::kMhsa);
    block.attention.class_query = true;
    block.attention.grid = models::TokenGrid{2, 2, true};
    block.mlp_dim = 5;
    block.layer_scale_init = 0.5;
    auto stack = std::make_shared<models::CaitLayerStack>(0.0);
    std::vector<std::shared_ptr<models::CaitBlock>> blocks;
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(std::make_shared<models::CaitBlock>(block));
      stack->append(blocks.back());
    }
    const Tensor cls = test::uniform({3, 1, 4}, 13, -1.0, 1.0, DType::kF32).set_requires_grad();
    const Tensor patches = test::uniform({3, 4, 4}, 14, -1.0, 1.0, DType::kF32).set_requires_grad();
    const Tensor r = test::uniform({3, 1, 4}, 15, -1.0, 1.0, DType::kF32);
    const auto run = [&](bool alone) {
      for (const Tensor& p : stack->parameters()) p.zero_grad();
      cls.zero_grad();
      patches.zero_grad();
      Tensor y;
      {
        const AutocastGuard guard(DType::kBF16, autocast);
        y = alone ? stack->forward_class(cls, patches)
                  : (*blocks[1])((*blocks[0])(cat({cls, patches}, 1))).narrow(1, 0, 1);
      }
      sum(mul(y.to(DType::kF32), r)).backward();
      TensorList out = {y.detach(), cls.grad(), patches.grad()};
      for (const Tensor& p : stack->parameters()) out.push_back(p.grad());
      return out;
    };
    const TensorList alone = run(true), joined = run(false);
    REQUIRE(alone.size() == joined.size());
    CHECK(alone[0].shape() == Shape{3, 1, 4});
    for (size_t i = 0; i < alone.size(); ++i) {
      INFO("tensor " << i
                     << " (0: output, 1: class token's gradient, 2: patches', then the "
                        "parameters')");
      CHECK(test::bitwise_equal(alone[i], joined[i]));
    }
    // The stack's own forward on [class, patches] is the class token updated, patches unchanged.
    Tensor both;
    {
      const AutocastGuard guard(DType::kBF16, autocast);
      both = (*stack)(cat({cls, patches}, 1));
    }
    CHECK(test::bitwise_equal(both.narrow(1, 0, 1), alone[0]));
    CHECK(test::bitwise_equal(both.narrow(1, 1, 4), patches));
  }
}

TEST_CASE("cait layer dropout draws on the host: a CUDA Graph of its training step is refused",
          "[cpu][models][cait]") {
  // Which layers run is drawn on the host at every training forward: a captured step would
  // replay the captured draw forever, so the obstacle names the key (train.cuda_graph: auto
  // then runs eager steps) and a draw inside a capture fails (ForbidDraws).
  const std::string base =
      "family: cait\nimage_size: 16\nnum_classes: 3\ndim: 8\ndepth: 2\ncls_depth: 1\n"
      "heads: 2\nhead_dim: 4\nmlp_dim: 8\nmixer: cska\n";
  const nn::ModulePtr dropping = build_from_text(base + "layer_dropout: 0.05\n");
  const std::string draws = nn::host_draws_in_training(*dropping);
  CHECK_THAT(draws,
             Catch::Contains("patch_layers") && Catch::Contains("model.layer_dropout: 0.05"));
  const std::string obstacle =
      train::cuda_graph_obstacle(Device::cuda(0), 1, "single", train::TrainOptions{}, draws);
  CHECK_THAT(obstacle, Catch::Contains("draws on the host") && Catch::Contains("layer_dropout"));
  CHECK(nn::host_draws_in_training(*build_from_text(base + "layer_dropout: 0.0\n")).empty());

  dropping->train();
  const Tensor x = test::uniform({1, 3, 16, 16}, 9, -1.0, 1.0, DType::kF32);
  {
    const ForbidDraws guard(default_generator(Device::cpu()), "capturing a test step");
    REQUIRE_THROWS_WITH((*dropping)(x), Catch::Contains("capturing a test step"));
    dropping->eval();  // evaluation runs every layer and draws nothing
    CHECK((*dropping)(x).size(0) == 1);
  }
}

TEST_CASE("cait layer dropout's device rule decides as the host's for every f32 draw",
          "[cpu][models][cait]") {
  // Draws at and next to every threshold (layer_dropout, and i / n for the layer kept when all
  // drop out: f32 values 2^-24 apart, as the generator's are) and random ones, for rates that f32
  // cannot hold exactly: LayerKeepRule's f32 comparisons against kept_layers' f64 ones.
  std::mt19937 rng(5);
  for (const int64_t n : {1, 2, 3, 6, 7, 8}) {
    for (const double p : {0.05, 0.1, 1.0 / 3.0, 0.5, 0.7, 0.95, 0.99}) {
      INFO("n = " << n << ", layer_dropout " << p);
      const models::LayerKeepRule rule(n, p, Device::cpu());
      std::vector<float> near;  // f32 values on the 2^-24 grid around each threshold
      std::vector<double> edges = {p};
      for (int64_t i = 0; i <= n; ++i) edges.push_back(static_cast<double>(i) / n);
      for (double e : edges) {
        const double k = std::floor(e * 16777216.0);
        for (double d = -2; d <= 2; ++d) {
          const double v = (k + d) / 16777216.0;
          if (v >= 0 && v < 1) near.push_back(static_cast<float>(v));
        }
      }
      std::uniform_int_distribution<int> pick(0, static_cast<int>(near.size()) - 1);
      std::uniform_int_distribution<uint32_t> word(0, (1u << 24) - 1);
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<float> u(static_cast<size_t>(n + 1));
        for (float& v : u) {
          v = trial % 2 ? near[static_cast<size_t>(pick(rng))]
                        : static_cast<float>(word(rng)) / 16777216.0f;
        }
        if (trial % 3 == 0) {  // every layer drawn out: the fallback's pick decides
          for (int64_t i = 0; i < n; ++i) u[static_cast<size_t>(i)] = 0.0f;
        }
        const std::vector<double> u64(u.begin(), u.end());
        const std::vector<bool> host = models::kept_layers(u64, p);
        const std::vector<float> device =
            rule.kept(Tensor::from_vector(u, {n + 1}, DType::kF32)).to_vector<float>();
        for (int64_t i = 0; i < n; ++i) {
          INFO("u_i " << u[static_cast<size_t>(i)] << ", u_n " << u.back() << ", layer " << i);
          REQUIRE(device[static_cast<size_t>(i)] == (host[static_cast<size_t>(i)] ? 1.0f : 0.0f));
        }
      }
    }
  }
}

TEST_CASE("cait layer dropout drawn on the device runs the layers the host's draw runs",
          "[cpu][models][cait]") {
  // Two copies of one model, one with its layer dropout moved to the device (here the CPU, so
  // both draw from the same generator): the same outputs and input gradients bit for bit, the
  // same parameter gradients for the layers that ran and zeros for the layers dropped (the host
  // leaves them without a grad); exactly one layer kept when every draw dropped out.
  for (const double p : {0.5, 0.95}) {
    INFO("layer_dropout " << p);
    const std::string yaml =
        "family: cait\nimage_size: 16\nnum_classes: 3\ndim: 8\ndepth: 3\ncls_depth: 2\n"
        "heads: 2\nhead_dim: 4\nmlp_dim: 8\nmixer: cska\ndropout: 0\nemb_dropout: 0\n"
        "layer_dropout: " +
        std::to_string(p) + "\n";
    manual_seed(4);
    const nn::ModulePtr host = build_from_text(yaml);
    manual_seed(4);
    const nn::ModulePtr device = build_from_text(yaml);
    const auto gates = nn::draw_on_device(*device, Device::cpu());
    CHECK(nn::host_draws_in_training(*device).empty());
    manual_seed(4);
    const nn::ModulePtr none = build_from_text(
        std::string(yaml).replace(yaml.find("layer_dropout"), std::string::npos, "") +
        "layer_dropout: 0\n");
    CHECK(nn::draw_on_device(*none, Device::cpu()).empty());
    // Every parameter of the layers, and nothing else, has a gate.
    int64_t layer_params = 0;
    for (const auto& [name, param] : device->named_parameters(true)) {
      layer_params += name.rfind("patch_layers.", 0) == 0 || name.rfind("class_layers.", 0) == 0;
    }
    CHECK(static_cast<int64_t>(gates.size()) == layer_params);
    std::vector<models::CaitLayerStack*> stacks;
    for (const auto& [name, module] : device->named_modules()) {
      if (auto* stack = dynamic_cast<models::CaitLayerStack*>(module)) stacks.push_back(stack);
    }
    REQUIRE(stacks.size() == 2);
    host->train();
    device->train();
    int dropped = 0, forced = 0;
    for (int trial = 0; trial < 12; ++trial) {
      INFO("trial " << trial);
      Tensor x = test::uniform({2, 3, 16, 16}, 30 + trial, -1.0, 1.0, DType::kF32);
      Tensor xh = x.clone().set_requires_grad(true), xd = x.clone().set_requires_grad(true);
      manual_seed(100 + trial);
      const Tensor yh = (*host)(xh);
      manual_seed(100 + trial);
      const Tensor yd = (*device)(xd);
      REQUIRE(test::bitwise_equal(yh, yd));
      const Tensor w = test::uniform(yh.shape(), 60 + trial, -1.0, 1.0, DType::kF32);
      sum(mul(yh, w)).backward();
      sum(mul(yd, w)).backward();
      CHECK(test::bitwise_equal(xh.grad(), xd.grad()));
      const auto hp = host->named_parameters(true), dp = device->named_parameters(true);
      for (size_t i = 0; i < hp.size(); ++i) {
        INFO(hp[i].first);
        const Tensor gd = dp[i].second.grad();
        REQUIRE(gd.defined());
        const Tensor gh = hp[i].second.grad();
        if (gh.defined()) {
          CHECK(test::bitwise_equal(gh, gd));
        } else {  // zeros (-0 too: a LayerScale's gradient times the flag 0)
          CHECK(amax(abs(gd)).item() == 0.0);
        }
        hp[i].second.zero_grad();
        dp[i].second.zero_grad();
      }
      for (const auto* stack : stacks) {
        const std::vector<float> kept = stack->kept_on_device().to_vector<float>();
        int running = 0;
        for (float k : kept) running += k == 1.0f;
        CHECK(running >= 1);
        dropped += static_cast<int>(kept.size()) - running;
        forced += running == 1;
      }
    }
    CHECK(dropped > 0);
    if (p > 0.9) CHECK(forced > 0);
  }
}

TEST_CASE("cait config errors name the key", "[cpu][models][cait]") {
  const std::string base =
      "family: cait\nimage_size: 16\nnum_classes: 3\ndim: 8\ndepth: 1\ncls_depth: 1\n"
      "heads: 2\nhead_dim: 4\nmlp_dim: 8\n";
  REQUIRE_THROWS_WITH(build_from_text(base + "mixer: skaa\n"),
                      Catch::Contains("mixer") && Catch::Contains("ska"));
  REQUIRE_THROWS_WITH(build_from_text(base + "patch_size: 3\n"), Catch::Contains("patch_size"));
  REQUIRE_THROWS_WITH(build_from_text(base + "mixer: {type: cska, activaton: gelu}\n"),
                      Catch::Contains("activaton"));
  // Options: string and map forms, non-softmax activations, no talking heads.
  CHECK(build_from_text(base + "mixer: cska\n")->num_parameters() > 0);
  CHECK(build_from_text(base + "talking_heads: false\nmixer: {type: ska, activation: relu}\n")
            ->num_parameters() > 0);
}

TEST_CASE("cait CUDA matches the CPU", "[cuda][models][cait]") {
  if (!test::cuda_available_or_skip()) return;
  for (const std::string mixer : {"mhsa", "cska", "{type: ska, key_grid_factor: 2}"}) {
    INFO(mixer);
    const std::string yaml =
        "family: cait\nimage_size: 16\nnum_classes: 5\ndim: 16\ndepth: 2\ncls_depth: 1\n"
        "heads: 2\nhead_dim: 8\nmlp_dim: 24\nmixer: " +
        mixer + "\n";
    test::check_module_cuda_parity([&] { return build_from_text(yaml); },
                                   test::uniform({2, 3, 16, 16}, 4, -1.0, 1.0, DType::kF32));
    // The fused talking heads (the CUDA kernels) against the CPU's, and with the patch
    // attention's projections stacked too.
    const TalkingHeadsScope fused(true);
    test::check_module_cuda_parity([&] { return build_from_text(yaml); },
                                   test::uniform({2, 3, 16, 16}, 4, -1.0, 1.0, DType::kF32));
    const StackedScope stacked(true);
    test::check_module_cuda_parity([&] { return build_from_text(yaml); },
                                   test::uniform({2, 3, 16, 16}, 4, -1.0, 1.0, DType::kF32));
  }
}

TEST_CASE("cait layer dropout drawn on CUDA keeps the layers the CPU's rule keeps",
          "[cuda][models][cait]") {
  if (!test::cuda_available_or_skip()) return;
  // Both generators at one (seed, offset): Philox draws are the same on both backends, so the
  // device rule keeps the same layers, and the training outputs agree to f32 tolerance.
  const std::string yaml =
      "family: cait\nimage_size: 16\nnum_classes: 3\ndim: 8\ndepth: 3\ncls_depth: 2\n"
      "heads: 2\nhead_dim: 4\nmlp_dim: 8\nmixer: cska\ndropout: 0\nemb_dropout: 0\n"
      "layer_dropout: 0.5\n";
  const Device gpu = Device::cuda(0);
  manual_seed(4);
  const nn::ModulePtr cpu_model = build_from_text(yaml);
  manual_seed(4);
  const nn::ModulePtr gpu_model = build_from_text(yaml);
  gpu_model->to(gpu);
  nn::draw_on_device(*cpu_model, Device::cpu());
  nn::draw_on_device(*gpu_model, gpu);
  const auto stacks = [](nn::Module& m) {
    std::vector<models::CaitLayerStack*> out;
    for (const auto& [name, module] : m.named_modules()) {
      if (auto* stack = dynamic_cast<models::CaitLayerStack*>(module)) out.push_back(stack);
    }
    return out;
  };
  cpu_model->train();
  gpu_model->train();
  int dropped = 0;
  for (int trial = 0; trial < 8; ++trial) {
    INFO("trial " << trial);
    const Tensor x = test::uniform({2, 3, 16, 16}, 30 + trial, -1.0, 1.0, DType::kF32);
    default_generator(Device::cpu()).set_state(1234, 10 * trial);
    default_generator(gpu).set_state(1234, 10 * trial);
    const Tensor y_cpu = (*cpu_model)(x);
    const Tensor y_gpu = (*gpu_model)(x.to(gpu));
    for (size_t k = 0; k < 2; ++k) {
      const std::vector<float> kept = stacks(*cpu_model)[k]->kept_on_device().to_vector<float>();
      CHECK(stacks(*gpu_model)[k]->kept_on_device().to_vector<float>() == kept);
      for (float v : kept) dropped += v == 0.0f;
    }
    test::require_close(y_gpu.to(Device::cpu()), y_cpu, test::tolerance_for(DType::kF32),
                        "training logits");
  }
  CHECK(dropped > 0);
}
