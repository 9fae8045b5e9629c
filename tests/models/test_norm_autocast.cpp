// Layer norms that write the autocast dtype (nn::LayerNorm::autocast_output): on every model
// fixture, a forward and backward under bf16 autocast gives the same bits with the norms' 16-bit
// outputs as with f32 outputs cast by the matrix products after (StarReLU activations read only
// by a matrix product or a convolution likewise); and the norms that get the flag are those in
// front of modules reading their input by matrix products only. Likewise the
// blocks' residual add fused with the layer norm after it (nn::set_fused_residual_norm), with
// and without autocast, the MLPs' GELU fused with their dropout (nn::set_fused_gelu_dropout), and
// the dropouts closing ViT's branches fused into the residual sums (nn::set_fused_dropout_add);
// and the parameters' casts made up front for a step (AutocastParamCasts).
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "backend/device_runtime.h"
#include "models/model_golden.h"
#include "nn/layers.h"
#include "ops/autocast.h"
#include "ops/linear.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::bitwise_equal;

namespace {

// How a fixture runs: the process-wide switches (restored at scope exit) and autocast.
struct Switches {
  bool norm_outputs = true;
  bool fused_residual_norm = false;
  bool fused_gelu_dropout = false;
  bool fused_dropout_add = false;
  bool param_casts = false;  // the parameters cast up front (AutocastParamCasts)
  bool linear_f32_grads = false;
  bool held_forward = false;  // CUDA layer norm forward on the held-row kernels
  bool stacked_projections = false;  // nn::stacked_linear stacks (CaiT's patch attention)
  bool autocast = true;
  bool training = false;  // train mode: dropout and drop path draw
};
struct SwitchScope {
  explicit SwitchScope(const Switches& s)
      : norm_outputs(nn::norm_autocast_outputs_enabled()),
        fused_residual_norm(nn::fused_residual_norm_enabled()),
        fused_gelu_dropout(nn::fused_gelu_dropout_enabled()),
        fused_dropout_add(nn::fused_dropout_add_enabled()),
        linear_f32_grads(linear_f32_grads_enabled()),
        held_forward(set_cuda_layer_norm_held_forward(s.held_forward)),
        stacked_projections(nn::stacked_projections_enabled()) {
    nn::set_stacked_projections(s.stacked_projections);
    nn::set_norm_autocast_outputs(s.norm_outputs);
    nn::set_fused_residual_norm(s.fused_residual_norm);
    nn::set_fused_gelu_dropout(s.fused_gelu_dropout);
    nn::set_fused_dropout_add(s.fused_dropout_add);
    set_linear_f32_grads(s.linear_f32_grads);
  }
  ~SwitchScope() {
    nn::set_norm_autocast_outputs(norm_outputs);
    nn::set_fused_residual_norm(fused_residual_norm);
    nn::set_fused_gelu_dropout(fused_gelu_dropout);
    nn::set_fused_dropout_add(fused_dropout_add);
    set_linear_f32_grads(linear_f32_grads);
    set_cuda_layer_norm_held_forward(held_forward);
    nn::set_stacked_projections(stacked_projections);
  }
  bool norm_outputs, fused_residual_norm, fused_gelu_dropout, fused_dropout_add, linear_f32_grads,
      held_forward, stacked_projections;
};

struct Run {
  Tensor logits;
  std::map<std::string, Tensor> grads;
  int fused_nodes = 0;         // add_layer_norm nodes in the graph
  int gelu_dropout_nodes = 0;  // gelu_dropout nodes
  int dropout_add_nodes = 0;   // dropout_add nodes
  int dropout_nodes = 0;       // dropout nodes
  int param_cast_nodes = 0;    // casts of a parameter ("to" nodes feeding a leaf's gradient)
  int linear_nodes = 0;        // linear nodes
  int cast_nodes = 0;          // every cast ("to" nodes)
  std::vector<std::string> flagged;  // the norms with autocast_output set, after the forward
  int64_t casts_served = -1;   // AutocastParamCasts::uses(), with the casts made up front
};

// Forward (under bf16 autocast unless switched off; eval mode unless asked), a fixed
// weighting of the logits as the loss, backward; the model is rebuilt from the same seed each
// time.
Run run_fixture(const std::string& name, Device device, const Switches& switches) {
  const SwitchScope scope(switches);
  manual_seed(17);
  const nn::ModulePtr model = test::build_fixture_module(name);
  model->to(device);
  model->train(switches.training);
  const Config cfg = Config::load(std::string(SKA_TEST_FIXTURES) + "/models/" + name + ".yaml");
  const int64_t size = cfg.root().get<int64_t>("image_size");
  const int64_t channels = cfg.root().get<int64_t>("in_channels");
  const Tensor images =
      test::uniform({2, channels, size, size}, 5, -1.0, 1.0, DType::kF32).to(device);
  Run r;
  Tensor loss;
  {
    AutocastGuard guard(DType::kBF16, switches.autocast);
    std::optional<AutocastParamCasts> casts;
    if (switches.param_casts) casts.emplace(model->parameters(true));
    r.logits = (*model)(images);
    if (casts) r.casts_served = casts->uses();
    r.param_cast_nodes = test::count_nodes(r.logits, "to", true);
    r.linear_nodes = test::count_nodes(r.logits, "linear");
    r.cast_nodes = test::count_nodes(r.logits, "to");
    r.fused_nodes = test::count_nodes(r.logits, "add_layer_norm");
    r.gelu_dropout_nodes = test::count_nodes(r.logits, "gelu_dropout");
    r.dropout_add_nodes = test::count_nodes(r.logits, "dropout_add");
    r.dropout_nodes = test::count_nodes(r.logits, "dropout");
    const Tensor weights = test::uniform(r.logits.shape(), 6, -1.0, 1.0, DType::kF32).to(device);
    loss = sum(mul(r.logits, weights));
  }
  loss.backward();
  for (const auto& [pname, p] : model->named_parameters(true)) r.grads[pname] = p.grad();
  for (const auto& [mname, m] : model->named_modules()) {
    if (const auto* norm = dynamic_cast<const nn::LayerNorm*>(m); norm && norm->autocast_output)
      r.flagged.push_back(mname);
  }
  return r;
}

const std::vector<std::string>& model_fixtures() {
  static const std::vector<std::string> names = {
      "vit_cska",           "vit_ska",  "vit_lsa",   "cait_mhsa", "cait_ska", "cait_cska",
      "swin_mhsa",          "swin_ska", "swin_cska", "cvt_mhsa",  "cvt_cska", "metaformer_mixed",
      "metaformer_caformer"};
  return names;
}

void check_same_bits(const Run& with, const Run& without) {
  CHECK(bitwise_equal(with.logits, without.logits));
  REQUIRE(with.grads.size() == without.grads.size());
  for (const auto& [pname, g] : with.grads) {
    INFO(pname);
    REQUIRE(g.defined() == without.grads.at(pname).defined());
    if (g.defined()) CHECK(bitwise_equal(g, without.grads.at(pname)));
  }
}

// The same parameters have gradients in both runs, each within `tol` of the other run's.
void check_close_grads(const Run& with, const Run& without, const test::Tolerance& tol) {
  REQUIRE(with.grads.size() == without.grads.size());
  for (const auto& [pname, g] : with.grads) {
    INFO(pname);
    REQUIRE(g.defined() == without.grads.at(pname).defined());
    if (g.defined()) test::require_close(g, without.grads.at(pname), tol, "parameter gradient");
  }
}

void check_same_bits(Device device) {
  for (const std::string& name : model_fixtures()) {
    INFO("fixture " << name << " on " << device.str());
    Switches off;
    off.norm_outputs = false;
    check_same_bits(run_fixture(name, device, Switches{}), run_fixture(name, device, off));
  }
}

// The fused residual adds in a fixture's graph: 2n - 1 for a chain of n blocks. A scale of the
// branch (CaiT's LayerScale) goes into the fused kernels; a scale of the stream (MetaFormer's
// res_scale) keeps scaled_residual's sum, then the norm.
int expected_fused_adds(const std::string& name) {
  const auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  if (starts("vit")) return 3;                      // one chain of 2 blocks
  if (starts("cait")) return 3 + 1;  // each block's first sum; the chain of 2 patch blocks
  if (starts("cvt")) return 2;                      // depths [1, 1]
  if (starts("swin")) return 6;                     // depths [2, 2]
  if (name == "metaformer_mixed") return 1 + 1;     // depths [1, 1, 1, 1], res_scale in 2 and 3
  if (name == "metaformer_caformer") return 3 + 1;  // depths [2, 1, 1, 1], res_scale in 1 and 3
  FAIL("no expected count for fixture " << name);
  return -1;
}

// Every fixture's blocks fuse their residual add with the norm after it, and the logits and
// gradients keep their bits, under autocast (a 16-bit branch into an f32 stream) and in f32.
void check_fused_residual_norm(Device device) {
  for (const std::string& name : model_fixtures()) {
    for (const bool autocast : {true, false}) {
      INFO("fixture " << name << " on " << device.str() << (autocast ? ", bf16 autocast" : ""));
      Switches fused, unfused;
      fused.fused_residual_norm = true;
      fused.autocast = unfused.autocast = autocast;
      const Run with = run_fixture(name, device, fused);
      const Run without = run_fixture(name, device, unfused);
      // Fused adds: each block's middle one, and in a chain of n blocks (run_block_chain) the n - 1
      // between them (under autocast also where the stream is bf16: Swin's, the MetaFormers'
      // after a downsampling convolution), where no scale multiplies either side.
      CHECK(with.fused_nodes == expected_fused_adds(name));
      CHECK(without.fused_nodes == 0);
      check_same_bits(with, without);
      // In training, dropout and drop path draw in the same order either way, also with the
      // MLPs' GELU and dropout fused (where the MLP has a dropout: ViT's and CaiT's fixtures).
      fused.training = unfused.training = true;
      fused.fused_gelu_dropout = true;
      const Run trained = run_fixture(name, device, fused);
      const bool mlp_dropout = name.rfind("vit", 0) == 0 || name.rfind("cait", 0) == 0;
      CHECK((trained.gelu_dropout_nodes > 0) == mlp_dropout);
      const Run trained_unfused = run_fixture(name, device, unfused);
      check_same_bits(trained, trained_unfused);
      // ViT's and CaiT's fused sums take the dropout closing their branch into add_layer_norm's
      // kernels (one dropout node fewer each; CaiT's with its LayerScale), as the MLPs'
      // gelu_dropout nodes take theirs. CaiT's layer dropout may leave out a layer in training.
      const bool takes = name.rfind("vit", 0) == 0 || name.rfind("cait", 0) == 0;
      const int taken = trained_unfused.dropout_nodes - trained.dropout_nodes;
      CHECK(trained.fused_nodes <= expected_fused_adds(name));
      if (takes) CHECK(trained.fused_nodes > 0);
      CHECK(taken == (takes ? trained.fused_nodes : 0) + trained.gelu_dropout_nodes);
      // ViT's and CaiT's blocks apply the dropouts closing their branches in the residual sums,
      // inside the sums' kernels (set_fused_dropout_add) where no norm is fused with them: ViT's
      // last block's two sums with the fused residual norm, all four sums of the two blocks
      // without (dropout_add; CaiT's, scaled by LayerScale, in scaled_residual: fewer dropout
      // nodes). The same bits as dropout and then the sum.
      const bool vit = name.rfind("vit", 0) == 0;
      fused.fused_dropout_add = true;
      CHECK(run_fixture(name, device, fused).dropout_add_nodes == (vit ? 1 : 0));
      Switches inside = unfused;
      inside.fused_dropout_add = true;
      const Run dropped = run_fixture(name, device, inside);
      CHECK(dropped.dropout_add_nodes == (vit ? 4 : 0));
      const Run undropped = run_fixture(name, device, unfused);
      CHECK(undropped.dropout_add_nodes == 0);
      const int fewer = undropped.dropout_nodes - dropped.dropout_nodes;
      if (vit) CHECK(fewer == 4);
      if (name.rfind("cait", 0) == 0) CHECK(fewer > 0);
      if (!vit && name.rfind("cait", 0) != 0) CHECK(fewer == 0);
      check_same_bits(dropped, undropped);
    }
  }
}

// Casting the parameters up front (train.weight_casts: per_step) serves every cast of a
// parameter the fixture's ops make, with the same bits and graph, in training (dropout drawing).
void check_param_casts(Device device) {
  for (const std::string& name : model_fixtures()) {
    INFO("fixture " << name << " on " << device.str());
    Switches up_front, per_use;
    up_front.training = per_use.training = true;
    up_front.param_casts = true;
    const Run with = run_fixture(name, device, up_front);
    const Run without = run_fixture(name, device, per_use);
    CHECK(with.param_cast_nodes > 0);
    CHECK(with.param_cast_nodes == without.param_cast_nodes);
    CHECK(with.casts_served == with.param_cast_nodes);
    check_same_bits(with, without);
  }
}

// The linear layers' f32 weights and biases with their gradients written in f32
// (train.linear_grads: f32), with the casts made up front and without: the same logits, every
// gradient within bf16's rounding of the autocast path's, and the linear layers' casts of their
// parameters gone from the graph (only the convolutions' and the other ops' are left).
void check_linear_f32_grads(Device device) {
  for (const std::string& name : model_fixtures()) {
    for (const bool up_front : {false, true}) {
      INFO("fixture " << name << " on " << device.str() << (up_front ? ", casts up front" : ""));
      Switches f32, autocast;
      f32.training = autocast.training = true;
      f32.linear_f32_grads = true;
      f32.param_casts = up_front;
      const Run with = run_fixture(name, device, f32);
      const Run without = run_fixture(name, device, autocast);
      CHECK(bitwise_equal(with.logits, without.logits));
      CHECK(with.param_cast_nodes < without.param_cast_nodes);
      if (up_front) CHECK(with.casts_served > with.param_cast_nodes);  // linear reads its casts
      // The input gradients flowing back are those of the autocast path to the bit only
      // through the layers after the first difference; the sums differ by bf16 roundings.
      check_close_grads(with, without, test::tolerance_for(DType::kBF16));
    }
  }
}

// CaiT's patch attention with its projections stacked (train.projections: stacked): one product
// where to_q and to_kv / to_v were two, one cast of the tokens fewer, norm1 writing the autocast
// dtype; the logits and every gradient within bf16 rounding of the separate products' under
// autocast (f32 accumulation over both weights at once, one rounding of the input's gradient),
// within f32's without it; in training (dropout and CaiT's layer dropout drawing alike). The
// other families have no such projections: the same bits.
void check_stacked_projections(Device device) {
  for (const std::string& name : model_fixtures()) {
    for (const bool autocast : {true, false}) {
      INFO("fixture " << name << " on " << device.str() << (autocast ? ", bf16 autocast" : ""));
      Switches stacked, separate;
      stacked.training = separate.training = true;
      stacked.autocast = separate.autocast = autocast;
      stacked.fused_residual_norm = separate.fused_residual_norm = true;
      stacked.stacked_projections = true;
      const Run with = run_fixture(name, device, stacked);
      const Run without = run_fixture(name, device, separate);
      if (name.rfind("cait", 0) != 0) {
        check_same_bits(with, without);
        continue;
      }
      // Each patch layer that ran (depth 2; layer dropout may leave one out) has one product
      // fewer, norm1 writing bf16, and under autocast three casts fewer: the two projections'
      // casts of norm1's f32 output and one of their two weights' (the stacked weight's instead).
      int ran = 0;
      for (const std::string norm : {"patch_layers.0.norm1", "patch_layers.1.norm1"}) {
        ran += static_cast<int>(std::count(with.flagged.begin(), with.flagged.end(), norm));
        CHECK(std::count(without.flagged.begin(), without.flagged.end(), norm) == 0);
      }
      CHECK(ran >= 1);
      CHECK(std::count(with.flagged.begin(), with.flagged.end(), "class_layers.0.norm1") == 0);
      CHECK(with.linear_nodes == without.linear_nodes - ran);
      CHECK(with.cast_nodes == without.cast_nodes - (autocast ? 3 * ran : 0));
      const test::Tolerance tol = test::tolerance_for(autocast ? DType::kBF16 : DType::kF32);
      test::require_close(with.logits, without.logits, tol, "logits");
      check_close_grads(with, without, tol);
    }
  }
}

// Names of the LayerNorms with autocast_output set.
std::vector<std::string> flagged_norms(nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, m] : model.named_modules()) {
    if (const auto* norm = dynamic_cast<const nn::LayerNorm*>(m); norm && norm->autocast_output)
      out.push_back(name);
  }
  return out;
}

