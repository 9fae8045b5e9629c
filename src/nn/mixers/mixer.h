// The token-mixer contract: the token layout a mixer sees (TokenGrid), what a family tells it
// (MixerArgs), and the string-keyed registry every family builds its mixers from.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "config/config.h"
#include "nn/init.h"
#include "nn/module.h"
#include "nn/registry.h"

namespace ska::nn {

// The token layout a mixer sees: x is [B, N, C] with N = height * width (+ 1 when a class token
// comes first, at index 0), spatial tokens in row-major order.
struct TokenGrid {
  int64_t height = 0;
  int64_t width = 0;
  bool cls_token = false;
  int64_t tokens() const { return height * width + (cls_token ? 1 : 0); }
};

// Which reference a mixer takes the defaults of its options from where they differ (the SKA and
// CSKA mixers' `flavour:`, see ska.h and cska.h).
enum class MixerFlavour { kVit, kMetaFormer };

// What the hosting family tells a mixer. A family states its conventions here rather than its
// name, so no mixer keeps a list of families.
struct MixerArgs {
  int64_t dim = 0;  // C, the width of the tokens
  TokenGrid grid;
  // How the family initialises Linear and Conv2d layers (the MetaFormer and CvT references:
  // trunc_normal(.02) with zero biases; ViT, CaiT and Swin: PyTorch's defaults). Every mixer
  // initialises its own layers this way.
  Init init = Init::kTorchDefault;
  MixerFlavour flavour = MixerFlavour::kVit;
  // Hints from the family's own keys (ViT's heads/head_dim/dropout); 0 means "the mixer's own
  // default". Options in the mixer's YAML map override them.
  int64_t heads = 0;
  int64_t head_dim = 0;
  double proj_drop = 0.0;
};

// Builds a mixer from its config map (which holds `type:` and the mixer's options; a null node
// gives every option its default).
using MixerBuilder = std::function<ModulePtr(const ConfigNode& cfg, const MixerArgs& args)>;

// The registry of token mixers, with every built-in mixer registered (once, on first use).
Registry<MixerBuilder>& mixer_registry();
// Registers the built-in mixers (idempotent); mixer_registry() calls it.
void register_builtin_mixers();

// Builds a mixer from a node that is either a type name ("sepconv") or a map with `type:` and the
// mixer's options. An unknown type fails at the node's path with the list of known types.
ModulePtr build_mixer_from_node(const ConfigNode& node, const MixerArgs& args);
// Builds the mixer of `parent[key]` (a name or a map); when the key is absent, `default_type` with
// its defaults (or the "required key missing" error if it is empty).
ModulePtr build_mixer(const ConfigNode& parent, const std::string& key, const MixerArgs& args,
                      const std::string& default_type = "");

}  // namespace ska::nn
