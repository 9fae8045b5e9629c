// ConfigNode: navigation that records which keys readers asked for, typed reads of scalars and
// lists, and the range and choice checks, all failing with the full path of the value.
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "config/config.h"
#include "config/config_value.h"

namespace ska {
namespace {

using detail::ConfigState;
using detail::ConfigValue;
using detail::str_cat;

[[noreturn]] void fail_type(const std::string& path, const std::string& what,
                            const ConfigValue& value) {
  SKA_FAIL(ConfigError, path, ": expected ", what, ", got ", detail::describe_value(value),
           detail::value_location(value));
}

[[noreturn]] void fail_range(const std::string& path, const std::string& text,
                             const std::string& expected, const ConfigValue& value) {
  SKA_FAIL(ConfigError, path, ": value ", text, " is out of range; expected ", expected,
           detail::value_location(value));
}

const std::string& scalar_text(const ConfigValue& value, const std::string& path,
                               const std::string& what) {
  if (value.kind != ConfigValue::Kind::kScalar) fail_type(path, what, value);
  return value.text;
}

bool is_integer_syntax(const std::string& text) {
  size_t pos = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  const bool hex = text.compare(pos, 2, "0x") == 0;
  pos += hex ? 2 : 0;
  if (pos == text.size()) return false;
  for (; pos < text.size(); ++pos) {
    const auto c = static_cast<unsigned char>(text[pos]);
    if (!(hex ? std::isxdigit(c) : std::isdigit(c))) return false;
  }
  return true;
}

// YAML's spellings of infinity and NaN (".inf", "-.Inf", ".nan", ...), which strtod lacks.
bool parse_yaml_special(const std::string& text, double& out) {
  const std::string body =
      (!text.empty() && (text[0] == '-' || text[0] == '+')) ? text.substr(1) : text;
  const double sign = (!text.empty() && text[0] == '-') ? -1.0 : 1.0;
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    out = sign * std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == ".nan" || text == ".NaN" || text == ".NAN") {
    out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return false;
}

// Reader<T>: what a T is called in messages, and how one is read from a value at `path`.
template <typename T>
struct Reader;

template <>
struct Reader<bool> {
  static std::string what() { return "a boolean (true or false)"; }
  static std::string plural() { return "booleans"; }
  static bool read(const ConfigValue& value, const std::string& path, ConfigState*) {
    const std::string& text = scalar_text(value, path, what());
    if (text != "true" && text != "false") fail_type(path, what(), value);
    return text == "true";
  }
};

template <>
struct Reader<int64_t> {
  static std::string what() { return "an integer"; }
  static std::string plural() { return "integers"; }
  static int64_t read(const ConfigValue& value, const std::string& path, ConfigState*) {
    const std::string& text = scalar_text(value, path, what());
    if (!is_integer_syntax(text)) fail_type(path, what(), value);
    errno = 0;
    const long long parsed = std::strtoll(text.c_str(), nullptr, 0);
    if (errno == ERANGE) fail_range(path, text, "a 64-bit integer", value);
    return parsed;
  }
};

template <>
struct Reader<int> {
  static std::string what() { return "an integer"; }
  static std::string plural() { return "integers"; }
  static int read(const ConfigValue& value, const std::string& path, ConfigState* state) {
    const int64_t parsed = Reader<int64_t>::read(value, path, state);
    if (parsed < INT_MIN || parsed > INT_MAX) {
      fail_range(path, value.text, str_cat("a 32-bit integer in [", INT_MIN, ", ", INT_MAX, "]"),
                 value);
    }
    return static_cast<int>(parsed);
  }
};

template <>
struct Reader<double> {
  static std::string what() { return "a number"; }
  static std::string plural() { return "numbers"; }
  static double read(const ConfigValue& value, const std::string& path, ConfigState*) {
    const std::string& text = scalar_text(value, path, what());
    double parsed = 0.0;
    if (parse_yaml_special(text, parsed)) {  // read, so the error says why it is not accepted
      fail_range(path, text, "a finite number (.inf and .nan are not accepted)", value);
    }
    const bool starts_numeric =
        !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' ||
                          text[0] == '+' || text[0] == '.');
    char* end = nullptr;
    errno = 0;
    parsed = std::strtod(text.c_str(), &end);
    if (!starts_numeric || end != text.c_str() + text.size() || std::isnan(parsed)) {
      fail_type(path, what(), value);
    }
    if (errno == ERANGE && std::isinf(parsed)) fail_range(path, text, "a finite number", value);
    return parsed;
  }
};

template <>
struct Reader<std::string> {
  static std::string what() { return "a string"; }
  static std::string plural() { return "strings"; }
  static std::string read(const ConfigValue& value, const std::string& path, ConfigState*) {
    return scalar_text(value, path, what());
  }
};

template <typename E>
struct Reader<std::vector<E>> {
  static std::string what() { return "a list of " + Reader<E>::plural(); }
  static std::vector<E> read(const ConfigValue& value, const std::string& path,
                             ConfigState* state) {
    if (value.kind != ConfigValue::Kind::kList) fail_type(path, what(), value);
    std::vector<E> elements;
    for (size_t i = 0; i < value.items.size(); ++i) {
      const std::string item_path = str_cat(path, "[", i, "]");
      if (state != nullptr) state->visited.insert(item_path);
      elements.push_back(Reader<E>::read(*value.items[i], item_path, state));
    }
    return elements;
  }
};

std::string format_number(double value) { return str_cat(value); }

}  // namespace

