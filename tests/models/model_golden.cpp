// Golden-fixture and CUDA-parity helpers for models and mixers.
#include "models/model_golden.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>

#include "io/safetensors.h"
#include "models/metaformer.h"
#include "models/vit.h"
#include "support/test_util.h"

namespace ska::test {

namespace {

std::string fixture_path(const std::string& name, const std::string& extension) {
  return std::string(SKA_TEST_FIXTURES) + "/models/" + name + extension;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

nn::ModulePtr build_mixer_fixture(const ConfigNode& cfg) {
  const int64_t dim = cfg.get<int64_t>("dim");
  const std::vector<int64_t> grid = cfg.get<std::vector<int64_t>>("grid");
  REQUIRE(grid.size() == 2);
  const models::TokenGrid tokens{grid[0], grid[1], cfg.get<bool>("cls_token", false)};
  // The conventions of the family the fixture's mixer lives in.
  const std::string family = cfg.get_choice("family", "vit", {"vit", "metaformer"});
  const models::MixerArgs args = family == "metaformer" ? models::metaformer_mixer_args(dim, tokens)
                                                        : models::vit_mixer_args(dim, tokens);
  return models::build_mixer(cfg, "mixer", args);
}

std::map<std::string, Tensor> parameters_by_name(const nn::Module& module) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : module.named_parameters()) out[name] = tensor;
  return out;
}

}  // namespace

nn::ModulePtr build_fixture_module(const std::string& name) {
  Config cfg = Config::load(fixture_path(name, ".yaml"));
  const ConfigNode root = cfg.root();
  nn::ModulePtr module = root.has("family") && root.has("image_size") ? models::build_model(root)
                                                                      : build_mixer_fixture(root);
  cfg.check_unused();
  return module;
}

void check_model_golden(const std::string& name) {
  INFO("fixture " << name);
  const TensorMap fixture = load_safetensors(fixture_path(name, ".safetensors"));
  const nn::ModulePtr module = build_fixture_module(name);
  module->to(DType::kF64);
  module->eval();
  std::map<std::string, Tensor> state;
  for (const auto& [key, tensor] : fixture) {
    if (starts_with(key, "state.")) state[key.substr(6)] = tensor;
  }
  module->load_state_dict(state);  // strict: our names and shapes must match the reference's

  const Tensor input = fixture.at("input").clone().set_requires_grad(true);
  const Tensor output = (*module)(input);
  require_close(output, fixture.at("output"), tolerance_for(DType::kF64), "output");
  sum(mul(output, fixture.at("grad_weight"))).backward();
  require_close(input.grad(), fixture.at("grad.input"), tolerance_for(DType::kF64), "grad.input");

  const auto params = parameters_by_name(*module);
  int checked = 0;
  for (const auto& [key, expected] : fixture) {
    if (!starts_with(key, "grad.") || key == "grad.input") continue;
    const Tensor& param = params.at(key.substr(5));
    REQUIRE(param.grad().defined());
    require_close(param.grad(), expected, tolerance_for(DType::kF64), key);
    ++checked;
  }
  CHECK(checked >= 3);
}

void check_module_cuda_parity(const std::function<nn::ModulePtr()>& build, const Tensor& input) {
  const nn::ModulePtr cpu = build();
  const nn::ModulePtr gpu = build();
  gpu->load_state_dict(cpu->state_dict());
  gpu->to(Device::cuda(0));
  cpu->eval();
  gpu->eval();
  const Tensor x_cpu = input.detach().clone().set_requires_grad(true);
  const Tensor x_gpu = input.detach().to(Device::cuda(0)).set_requires_grad(true);
  const Tensor out_cpu = (*cpu)(x_cpu);
  const Tensor out_gpu = (*gpu)(x_gpu);
  const Tolerance tol = tolerance_for(DType::kF32);
  require_close(out_gpu, out_cpu, tol, "CUDA forward vs CPU");
  const Tensor w = uniform(out_cpu.shape(), 777, 0.5, 1.5, DType::kF32);
  sum(mul(out_cpu, w)).backward();
  sum(mul(out_gpu, w.to(Device::cuda(0)))).backward();
  require_close(x_gpu.grad(), x_cpu.grad(), tol, "CUDA input gradient vs CPU");
  const auto gpu_params = parameters_by_name(*gpu);
  for (const auto& [name, param] : cpu->named_parameters()) {
    require_close(gpu_params.at(name).grad(), param.grad(), tol, "CUDA gradient of " + name);
  }
}

}  // namespace ska::test
