// A string-keyed registry of builders (token mixers, model families). Filled by explicit
// registration calls (register_builtin_mixers, register_builtin_models), never by static
// initialisers the linker may drop.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace ska::nn {

template <typename Builder>
class Registry {
 public:
  explicit Registry(std::string what) : what_(std::move(what)) {}

  void add(const std::string& name, Builder builder) {
    SKA_CHECK(!builders_.count(name), ValueError, what_, " '", name, "' registered twice");
    builders_.emplace(name, std::move(builder));
  }
  bool contains(const std::string& name) const { return builders_.count(name) > 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, b] : builders_) out.push_back(name);
    return out;
  }
  // The builder named by `node[key]`; an unknown name fails at that config path with the
  // closest known name and the full list.
  const Builder& get(const ConfigNode& node, const std::string& key) const {
    return get(node.get<std::string>(key), node.path().empty() ? key : node.path() + "." + key);
  }
  // The builder called `name`; an unknown name is a ConfigError naming `path`.
  const Builder& get(const std::string& name, const std::string& path) const {
    auto it = builders_.find(name);
    if (it != builders_.end()) return it->second;
    std::string known;
    for (const std::string& n : names()) known += (known.empty() ? "" : ", ") + n;
    const std::string hint = closest_match(name, names());
    SKA_FAIL(ConfigError, path, ": unknown ", what_, " '", name, "'",
             hint.empty() ? "" : "; did you mean '" + hint + "'?", " (known: ", known, ")");
  }

 private:
  std::string what_;
  std::map<std::string, Builder> builders_;
};

}  // namespace ska::nn
