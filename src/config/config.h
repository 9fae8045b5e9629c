// YAML configuration shared by every command: loading with includes, key.path=value overrides,
// typed reads with path-naming errors, and a strict check that every key in the file was read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace ska {

// A config file that cannot be read or parsed, or a value that is missing, malformed or unknown.
class ConfigError : public Error {
  using Error::Error;
};

namespace detail {
struct ConfigValue;  // one node of the resolved document (config_value.h)
struct ConfigState;  // the document plus the record of which keys readers asked for
}  // namespace detail

// A read-only view of one node, with its full path ("model.stages[1].mixer"). Cheap to copy;
// copies record into the same bookkeeping as the Config they came from. A default-constructed
// node is null and records nothing.
class ConfigNode {
 public:
  ConfigNode() = default;

  const std::string& path() const { return path_; }
  // True when the map has `key` with a non-null value. Records `key` as known for this map.
  // A null node has no keys; a scalar or list node throws ConfigError.
  bool has(const std::string& key) const;
  bool is_map() const;
  bool is_list() const;
  bool is_scalar() const;
  bool is_null() const;  // explicit null (`key: ~`, `key:`) or missing
  size_t size() const;   // list length or map size; 0 for null; ConfigError for a scalar

  // The child under `key` (records `key` as known); a missing key gives a null node with the
  // right path. ConfigError when this node is a scalar or a list.
  ConfigNode operator[](const std::string& key) const;
  // List element `index`, path "x[3]". ConfigError when out of range or not a list.
  ConfigNode at(size_t index) const;
  // The keys of a map in document order (does not mark them used); empty for null.
  std::vector<std::string> keys() const;

  // Typed reads. T is one of bool, int64_t, int, double, std::string, std::vector<int64_t>,
  // std::vector<double>, std::vector<std::string>. Numbers may be written quoted or not; doubles
  // must be finite (.inf, .nan and 1e999 are range errors); an explicit null gives the fallback
  // in the optional form and an error in the required one.
  template <typename T>
  T get(const std::string& key) const;  // required: "path.key: required key missing (...)"
  template <typename T>
  T get(const std::string& key, const T& fallback) const;               // optional
  std::string get(const std::string& key, const char* fallback) const;  // get<std::string>
  template <typename T>
  T as() const;  // this node's own value

  // Reads with a fallback, then checks the value: ConfigError
  // "path.key: value X is out of range; expected <what>" / "... is not a valid choice ...".
  int64_t get_int_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  double get_double_in(const std::string& key, double fallback, double lo, double hi) const;
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices) const;
  // Throws ConfigError "path.key: message".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  friend class Config;
  ConfigNode(std::shared_ptr<detail::ConfigState> state,
             std::shared_ptr<const detail::ConfigValue> value, std::string path);
  void record_key(const std::string& key) const;
  void record_visit() const;

  std::shared_ptr<detail::ConfigState> state_;
  std::shared_ptr<const detail::ConfigValue> value_;  // nullptr: the key is missing
  std::string path_;
};

// A loaded, include-resolved YAML document plus the bookkeeping that makes validation strict.
// Copies of a Config share the document and the bookkeeping.
class Config {
 public:
  Config();  // an empty map

  // Loads `path` and resolves includes. ConfigError naming the file (and line:column) on YAML
  // syntax errors, missing files, missing include files and include cycles (with the chain), and
  // for a document that expands (aliases copied out) past 100000 nodes or 16 MiB of text.
  static Config load(const std::string& path);
  // Parses text; includes are resolved relative to the current directory.
  static Config parse(const std::string& yaml_text, const std::string& origin = "<string>");

  // Applies one "key.path=value" override; the value is parsed as YAML (scalar, [list], {map})
  // and replaces what was there. Missing keys are created; an index may be at most the list's
  // length (which appends). A malformed override, or one with an empty value ("key="; write
  // "key=null" to clear a key), throws ConfigError quoting it.
  void set(const std::string& assignment);

  ConfigNode root() const;
  std::string dump() const;  // the fully resolved YAML (after includes and overrides)

  // Throws ConfigError listing every key present in the document that no reader asked for, one
  // per line: "model.foo: unknown key; did you mean 'fo'?" (or "; known keys: a, b"). Maps that
  // were never visited are reported at their own key, not key by key; list elements that are
  // maps or lists and were never visited with at() are reported as unread.
  void check_unused() const;

 private:
  explicit Config(std::shared_ptr<detail::ConfigState> state);
  std::shared_ptr<detail::ConfigState> state_;
};

// The candidate closest to `word` (case-insensitive edit distance) within
// max(2, word.size() / 3), or "" when none is that close. Ties go to the earlier candidate.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace ska
