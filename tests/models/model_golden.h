// Test helpers for whole models and mixers: golden fixtures from scripts/golden_models/*.py
// (weights under our state_dict names + YAML beside them) and CUDA-vs-CPU parity of a module.
#pragma once

#include <functional>
#include <string>

#include "config/config.h"
#include "models/model.h"
#include "nn/module.h"

namespace ska::test {

// Builds tests/fixtures/models/<name>.yaml: a model config (with `family:`), or a mixer fixture
// (`dim`, `grid: [H, W]`, `cls_token`, `family`, `mixer:`), then checks that every key was read.
nn::ModulePtr build_fixture_module(const std::string& name);

// Loads <name>.safetensors into the module in f64 (eval mode), runs `input`, and compares the
// output and the gradients of sum(output * grad_weight) (input and listed parameters) with the
// reference at tolerance_for(kF64).
void check_model_golden(const std::string& name);

// Builds the module twice with the same weights, one on CUDA, and compares outputs, the input
// gradient and every parameter gradient within tolerance_for(kF32). `input` is f32 on the CPU.
void check_module_cuda_parity(const std::function<nn::ModulePtr()>& build, const Tensor& input);

}  // namespace ska::test