// Names of the StarReLU activations with autocast_output set.
std::vector<std::string> flagged_star_relus(nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, m] : model.named_modules()) {
    const auto* act = dynamic_cast<const nn::Activation*>(m);
    if (act && act->kind() == "starrelu" && act->autocast_output) out.push_back(name);
  }
  return out;
}

}  // namespace

TEST_CASE("layer norms writing the autocast dtype give the same bits on every model fixture",
          "[cpu][autocast]") {
  check_same_bits(Device::cpu());
}

TEST_CASE("layer norms writing the autocast dtype: the same bits on CUDA", "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_same_bits(Device::cuda(0));
}

TEST_CASE("the blocks' fused residual add + layer norm gives the same bits on every fixture",
          "[cpu][autocast]") {
  check_fused_residual_norm(Device::cpu());
}

TEST_CASE("the blocks' fused residual add + layer norm: the same bits on CUDA",
          "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_fused_residual_norm(Device::cuda(0));
}

// CUDA's held-row layer norm forward kernels (set_cuda_layer_norm_held_forward): every fixture's
// logits and gradients keep their bits, with the residual adds fused (and ViT's branch dropouts
// inside them, in training) and without, under autocast.
TEST_CASE("the held-row layer norm forward: the same bits on CUDA", "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  for (const std::string& name : model_fixtures()) {
    for (const bool fused : {false, true}) {
      INFO("fixture " << name << ", residual norm fused " << fused);
      Switches loop;
      loop.fused_residual_norm = fused;
      loop.training = fused;
      Switches held = loop;
      held.held_forward = true;
      check_same_bits(run_fixture(name, Device::cuda(0), held),
                      run_fixture(name, Device::cuda(0), loop));
    }
  }
}

