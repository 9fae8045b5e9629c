// Building models from YAML: the token-mixer and model-family registries, and build_model().
//
// A model config is a map with `family:` naming a registered family builder; the family reads its
// own keys (stage depths, widths, per-stage mixers ...). Token mixers are built by name from
// nn::mixer_registry() with the mixer's config map and what the family knows about the input.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "nn/mixers/mixer.h"
#include "nn/module.h"
#include "nn/registry.h"

namespace ska::models {

// The mixer contract lives with the mixers (nn/mixers/mixer.h); families name it from here.
using nn::build_mixer;
using nn::build_mixer_from_node;
using nn::MixerArgs;
using nn::MixerBuilder;
using nn::mixer_registry;
using nn::Registry;
using nn::TokenGrid;

// The model-level facts every family needs, read from the model map by build_model.
struct ModelInput {
  int64_t image_size = 224;
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
};

// Builds a whole model from a model config map (the `model:` section of an experiment).
// Input [B, in_channels, image_size, image_size] -> logits [B, num_classes].
using FamilyBuilder = std::function<nn::ModulePtr(const ConfigNode& cfg, const ModelInput& input)>;
Registry<FamilyBuilder>& family_registry();

// Registers every built-in mixer and family (idempotent). Called by build_model.
void register_builtin_models();

nn::ModulePtr build_model(const ConfigNode& model_cfg);

}  // namespace ska::models
