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

std::vector<StageMixer> read_stage_mixers(const ConfigNode& cfg, size_t stages,
                                          const std::vector<std::string>& known,
                                          const std::string& fallback) {
  std::vector<StageMixer> out;
  if (cfg.has("mixers")) {
    const ConfigNode list = cfg["mixers"];
    if (!list.is_list() || list.size() != stages)
      cfg.fail("mixers", "expected a list of " + std::to_string(stages) + " mixers, one per stage");
    for (size_t i = 0; i < stages; ++i) out.push_back(read_entry(list.at(i), known, fallback));
    return out;
  }
  const StageMixer all = read_entry(cfg["mixer"], known, fallback);
  return std::vector<StageMixer>(stages, all);
}

}  // namespace ska::models