TEST_CASE("the parameters cast up front give every fixture the same bits as casts per use",
          "[cpu][autocast]") {
  check_param_casts(Device::cpu());
}

TEST_CASE("the parameters cast up front: the same bits on CUDA", "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_param_casts(Device::cuda(0));
}

TEST_CASE("linear layers writing f32 weight gradients: every fixture within bf16 rounding",
          "[cpu][autocast]") {
  check_linear_f32_grads(Device::cpu());
}

TEST_CASE("linear layers writing f32 weight gradients: the same on CUDA", "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_linear_f32_grads(Device::cuda(0));
}

TEST_CASE("CaiT's projections stacked into one product: every fixture within rounding",
          "[cpu][autocast]") {
  check_stacked_projections(Device::cpu());
}

TEST_CASE("CaiT's projections stacked into one product: the same on CUDA", "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_stacked_projections(Device::cuda(0));
}

TEST_CASE("only norms in front of matrix products write the autocast dtype", "[cpu][autocast]") {
  using Names = std::vector<std::string>;
  // ViT with CSKA: both norms of each block (the mixer reads x through its qv projection).
  manual_seed(1);
  CHECK(flagged_norms(*test::build_fixture_module("vit_cska")) ==
        Names{"blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2"});
  // CvT: only the MLP's norms (the attention's input goes through convolutions first).
  for (const std::string& name : flagged_norms(*test::build_fixture_module("cvt_mhsa"))) {
    INFO(name);
    CHECK(name.size() > 6);
    CHECK(name.compare(name.size() - 6, 6, ".norm2") == 0);
  }
  // The MetaFormer with sepconv, mhsa, pooling and mhsa stages: every block's norm2, and norm1
  // except in front of pooling (which subtracts its input).
  const Names mixed = flagged_norms(*test::build_fixture_module("metaformer_mixed"));
  CHECK(mixed == Names{"stages.0.0.norm1", "stages.0.0.norm2", "stages.1.0.norm1",
                       "stages.1.0.norm2", "stages.2.0.norm2", "stages.3.0.norm1",
                       "stages.3.0.norm2"});
  // Its StarReLUs: the sepconv's (read by the depthwise convolution) and every MLP's (read by
  // fc2, no dropout between); not the head's (a layer norm follows it).
  manual_seed(1);
  const nn::ModulePtr model = test::build_fixture_module("metaformer_mixed");
  Names all_star_relus;
  for (const auto& [name, m] : model->named_modules()) {
    const auto* act = dynamic_cast<const nn::Activation*>(m);
    if (act && act->kind() == "starrelu") all_star_relus.push_back(name);
  }
  Names expected;
  for (const std::string& name : all_star_relus) {
    if (name.rfind("head", 0) != 0) expected.push_back(name);
  }
  REQUIRE(expected.size() >= 5);  // the sepconv's and four MLPs'
  CHECK(flagged_star_relus(*model) == expected);
}

