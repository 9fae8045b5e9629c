// The config document as a plain tree (internal to src/config): reading it from YAML text and
// files, resolving `include:` keys, deep merging, and writing it back as YAML.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ska::detail {

struct ConfigValue;
using ConfigValuePtr = std::shared_ptr<ConfigValue>;

// One node: null, a scalar (kept as its text), a map (in document order) or a list.
struct ConfigValue {
  enum class Kind { kNull, kScalar, kMap, kList };

  Kind kind = Kind::kNull;
  std::string text;     // a scalar's text
  bool quoted = false;  // written quoted, as a block or tagged: a string, never a number or bool
  std::vector<std::pair<std::string, ConfigValuePtr>> entries;  // a map's keys and values
  std::vector<ConfigValuePtr> items;                            // a list's elements
  std::string origin;  // the file (or "<string>", "override ...") it was written in
  int line = 0;        // 1-based; 0 when unknown, -1 for values that came from an override
  int column = 0;

  ConfigValuePtr find(const std::string& key) const;  // nullptr when absent
  void erase(const std::string& key);
};

// The resolved document and which keys readers asked for, per map path ("" is the root).
struct ConfigState {
  ConfigValuePtr root;
  std::map<std::string, std::set<std::string>> asked;
  std::set<std::string> visited;  // paths of list elements that were visited with at()
};

ConfigValuePtr make_map();
// Parses YAML text (one document). ConfigError "origin:line:col: YAML syntax error: ..." on
// bad syntax, and for duplicate or non-scalar keys.
ConfigValuePtr parse_yaml(const std::string& text, const std::string& origin);
// Reads and parses a file whose top level must be a map (an empty file is an empty map).
ConfigValuePtr load_yaml_file(const std::string& path);
// Replaces every `include:` key in `value` (a document written in `file`, whose includes resolve
// relative to `base_dir`) with the merged contents of the files it names.
void resolve_includes(ConfigValuePtr& value, const std::string& file, const std::string& base_dir);
// `over` merged into `base`: maps merge key by key (recursively), anything else replaces.
ConfigValuePtr deep_merge(const ConfigValuePtr& base, const ConfigValuePtr& over);
std::string emit_yaml(const ConfigValue& value);

// "'abc'", "a map", "a list" or "null": how an error message names a value.
std::string describe_value(const ConfigValue& value);
// " (at file:line:col)", " (from override 'k=v')", or "" when the position is unknown.
std::string value_location(const ConfigValue& value);
std::string join_key(const std::string& path, const std::string& key);  // "a.b" or "b"

}  // namespace ska::detail