ConfigNode::ConfigNode(std::shared_ptr<ConfigState> state, std::shared_ptr<const ConfigValue> value,
                       std::string path)
    : state_(std::move(state)), value_(std::move(value)), path_(std::move(path)) {}

void ConfigNode::record_key(const std::string& key) const {
  if (state_) state_->asked[path_].insert(key);
}

void ConfigNode::record_visit() const {
  if (state_) state_->visited.insert(path_);
}

bool ConfigNode::is_map() const { return value_ && value_->kind == ConfigValue::Kind::kMap; }
bool ConfigNode::is_list() const { return value_ && value_->kind == ConfigValue::Kind::kList; }
bool ConfigNode::is_scalar() const { return value_ && value_->kind == ConfigValue::Kind::kScalar; }
bool ConfigNode::is_null() const { return !value_ || value_->kind == ConfigValue::Kind::kNull; }

bool ConfigNode::has(const std::string& key) const { return !(*this)[key].is_null(); }

size_t ConfigNode::size() const {
  if (is_null()) return 0;
  if (is_scalar()) fail_type(path_, "a list or a map", *value_);
  return is_list() ? value_->items.size() : value_->entries.size();
}

ConfigNode ConfigNode::operator[](const std::string& key) const {
  record_key(key);
  const std::string child_path = detail::join_key(path_, key);
  if (is_null()) return ConfigNode(state_, nullptr, child_path);
  if (!is_map()) fail_type(path_, "a map", *value_);
  return ConfigNode(state_, value_->find(key), child_path);
}

ConfigNode ConfigNode::at(size_t index) const {
  if (!value_) SKA_FAIL(ConfigError, path_, ": required key missing (expected a list)");
  if (!is_list()) fail_type(path_, "a list", *value_);
  if (index >= value_->items.size()) {
    SKA_FAIL(ConfigError, path_, ": index ", index, " is out of range; the list has ",
             value_->items.size(), " elements", detail::value_location(*value_));
  }
  ConfigNode element(state_, value_->items[index], str_cat(path_, "[", index, "]"));
  element.record_visit();
  return element;
}

std::vector<std::string> ConfigNode::keys() const {
  if (is_null()) return {};
  if (!is_map()) fail_type(path_, "a map", *value_);
  std::vector<std::string> names;
  for (const auto& entry : value_->entries) names.push_back(entry.first);
  return names;
}

template <typename T>
T ConfigNode::as() const {
  if (!value_)
    SKA_FAIL(ConfigError, path_, ": required key missing (expected ", Reader<T>::what(), ")");
  return Reader<T>::read(*value_, path_, state_.get());
}

template <typename T>
T ConfigNode::get(const std::string& key) const {
  return (*this)[key].as<T>();
}

template <typename T>
T ConfigNode::get(const std::string& key, const T& fallback) const {
  const ConfigNode child = (*this)[key];
  return child.is_null() ? fallback : child.as<T>();
}

std::string ConfigNode::get(const std::string& key, const char* fallback) const {
  return get<std::string>(key, std::string(fallback));
}

#define SKA_CONFIG_INSTANTIATE(T)                          \
  template T ConfigNode::as<T>() const;                    \
  template T ConfigNode::get<T>(const std::string&) const; \
  template T ConfigNode::get<T>(const std::string&, const T&) const;

SKA_CONFIG_INSTANTIATE(bool)
SKA_CONFIG_INSTANTIATE(int64_t)
SKA_CONFIG_INSTANTIATE(int)
SKA_CONFIG_INSTANTIATE(double)
SKA_CONFIG_INSTANTIATE(std::string)
SKA_CONFIG_INSTANTIATE(std::vector<int64_t>)
SKA_CONFIG_INSTANTIATE(std::vector<double>)
SKA_CONFIG_INSTANTIATE(std::vector<std::string>)
#undef SKA_CONFIG_INSTANTIATE

int64_t ConfigNode::get_int_in(const std::string& key, int64_t fallback, int64_t lo,
                               int64_t hi) const {
  const ConfigNode child = (*this)[key];
  if (child.is_null()) return fallback;
  const int64_t value = child.as<int64_t>();
  if (value < lo || value > hi) {
    fail_range(child.path(), child.value_->text, str_cat("an integer in [", lo, ", ", hi, "]"),
               *child.value_);
  }
  return value;
}

double ConfigNode::get_double_in(const std::string& key, double fallback, double lo,
                                 double hi) const {
  const ConfigNode child = (*this)[key];
  if (child.is_null()) return fallback;
  const double value = child.as<double>();
  if (!(value >= lo && value <= hi)) {
    fail_range(child.path(), child.value_->text,
               str_cat("a number in [", format_number(lo), ", ", format_number(hi), "]"),
               *child.value_);
  }
  return value;
}

std::string ConfigNode::get_choice(const std::string& key, const std::string& fallback,
                                   const std::vector<std::string>& choices) const {
  const ConfigNode child = (*this)[key];
  const std::string value = child.is_null() ? fallback : child.as<std::string>();
  for (const std::string& choice : choices) {
    if (choice == value) return value;
  }
  std::string message = "value '" + value + "' is not a valid choice; expected one of: ";
  for (size_t i = 0; i < choices.size(); ++i) message += (i ? ", " : "") + choices[i];
  const std::string suggestion = closest_match(value, choices);
  if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
  if (!child.is_null()) message += detail::value_location(*child.value_);
  fail(key, message);
}

void ConfigNode::fail(const std::string& key, const std::string& message) const {
  SKA_FAIL(ConfigError, key.empty() ? path_ : detail::join_key(path_, key), ": ", message);
}

}  // namespace ska
