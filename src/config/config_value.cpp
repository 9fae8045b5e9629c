// The config tree: conversion from yaml-cpp nodes (with file:line:col of every value), include
// resolution with cycle detection, deep merge, and emission back to YAML text.
#include "config/config_value.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config.h"

namespace ska::detail {
namespace {

namespace fs = std::filesystem;

std::string mark_location(const std::string& origin, const YAML::Mark& mark) {
  if (mark.line < 0) return origin;
  return str_cat(origin, ":", mark.line + 1, ":", mark.column + 1);
}

// What one document may expand to once aliases are copied out: YAML shares an aliased node, our
// tree does not, so `&a [*b, *b, ...]` nested a few levels deep would otherwise take gigabytes.
constexpr int64_t kMaxConfigNodes = 100000;
constexpr int64_t kMaxConfigBytes = 16 << 20;  // map keys and scalar text
// How deep maps and lists may nest. Our configs use four or five levels; an alias inside its own
// anchor (`&b {lr: *b}`) makes yaml-cpp build a cycle, which would otherwise recurse forever.
constexpr int kMaxConfigDepth = 64;

// Counts the nodes, bytes and nesting depth of the tree being built; fails as soon as a limit is
// passed.
struct ExpansionBudget {
  std::string origin;
  int64_t nodes = 0;
  int64_t bytes = 0;
  int depth = 0;

  void spend(size_t text_bytes) {
    ++nodes;
    bytes += static_cast<int64_t>(text_bytes);
    SKA_CHECK(nodes <= kMaxConfigNodes, ConfigError, origin, ": the config expands to more than ",
              kMaxConfigNodes, " nodes (aliases copied out); expected at most ", kMaxConfigNodes,
              " (nested aliases?)");
    SKA_CHECK(bytes <= kMaxConfigBytes, ConfigError, origin, ": the config expands to more than ",
              kMaxConfigBytes, " bytes of keys and values (aliases copied out); expected at most ",
              kMaxConfigBytes, " (nested aliases?)");
  }
};

ConfigValuePtr from_yaml(const YAML::Node& node, ExpansionBudget& budget);

void read_map_entries(const YAML::Node& node, ExpansionBudget& budget, ConfigValue& map) {
  const std::string& origin = budget.origin;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      SKA_FAIL(ConfigError, mark_location(origin, entry.first.Mark()),
               ": map keys must be plain scalars");
    }
    const std::string key = entry.first.Scalar();
    if (map.find(key)) {
      SKA_FAIL(ConfigError, mark_location(origin, entry.first.Mark()), ": duplicate key '", key,
               "'");
    }
    budget.spend(key.size());
    map.entries.emplace_back(key, from_yaml(entry.second, budget));
  }
}

