// Config: loading and parsing, "key.path=value" overrides, dump, and the strict unknown-key check
// (with "did you mean" suggestions); also closest_match, shared with the registries.
#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "config/config_value.h"

namespace ska {
namespace {

using detail::ConfigState;
using detail::ConfigValue;
using detail::ConfigValuePtr;
using detail::str_cat;

std::string to_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
    }
  }
  return row[b.size()];
}

// The candidate with the smallest case-insensitive edit distance to `word`, if <= max_distance.
std::string nearest_within(const std::string& word, const std::vector<std::string>& candidates,
                           size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(to_lower(word), to_lower(candidate));
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// The known key an unknown one was probably meant to be: edit distance <= 2 (case-insensitive),
// else one being a prefix of the other.
std::string suggest_key(const std::string& key, const std::vector<std::string>& known) {
  std::string suggestion = nearest_within(key, known, 2);
  if (!suggestion.empty()) return suggestion;
  const std::string lower = to_lower(key);
  for (const std::string& candidate : known) {
    const std::string other = to_lower(candidate);
    const size_t shorter = std::min(lower.size(), other.size());
    if (shorter >= 2 && (starts_with(lower, other) || starts_with(other, lower))) return candidate;
  }
  return "";
}

std::string join(const std::vector<std::string>& words, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < words.size(); ++i) text += (i ? separator : "") + words[i];
  return text;
}

std::string unknown_key_message(const std::string& path, const std::string& key,
                                const std::set<std::string>* asked) {
  const std::string message = path + ": unknown key";
  if (asked == nullptr || asked->empty()) return message;
  const std::vector<std::string> known(asked->begin(), asked->end());
  const std::string suggestion = suggest_key(key, known);
  if (!suggestion.empty()) return message + "; did you mean '" + suggestion + "'?";
  return message + "; known keys: " + join(known, ", ");
}

bool is_container(const ConfigValue& value) {
  return value.kind == ConfigValue::Kind::kMap || value.kind == ConfigValue::Kind::kList;
}

void collect_unused(const ConfigValue& value, const std::string& path, const ConfigState& state,
                    std::vector<std::string>& problems) {
  if (value.kind == ConfigValue::Kind::kMap) {
    const auto asked_it = state.asked.find(path);
    const std::set<std::string>* asked =
        asked_it == state.asked.end() ? nullptr : &asked_it->second;
    for (const auto& [key, child] : value.entries) {
      const std::string child_path = detail::join_key(path, key);
      if (asked == nullptr || asked->count(key) == 0) {
        // Where it was written (the file of an include, or the --set that made it).
        problems.push_back(unknown_key_message(child_path, key, asked) + value_location(*child));
      } else {
        collect_unused(*child, child_path, state, problems);
      }
    }
  }
  for (size_t i = 0; i < value.items.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    if (!is_container(*value.items[i])) continue;
    if (state.visited.count(item_path) == 0) {
      problems.push_back(item_path + ": list element never read");
    } else {
      collect_unused(*value.items[i], item_path, state, problems);
    }
  }
}

// One step of an override path: a map key or a list index.
struct PathStep {
  std::string key;
  bool is_index = false;
  size_t index = 0;
};

[[noreturn]] void fail_override(const std::string& assignment, const std::string& why) {
  SKA_FAIL(ConfigError, "malformed override '", assignment, "': ", why);
}

bool is_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

