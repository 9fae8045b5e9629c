// Test helpers of the Swin and CvT model tests: building a model from a YAML file, the parameter
// count checks, and the golden comparison against scripts/golden_models/{swin,cvt}.py.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "support/test_util.h"

namespace ska::test {

inline std::string repo_path(const std::string& relative) {
  return std::string(SKA_SOURCE_DIR) + "/" + relative;
}

// Builds the model of a YAML file, with optional --set style overrides, and checks that every key
// of the file was read.
inline nn::ModulePtr build_model_file(const std::string& path,
                                      const std::vector<std::string>& overrides = {}) {
  Config cfg = Config::load(path);
  for (const std::string& o : overrides) cfg.set(o);
  nn::ModulePtr model = models::build_model(cfg.root());
  cfg.check_unused();
  return model;
}

// configs/models/<name>.yaml has `expected` trainable parameters (the reference table, 10 classes, RGB)
// and `expected_100_grey` with num_classes=100 and in_channels=1.
inline void require_param_count(const std::string& name, int64_t expected,
                                int64_t expected_100_grey) {
  INFO(name);
  const std::string path = repo_path("configs/models/" + name + ".yaml");
  CHECK(build_model_file(path)->num_parameters(true) == expected);
  CHECK(build_model_file(path, {"num_classes=100", "in_channels=1"})->num_parameters(true) ==
        expected_100_grey);
}

// Loads tests/fixtures/models/<name>.{yaml,safetensors}, runs the model in f64 (eval mode) and
// compares the logits and the gradients of sum(logits * w) the fixture holds.
inline void require_golden_model(const std::string& name) {
  INFO("fixture " << name);
  const std::string base = std::string(SKA_TEST_FIXTURES) + "/models/" + name;
  nn::ModulePtr model = build_model_file(base + ".yaml");
  const TensorMap fixture = load_safetensors(base + ".safetensors");
  std::map<std::string, Tensor> weights;
  for (const auto& [key, t] : fixture)
    if (key.rfind("param.", 0) == 0) weights[key.substr(6)] = t;
  model->to(DType::kF64);
  model->load_state_dict(weights);
  model->eval();
  Tensor x = fixture.at("input").clone().set_requires_grad();
  Tensor logits = (*model)(x);
  require_close(logits, fixture.at("output"), tolerance_for(DType::kF64), name + " logits");
  sum(mul(logits, fixture.at("grad_weight"))).backward();
  require_close(x.grad(), fixture.at("grad.input"), tolerance_for(DType::kF64), "grad.input");
  std::map<std::string, Tensor> params;
  for (const auto& [key, p] : model->named_parameters()) params[key] = p;
  int checked = 0;
  for (const auto& [key, g] : fixture) {
    if (key.rfind("grad.", 0) != 0 || key == "grad.input" || key == "grad_weight") continue;
    REQUIRE(params.count(key.substr(5)));
    require_close(params.at(key.substr(5)).grad(), g, tolerance_for(DType::kF64), key);
    ++checked;
  }
  CHECK(checked >= 3);
}

// The model of fixture `name` on CUDA vs the CPU (same weights, f32, eval mode): logits and the
// input gradient, within tolerance_for(kF32).
inline void require_model_cuda_parity(const std::string& name) {
  if (!cuda_available_or_skip()) return;
  const std::string base = std::string(SKA_TEST_FIXTURES) + "/models/" + name;
  nn::ModulePtr cpu = build_model_file(base + ".yaml");
  nn::ModulePtr gpu = build_model_file(base + ".yaml");
  gpu->load_state_dict(cpu->state_dict());
  cpu->eval();
  gpu->eval();
  gpu->to(Device::cuda(0));
  const Tensor x = load_safetensors(base + ".safetensors").at("input").to(DType::kF32);
  auto run = [&](const TensorList& in) {
    return in[0].device().is_cuda() ? (*gpu)(in[0]) : (*cpu)(in[0]);
  };
  check_cuda_parity(run, {x.clone().set_requires_grad()}, DType::kF32);
}

}  // namespace ska::test