// Holds one level of nesting for as long as a map or list is being read.
class DepthGuard {
 public:
  DepthGuard(ExpansionBudget& budget, const YAML::Mark& mark) : budget_(budget) {
    SKA_CHECK(++budget_.depth <= kMaxConfigDepth, ConfigError, mark_location(budget_.origin, mark),
              ": maps and lists nest more than ", kMaxConfigDepth,
              " levels deep; expected at most ", kMaxConfigDepth,
              " (an alias used inside its own anchor?)");
  }
  ~DepthGuard() { --budget_.depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  ExpansionBudget& budget_;
};

ConfigValuePtr from_yaml(const YAML::Node& node, ExpansionBudget& budget) {
  const DepthGuard depth(budget, node.Mark());
  auto value = std::make_shared<ConfigValue>();
  value->origin = budget.origin;
  const YAML::Mark mark = node.Mark();
  if (mark.line >= 0) {
    value->line = mark.line + 1;
    value->column = mark.column + 1;
  }
  budget.spend(node.Type() == YAML::NodeType::Scalar ? node.Scalar().size() : 0);
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      value->kind = ConfigValue::Kind::kScalar;
      value->text = node.Scalar();
      value->quoted = node.Tag() != "?";  // yaml-cpp tags plain scalars "?", quoted ones "!"
      break;
    case YAML::NodeType::Sequence:
      value->kind = ConfigValue::Kind::kList;
      for (const auto& item : node) value->items.push_back(from_yaml(item, budget));
      break;
    case YAML::NodeType::Map:
      value->kind = ConfigValue::Kind::kMap;
      read_map_entries(node, budget, *value);
      break;
    default:
      break;  // null or undefined
  }
  return value;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) SKA_FAIL(ConfigError, "cannot open config file '", path, "'");
  const uintmax_t size = fs::file_size(path, ec);
  SKA_CHECK(ec || size <= static_cast<uintmax_t>(kMaxConfigBytes), ConfigError, path, ": ", size,
            " bytes; a config file may hold at most ", kMaxConfigBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) SKA_FAIL(ConfigError, "cannot open config file '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// One file on the include chain: its canonical path (for cycle checks) and its name as written.
struct IncludeFrame {
  std::string canonical;
  std::string display;
};
using IncludeChain = std::vector<IncludeFrame>;

std::string canonical_path(const std::string& path) {
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(path, ec);
  return ec ? path : canonical.string();
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::vector<std::string> include_paths(const ConfigValue& include) {
  if (include.kind == ConfigValue::Kind::kScalar) return {include.text};
  bool all_scalars = include.kind == ConfigValue::Kind::kList;
  std::vector<std::string> paths;
  for (const ConfigValuePtr& item : include.items) {
    all_scalars = all_scalars && item->kind == ConfigValue::Kind::kScalar;
    if (all_scalars) paths.push_back(item->text);
  }
  if (!all_scalars) {
    SKA_FAIL(ConfigError, "include: expected a file path or a list of file paths, got ",
             describe_value(include), value_location(include));
  }
  return paths;
}

// Looks for `name` relative to the including file's directory, then under $SKA_CONFIG_DIR.
std::string find_include(const std::string& name, const std::string& base_dir,
                         const ConfigValue& include) {
  std::error_code ec;
  if (fs::path(name).is_absolute()) {
    if (fs::exists(name, ec)) return name;
    SKA_FAIL(ConfigError, "include '", name, "' not found", value_location(include));
  }
  const std::string local = (fs::path(base_dir) / name).string();
  if (fs::exists(local, ec)) return local;
  const char* env_dir = std::getenv("SKA_CONFIG_DIR");
  std::string looked = "looked for " + local;
  if (env_dir != nullptr && env_dir[0] != '\0') {
    const std::string shared = (fs::path(env_dir) / name).string();
    if (fs::exists(shared, ec)) return shared;
    looked += " and " + shared;
  } else {
    looked += "; SKA_CONFIG_DIR is not set";
  }
  SKA_FAIL(ConfigError, "include '", name, "' not found (", looked, ")", value_location(include));
}

void check_no_cycle(const IncludeChain& chain, const std::string& canonical,
                    const std::string& name, const ConfigValue& include) {
  bool cycle = false;
  for (const IncludeFrame& frame : chain) cycle = cycle || frame.canonical == canonical;
  if (!cycle) return;
  std::string text;
  for (const IncludeFrame& frame : chain) text += frame.display + " -> ";
  SKA_FAIL(ConfigError, "include cycle: ", text, name, value_location(include));
}

void resolve_in(ConfigValuePtr& value, const std::string& base_dir, IncludeChain& chain);

// The merged contents of the files named by an `include:` value.
ConfigValuePtr load_includes(const ConfigValue& include, const std::string& base_dir,
                             IncludeChain& chain) {
  ConfigValuePtr merged = make_map();
  for (const std::string& name : include_paths(include)) {
    const std::string path = find_include(name, base_dir, include);
    const std::string canonical = canonical_path(path);
    check_no_cycle(chain, canonical, name, include);
    ConfigValuePtr included = load_yaml_file(path);
    chain.push_back({canonical, name});
    resolve_in(included, parent_dir(path), chain);
    chain.pop_back();
    merged = deep_merge(merged, included);
  }
  return merged;
}

void resolve_in(ConfigValuePtr& value, const std::string& base_dir, IncludeChain& chain) {
  for (ConfigValuePtr& item : value->items) resolve_in(item, base_dir, chain);
  for (auto& entry : value->entries) {
    if (entry.first != "include") resolve_in(entry.second, base_dir, chain);
  }
  const ConfigValuePtr include = value->find("include");
  if (value->kind != ConfigValue::Kind::kMap || !include) return;
  ConfigValuePtr base = load_includes(*include, base_dir, chain);
  value->erase("include");
  value = deep_merge(base, value);
}

void emit(YAML::Emitter& out, const ConfigValue& value) {
  switch (value.kind) {
    case ConfigValue::Kind::kNull:
      out << YAML::Null;
      break;
    case ConfigValue::Kind::kScalar:
      if (value.quoted) out << YAML::DoubleQuoted;
      out << value.text;
      break;
    case ConfigValue::Kind::kMap:
      out << YAML::BeginMap;
      for (const auto& entry : value.entries) {
        out << YAML::Key << entry.first << YAML::Value;
        emit(out, *entry.second);
      }
      out << YAML::EndMap;
      break;
    case ConfigValue::Kind::kList: {
      bool flat = true;  // lists of scalars print on one line
      for (const ConfigValuePtr& item : value.items) {
        flat =
            flat && item->kind != ConfigValue::Kind::kMap && item->kind != ConfigValue::Kind::kList;
      }
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const ConfigValuePtr& item : value.items) emit(out, *item);
      out << YAML::EndSeq;
      break;
    }
  }
}

}  // namespace

