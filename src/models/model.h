// Building models from YAML: the token-mixer and model-family registries, and build_model().
//
// A model config is a map with `family:` naming a registered family builder; the family reads its
// own keys (stage depths, widths, per-stage mixers ...). Token mixers are built by name from
// mixer_registry() with the mixer's config map and what the family knows about the input.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "models/registry.h"
#include "nn/module.h"

namespace ska::models {

// The token layout a mixer sees: x is [B, N, C] with N = height * width (+ 1 when a class token
// comes first, at index 0), spatial tokens in row-major order.
struct TokenGrid {
  int64_t height = 0;
  int64_t width = 0;
  bool cls_token = false;
  int64_t tokens() const { return height * width + (cls_token ? 1 : 0); }
};

struct MixerArgs {
  int64_t dim = 0;   // C, the width of the tokens
  TokenGrid grid;
  std::string family;  // "metaformer", "vit", "cait", "swin", "cvt": family-specific defaults
  // Hints from the family's own keys (ViT's heads/head_dim/dropout); 0 means "the mixer's own
  // default". Options in the mixer's YAML map override them.
  int64_t heads = 0;
  int64_t head_dim = 0;
  double proj_drop = 0.0;
};

// Builds a mixer from its config map (which holds `type:` and the mixer's options).
using MixerBuilder = std::function<nn::ModulePtr(const ConfigNode& cfg, const MixerArgs& args)>;
Registry<MixerBuilder>& mixer_registry();

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