// Parses "a.b[1].c" into steps; anything else is a malformed override.
std::vector<PathStep> parse_override_path(const std::string& path, const std::string& assignment) {
  const std::string expected = "expected key.path=value, e.g. model.stages[1].mixer.type=cska";
  std::vector<PathStep> steps;
  size_t pos = 0;
  while (true) {
    const size_t start = pos;
    while (pos < path.size() && is_key_char(path[pos])) ++pos;
    if (pos == start) fail_override(assignment, expected);
    steps.push_back({path.substr(start, pos - start)});
    while (pos < path.size() && path[pos] == '[') {
      const size_t close = path.find(']', pos);
      if (close == std::string::npos || close == pos + 1 || close - pos > 10) {
        fail_override(assignment, expected);
      }
      const std::string digits = path.substr(pos + 1, close - pos - 1);
      for (char c : digits) {
        if (!std::isdigit(static_cast<unsigned char>(c))) fail_override(assignment, expected);
      }
      steps.push_back({"", true, std::stoul(digits)});
      pos = close + 1;
    }
    if (pos == path.size()) return steps;
    if (path[pos++] != '.') fail_override(assignment, expected);
  }
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// Follows one override step from `node` (nullptr: below a key that does not exist yet). A dry
// run (`create` false) only validates, so a failing override changes nothing; with `create`,
// missing keys are added and null nodes become maps or lists.
ConfigValue* step_into(ConfigValue* node, const PathStep& step, const std::string& where,
                       const std::string& assignment, bool create) {
  using Kind = ConfigValue::Kind;
  const Kind wanted = step.is_index ? Kind::kList : Kind::kMap;
  const bool empty = node == nullptr || node->kind == Kind::kNull;
  if (!empty && node->kind != wanted) {
    fail_override(assignment, str_cat("'", where, "' is ", detail::describe_value(*node),
                                      ", not a ", step.is_index ? "list" : "map"));
  }
  const size_t length = empty ? 0 : node->items.size();
  if (step.is_index && step.index > length) {
    fail_override(assignment, str_cat("index ", step.index, " is out of range; '", where, "' has ",
                                      length, " elements"));
  }
  if (node == nullptr || (empty && !create)) return nullptr;
  if (empty) node->kind = wanted;
  if (step.is_index) {
    if (step.index == length && !create) return nullptr;
    if (step.index == length) node->items.push_back(std::make_shared<ConfigValue>());
    return node->items[step.index].get();
  }
  ConfigValuePtr child = node->find(step.key);
  if (child || !create) return child.get();
  node->entries.emplace_back(step.key, std::make_shared<ConfigValue>());
  return node->entries.back().second.get();
}

// Error messages about these values say "(from override '...')" instead of a line and column.
void mark_from_override(ConfigValue& value) {
  value.line = -1;
  for (const ConfigValuePtr& item : value.items) mark_from_override(*item);
  for (const auto& entry : value.entries) mark_from_override(*entry.second);
}

}  // namespace

Config::Config() : state_(std::make_shared<ConfigState>()) { state_->root = detail::make_map(); }

Config::Config(std::shared_ptr<ConfigState> state) : state_(std::move(state)) {}

Config Config::load(const std::string& path) {
  ConfigValuePtr root = detail::load_yaml_file(path);
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  detail::resolve_includes(root, path, base_dir.empty() ? "." : base_dir);
  auto state = std::make_shared<ConfigState>();
  state->root = root;
  return Config(state);
}

Config Config::parse(const std::string& yaml_text, const std::string& origin) {
  ConfigValuePtr root = detail::parse_yaml(yaml_text, origin);
  if (root->kind == ConfigValue::Kind::kNull) root = detail::make_map();
  if (root->kind != ConfigValue::Kind::kMap) {
    SKA_FAIL(ConfigError, origin, ": expected a map at the top level, got ",
             detail::describe_value(*root));
  }
  detail::resolve_includes(root, origin, std::filesystem::current_path().string());
  auto state = std::make_shared<ConfigState>();
  state->root = root;
  return Config(state);
}

void Config::set(const std::string& assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos) fail_override(assignment, "expected key.path=value");
  const std::string path = trim(assignment.substr(0, equals));
  const std::vector<PathStep> steps = parse_override_path(path, assignment);
  if (trim(assignment.substr(equals + 1)).empty()) {  // a forgotten value, not a wish for null
    fail_override(assignment, str_cat("the value of '", path, "' is empty; write ", path,
                                      "=null (or ~) to clear the key"));
  }
  const std::string origin = "override '" + assignment + "'";
  ConfigValuePtr value;
  try {
    value = detail::parse_yaml(assignment.substr(equals + 1), origin);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    const size_t reason = what.find("YAML syntax error: ");
    if (reason == std::string::npos) throw;  // e.g. the expansion limit, which names the override
    fail_override(assignment, "the value is not valid YAML: " + what.substr(reason + 19));
  }
  detail::resolve_includes(value, origin, std::filesystem::current_path().string());
  mark_from_override(*value);
  for (const bool create : {false, true}) {
    ConfigValue* node = state_->root.get();
    std::string where = "<root>";
    for (const PathStep& step : steps) {
      node = step_into(node, step, where, assignment, create);
      where = step.is_index ? str_cat(where, "[", step.index, "]")
                            : (where == "<root>" ? step.key : where + "." + step.key);
    }
    if (create) *node = *value;  // in place, so nodes read before the override see it too
  }
}

ConfigNode Config::root() const {
  ConfigNode node(state_, state_->root, "");
  node.record_visit();
  return node;
}

std::string Config::dump() const { return detail::emit_yaml(*state_->root); }

void Config::check_unused() const {
  std::vector<std::string> problems;
  collect_unused(*state_->root, "", *state_, problems);
  if (!problems.empty()) throw ConfigError(join(problems, "\n"));
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  return nearest_within(word, candidates, std::max<size_t>(2, word.size() / 3));
}

}  // namespace ska