ConfigValuePtr ConfigValue::find(const std::string& key) const {
  for (const auto& entry : entries) {
    if (entry.first == key) return entry.second;
  }
  return nullptr;
}

void ConfigValue::erase(const std::string& key) {
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->first == key) {
      entries.erase(it);
      return;
    }
  }
}

ConfigValuePtr make_map() {
  auto map = std::make_shared<ConfigValue>();
  map->kind = ConfigValue::Kind::kMap;
  return map;
}

ConfigValuePtr parse_yaml(const std::string& text, const std::string& origin) {
  try {
    ExpansionBudget budget{origin};
    return from_yaml(YAML::Load(text), budget);
  } catch (const YAML::Exception& e) {
    SKA_FAIL(ConfigError, mark_location(origin, e.mark), ": YAML syntax error: ", e.msg);
  }
}

ConfigValuePtr load_yaml_file(const std::string& path) {
  ConfigValuePtr value = parse_yaml(read_text_file(path), path);
  if (value->kind == ConfigValue::Kind::kNull) {
    value = make_map();
    value->origin = path;
  }
  if (value->kind != ConfigValue::Kind::kMap) {
    SKA_FAIL(ConfigError, path, ": expected a map at the top level, got ", describe_value(*value));
  }
  return value;
}

void resolve_includes(ConfigValuePtr& value, const std::string& file, const std::string& base_dir) {
  std::error_code ec;
  IncludeChain chain{{fs::exists(file, ec) ? canonical_path(file) : std::string(), file}};
  resolve_in(value, base_dir, chain);
}

ConfigValuePtr deep_merge(const ConfigValuePtr& base, const ConfigValuePtr& over) {
  const bool both_maps =
      base->kind == ConfigValue::Kind::kMap && over->kind == ConfigValue::Kind::kMap;
  if (!both_maps) return over;
  auto merged = std::make_shared<ConfigValue>(*over);
  merged->entries = base->entries;
  for (const auto& entry : over->entries) {
    bool replaced = false;
    for (auto& existing : merged->entries) {
      if (existing.first != entry.first) continue;
      existing.second = deep_merge(existing.second, entry.second);
      replaced = true;
    }
    if (!replaced) merged->entries.push_back(entry);
  }
  return merged;
}

std::string emit_yaml(const ConfigValue& value) {
  YAML::Emitter out;
  emit(out, value);
  return std::string(out.c_str()) + "\n";
}

std::string describe_value(const ConfigValue& value) {
  switch (value.kind) {
    case ConfigValue::Kind::kScalar:
      return "'" + value.text + "'";
    case ConfigValue::Kind::kMap:
      return "a map";
    case ConfigValue::Kind::kList:
      return "a list";
    default:
      return "null";
  }
}

std::string value_location(const ConfigValue& value) {
  if (value.line < 0) return " (from " + value.origin + ")";
  if (value.line == 0) return "";
  return str_cat(" (at ", value.origin, ":", value.line, ":", value.column, ")");
}

std::string join_key(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

}  // namespace ska::detail
