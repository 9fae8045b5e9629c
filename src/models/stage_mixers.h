// Reading per-stage token-mixer choices from a model config: `mixer:` (one for every stage) or
// `mixers:` (one entry per stage), each entry a type name or a map {type: ..., options...}.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace ska::models {

// The per-stage mixer entries, unchecked: `mixers:` (a list with one entry per stage, or a single
// entry for every stage) or `mixer:` (one entry for every stage); null nodes when cfg has neither.
// A list of the wrong length fails at its config path.
std::vector<ConfigNode> read_stage_mixer_nodes(const ConfigNode& cfg, size_t stages);

// One stage's mixer: its type and the map holding its options (a null node for the string
// form, so every option read from it gives its default).
struct StageMixer {
  std::string type;
  ConfigNode options;
};

// The mixers of `stages` stages from cfg's `mixers:` list or `mixer:` entry (default `fallback`).
// Types outside `known` fail at their config path, naming the closest known type.
std::vector<StageMixer> read_stage_mixers(const ConfigNode& cfg, size_t stages,
                                          const std::vector<std::string>& known,
                                          const std::string& fallback);

}  // namespace ska::models
