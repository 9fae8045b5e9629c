// Reading per-stage token-mixer choices (string or map form) from a model config.
#include "models/stage_mixers.h"

namespace ska::models {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// One mixer entry: a type name, a map with `type:` and options, or null (the fallback type).
StageMixer read_entry(const ConfigNode& node, const std::vector<std::string>& known,
                      const std::string& fallback) {
  StageMixer mixer;
  if (node.is_map()) {
    mixer.options = node;
    mixer.type = node.get_choice("type", fallback, known);
    return mixer;
  }
  mixer.type = node.is_null() ? fallback : node.as<std::string>();
  for (const std::string& k : known)
    if (k == mixer.type) return mixer;
  const std::string hint = closest_match(mixer.type, known);
  SKA_FAIL(ConfigError, node.path(), ": unknown token mixer '", mixer.type, "'",
           hint.empty() ? "" : "; did you mean '" + hint + "'?", " (known here: ", join(known),
           ")");
}

}  // namespace

std::vector<ConfigNode> read_stage_mixer_nodes(const ConfigNode& cfg, size_t stages) {
  if (!cfg.has("mixers")) return std::vector<ConfigNode>(stages, cfg["mixer"]);
  const ConfigNode node = cfg["mixers"];
  if (!node.is_list()) return std::vector<ConfigNode>(stages, node);
  if (node.size() != stages) {
    cfg.fail("mixers", "has " + std::to_string(node.size()) + " entries for " +
                           std::to_string(stages) + " stages; expected one token mixer per stage");
  }
  std::vector<ConfigNode> nodes;
  for (size_t i = 0; i < stages; ++i) nodes.push_back(node.at(i));
  return nodes;
}

std::vector<StageMixer> read_stage_mixers(const ConfigNode& cfg, size_t stages,
                                          const std::vector<std::string>& known,
                                          const std::string& fallback) {
  std::vector<StageMixer> out;
  for (const ConfigNode& node : read_stage_mixer_nodes(cfg, stages))
    out.push_back(read_entry(node, known, fallback));
  return out;
}

}  // namespace ska::models