TEST_CASE("layer norm with a 16-bit output: the f32 result rounded once, gradients alike",
          "[cpu][autocast]") {
  for (DType out : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(out));
    const Tensor x0 = test::uniform({6, 40}, 1, -2.0, 2.0, DType::kF32);
    const Tensor w0 = test::uniform({40}, 2, 0.5, 1.5, DType::kF32);
    const Tensor b0 = test::uniform({40}, 3, -1.0, 1.0, DType::kF32);
    const Tensor g = test::uniform({6, 40}, 4, -1.0, 1.0, DType::kF32).to(out);
    const Tensor x1 = x0.clone().set_requires_grad(), w1 = w0.clone().set_requires_grad(),
                 b1 = b0.clone().set_requires_grad();
    const Tensor x2 = x0.clone().set_requires_grad(), w2 = w0.clone().set_requires_grad(),
                 b2 = b0.clone().set_requires_grad();
    const Tensor fused = layer_norm(x1, w1, b1, 1e-5, out);
    const Tensor cast_after = layer_norm(x2, w2, b2, 1e-5).to(out);
    REQUIRE(fused.dtype() == out);
    CHECK(bitwise_equal(fused, cast_after));
    fused.backward(g);
    cast_after.backward(g);
    REQUIRE(x1.grad().dtype() == DType::kF32);
    CHECK(bitwise_equal(x1.grad(), x2.grad()));
    CHECK(bitwise_equal(w1.grad(), w2.grad()));
    CHECK(bitwise_equal(b1.grad(), b2.grad()));
  }
  CHECK_THROWS_WITH(
      layer_norm(test::uniform({2, 3}, 7), Tensor(), Tensor(), 1e-5, DType::kBF16),
      Catch::Contains("layer_norm") && Catch::Contains("f64") && Catch::Contains("bf16"));
}
