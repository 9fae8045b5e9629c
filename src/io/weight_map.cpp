// Weight maps (see weight_map.h): parsing rules and placeholders, matching state-dict names,
// applying and undoing transforms, and the all-at-once problem report of an import.
#include "io/weight_map.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <regex>
#include <set>

#include "nn/module.h"

namespace ska {
namespace {

// --- Patterns: "stages.{i}.blocks.{j}.{*rest}" ---

struct PatternPiece {
  enum class Kind { kLiteral, kInteger, kText };
  Kind kind = Kind::kLiteral;
  std::string text;     // literal text, or the placeholder's name
  int64_t offset = 0;   // {i+2}: the text is i + 2
};

struct Pattern {
  std::vector<PatternPiece> pieces;
  std::regex regex;
};

using Bindings = std::map<std::string, std::string>;  // placeholder -> value (integers as text)

std::string regex_escape(const std::string& text) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : text) {
    if (special.find(c) != std::string::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// Parses "{name}", "{name+3}", "{name-1}" or "{*name}" (the part between the braces).
PatternPiece parse_placeholder(const std::string& inside, const std::string& pattern) {
  static const std::regex integer(R"(([A-Za-z_][A-Za-z0-9_]*)(?:([+-])([0-9]+))?)");
  static const std::regex text(R"(\*([A-Za-z_][A-Za-z0-9_]*))");
  std::smatch m;
  PatternPiece piece;
  if (std::regex_match(inside, m, text)) {
    piece.kind = PatternPiece::Kind::kText;
    piece.text = m[1];
    return piece;
  }
  SKA_CHECK(std::regex_match(inside, m, integer), ValueError, "pattern '", pattern,
            "': placeholder '{", inside, "}' is not {name}, {name+K}, {name-K} or {*name}");
  piece.kind = PatternPiece::Kind::kInteger;
  piece.text = m[1];
  if (m[2].matched) piece.offset = (m[2] == "-" ? -1 : 1) * std::stoll(m[3]);
  return piece;
}

Pattern compile_pattern(const std::string& pattern) {
  SKA_CHECK(!pattern.empty(), ValueError, "empty name pattern");
  Pattern out;
  std::string regex_text;
  size_t pos = 0;
  while (pos < pattern.size()) {
    const size_t open = pattern.find('{', pos);
    if (open != pos) {
      const std::string literal = pattern.substr(pos, open - pos);
      out.pieces.push_back({PatternPiece::Kind::kLiteral, literal, 0});
      regex_text += regex_escape(literal);
      if (open == std::string::npos) break;
    }
    const size_t close = pattern.find('}', open);
    SKA_CHECK(close != std::string::npos, ValueError, "pattern '", pattern, "': unclosed '{'");
    PatternPiece piece = parse_placeholder(pattern.substr(open + 1, close - open - 1), pattern);
    regex_text += piece.kind == PatternPiece::Kind::kText ? "(.+)" : "([0-9]+)";
    out.pieces.push_back(piece);
    pos = close + 1;
  }
  out.regex = std::regex(regex_text);
  return out;
}

// The placeholders of a pattern: name -> is-integer.
std::map<std::string, bool> placeholders(const Pattern& pattern) {
  std::map<std::string, bool> names;
  for (const PatternPiece& p : pattern.pieces) {
    if (p.kind != PatternPiece::Kind::kLiteral) names[p.text] = p.kind == PatternPiece::Kind::kInteger;
  }
  return names;
}

// Matches `name` against `pattern`; the placeholders' values go into `bindings`.
bool match(const Pattern& pattern, const std::string& name, Bindings* bindings) {
  std::smatch m;
  if (!std::regex_match(name, m, pattern.regex)) return false;
  Bindings found;
  size_t group = 1;
  for (const PatternPiece& p : pattern.pieces) {
    if (p.kind == PatternPiece::Kind::kLiteral) continue;
    std::string value = m[group++];
    if (p.kind == PatternPiece::Kind::kInteger) value = std::to_string(std::stoll(value) - p.offset);
    auto [it, inserted] = found.emplace(p.text, value);
    if (!inserted && it->second != value) return false;  // {i} twice with different values
  }
  *bindings = std::move(found);
  return true;
}

// Renders `pattern` with `bindings`; nullopt when an integer would be negative.
std::optional<std::string> render(const Pattern& pattern, const Bindings& bindings) {
  std::string out;
  for (const PatternPiece& p : pattern.pieces) {
    if (p.kind == PatternPiece::Kind::kLiteral) {
      out += p.text;
    } else if (p.kind == PatternPiece::Kind::kText) {
      out += bindings.at(p.text);
    } else {
      const int64_t value = std::stoll(bindings.at(p.text)) + p.offset;
      if (value < 0) return std::nullopt;
      out += std::to_string(value);
    }
  }
  return out;
}

struct CompiledRule {
  const WeightRule* rule;
  Pattern ours;
  Pattern theirs;
};

std::vector<CompiledRule> compile_rules(const WeightMap& map) {
  std::vector<CompiledRule> compiled;
  for (const WeightRule& rule : map.rules) {
    compiled.push_back({&rule, compile_pattern(rule.ours), compile_pattern(rule.theirs)});
  }
  return compiled;
}

// Maps a name through the first rule whose `from` side matches it.
struct Resolved {
  const CompiledRule* rule = nullptr;
  std::string name;
};
Resolved resolve(const std::vector<CompiledRule>& rules, const std::string& name, bool from_ours) {
  for (const CompiledRule& rule : rules) {
    Bindings bindings;
    if (!match(from_ours ? rule.ours : rule.theirs, name, &bindings)) continue;
    std::optional<std::string> other = render(from_ours ? rule.theirs : rule.ours, bindings);
    if (other) return {&rule, *other};
  }
  return {};
}

bool any_glob(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return glob_match(p, name); });
}

// --- Transforms ---

Tensor apply(const WeightTransform& t, const Tensor& x) {
  switch (t.kind) {
    case WeightTransform::Kind::kReshape: return x.reshape(t.dims);
    case WeightTransform::Kind::kTranspose: return x.transpose(t.dims[0], t.dims[1]);
    case WeightTransform::Kind::kPermute: return x.permute(t.dims);
    case WeightTransform::Kind::kSqueeze:
      SKA_CHECK(x.size(t.dims[0]) == 1, ShapeError, "squeeze(", t.dims[0], ") of shape ",
                shape_str(x.shape()), ": that dim is not 1");
      return x.squeeze(t.dims[0]);
    case WeightTransform::Kind::kUnsqueeze: return x.unsqueeze(t.dims[0]);
  }
  return x;
}

// Undoes `t`; `before` is the shape the tensor had before `t` (only reshape needs it).
Tensor undo(const WeightTransform& t, const Tensor& x, const Shape& before) {
  switch (t.kind) {
    case WeightTransform::Kind::kReshape: return x.reshape(before);
    case WeightTransform::Kind::kTranspose: return x.transpose(t.dims[0], t.dims[1]);
    case WeightTransform::Kind::kPermute: {
      std::vector<int64_t> inverse(t.dims.size());
      for (size_t i = 0; i < t.dims.size(); ++i) {
        inverse[wrap_dim(t.dims[i], static_cast<int64_t>(t.dims.size()), "permute")] = i;
      }
      return x.permute(inverse);
    }
    case WeightTransform::Kind::kSqueeze: return x.unsqueeze(t.dims[0]);
    case WeightTransform::Kind::kUnsqueeze: return x.squeeze(t.dims[0]);
  }
  return x;
}

Tensor apply_all(const std::vector<WeightTransform>& transforms, Tensor x) {
  for (const WeightTransform& t : transforms) x = apply(t, x);
  return x.contiguous();
}

// --- Parsing the map file ---

const std::vector<std::string> kTransformKeys = {"reshape", "transpose", "permute", "squeeze",
                                                 "unsqueeze"};

[[noreturn]] void fail_at(const ConfigNode& node, const std::string& message) {
  SKA_FAIL(ConfigError, node.path(), ": ", message);
}

WeightTransform read_transform(const ConfigNode& rule, const std::string& key) {
  WeightTransform t;
  if (key == "reshape" || key == "transpose" || key == "permute") {
    t.dims = rule.get<std::vector<int64_t>>(key);
    t.kind = key == "reshape"     ? WeightTransform::Kind::kReshape
             : key == "transpose" ? WeightTransform::Kind::kTranspose
                                  : WeightTransform::Kind::kPermute;
    if (t.kind == WeightTransform::Kind::kTranspose && t.dims.size() != 2) {
      rule.fail(key, "expected two dims [d0, d1]");
    }
    if (t.kind == WeightTransform::Kind::kPermute) {
      std::vector<int64_t> sorted = t.dims;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i) {
        if (sorted[i] != static_cast<int64_t>(i)) rule.fail(key, "not a permutation of 0..n-1");
      }
    }
    return t;
  }
  t.kind = key == "squeeze" ? WeightTransform::Kind::kSqueeze : WeightTransform::Kind::kUnsqueeze;
  t.dims = {rule.get<int64_t>(key)};
  return t;
}

// "ours <- theirs"
void split_arrow(const ConfigNode& node, const std::string& text, WeightRule* rule) {
  const size_t arrow = text.find("<-");
  if (arrow == std::string::npos || text.find("<-", arrow + 2) != std::string::npos) {
    fail_at(node, "a rule string is 'ours <- theirs', got '" + text + "'");
  }
  auto trim = [](const std::string& s) {
    const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  rule->ours = trim(text.substr(0, arrow));
  rule->theirs = trim(text.substr(arrow + 2));
  if (rule->ours.empty() || rule->theirs.empty()) {
    fail_at(node, "a rule string is 'ours <- theirs', got '" + text + "'");
  }
}

// Both sides must use the same placeholders, of the same kinds, so each side can be rendered
// from the other's match.
void check_placeholders(const ConfigNode& node, const WeightRule& rule) {
  std::map<std::string, bool> ours, theirs;
  try {
    ours = placeholders(compile_pattern(rule.ours));
    theirs = placeholders(compile_pattern(rule.theirs));
  } catch (const ValueError& e) {
    fail_at(node, e.what());
  }
  if (ours != theirs) {
    fail_at(node, "'" + rule.ours + "' and '" + rule.theirs +
                      "' must use the same placeholders (and {*name} on both sides or neither)");
  }
}

WeightRule read_rule(const ConfigNode& node, const std::string& origin) {
  WeightRule rule;
  rule.where = origin + ": " + node.path();
  if (node.is_scalar()) {
    split_arrow(node, node.as<std::string>(), &rule);
  } else if (node.is_map()) {
    rule.ours = node.get<std::string>("ours");
    rule.theirs = node.get<std::string>("theirs");
    std::vector<std::string> known = kTransformKeys;
    known.insert(known.begin(), {"ours", "theirs"});
    for (const std::string& key : node.keys()) {
      if (key == "ours" || key == "theirs") continue;
      if (std::find(kTransformKeys.begin(), kTransformKeys.end(), key) == kTransformKeys.end()) {
        const std::string hint = closest_match(key, known);
        node.fail(key, "unknown rule key" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                           " (known: ours, theirs, reshape, transpose, permute, squeeze, unsqueeze)");
      }
      rule.transforms.push_back(read_transform(node, key));
    }
  } else {
    fail_at(node, "a rule is a string 'ours <- theirs' or a map {ours, theirs, transforms...}");
  }
  check_placeholders(node, rule);
  return rule;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::map<std::string, Tensor> import_weights(const WeightMap& map,
                                             const std::map<std::string, Tensor>& theirs,
                                             const std::map<std::string, Tensor>& ours) {
  const std::vector<CompiledRule> rules = compile_rules(map);
  std::vector<std::string> uncovered, missing, mis_shaped, mis_typed, unexpected;
  std::set<std::string> used;
  std::map<std::string, Tensor> result;
  for (const auto& [name, target] : ours) {
    if (any_glob(map.keep, name)) {
      result[name] = target;
      continue;
    }
    const Resolved r = resolve(rules, name, /*from_ours=*/true);
    if (!r.rule) {
      uncovered.push_back("ours '" + name + "' " + shape_str(target.shape()) + ": no rule matches");
      continue;
    }
    used.insert(r.name);
    auto it = theirs.find(r.name);
    if (it == theirs.end()) {
      missing.push_back("theirs '" + r.name + "' (for ours '" + name + "', " + r.rule->rule->where +
                        "): not in the checkpoint");
      continue;
    }
    Tensor value;
    std::string why;
    try {
      value = apply_all(r.rule->rule->transforms, it->second.detach());
    } catch (const Error& e) {
      why = e.what();
    }
    if (why.empty() && value.shape() != target.shape()) {
      why = "gives " + shape_str(value.shape()) + " after the transforms";
    }
    if (!why.empty()) {
      mis_shaped.push_back("ours '" + name + "' " + shape_str(target.shape()) + " <- theirs '" +
                           r.name + "' " + shape_str(it->second.shape()) + " (" +
                           r.rule->rule->where + "): " + why);
      continue;
    }
    if (!nn::dtype_loads_into(value.dtype(), target.dtype())) {
      mis_typed.push_back("ours '" + name + "' " + dtype_name(target.dtype()) + " <- theirs '" +
                          r.name + "' " + dtype_name(value.dtype()) + " (" + r.rule->rule->where +
                          "): only floating dtypes convert into each other");
      continue;
    }
    result[name] = value.to(target.dtype());
  }
  for (const auto& [name, value] : theirs) {
    if (!used.count(name) && !any_glob(map.ignore, name)) {
      unexpected.push_back("theirs '" + name + "' " + shape_str(value.shape()) +
                           ": used by no rule and not ignored");
    }
  }
  const size_t problems = uncovered.size() + missing.size() + mis_shaped.size() +
                          mis_typed.size() + unexpected.size();
  if (problems == 0) return result;
  std::string message = "weight map " + map.origin + ": " + std::to_string(problems) +
                        " problem(s) importing weights";
  for (const auto* group : {&uncovered, &missing, &mis_shaped, &mis_typed, &unexpected}) {
    for (const std::string& line : *group) message += "\n  " + line;
  }
  if (problems == mis_typed.size()) SKA_FAIL(DTypeError, message);
  SKA_FAIL(ValueError, message);
}

std::map<std::string, Tensor> export_weights(const WeightMap& map,
                                             const std::map<std::string, Tensor>& ours,
                                             const std::map<std::string, Shape>& their_shapes) {
  const std::vector<CompiledRule> rules = compile_rules(map);
  std::map<std::string, Tensor> result;
  for (const auto& [name, value] : ours) {
    if (any_glob(map.keep, name)) continue;
    const Resolved r = resolve(rules, name, /*from_ours=*/true);
    SKA_CHECK(r.rule, ValueError, "weight map ", map.origin, ": no rule for ours '", name, "'");
    const auto& transforms = r.rule->rule->transforms;
    // The shape before each transform, replayed from their shape when a reshape needs it.
    std::vector<Shape> before(transforms.size());
    const bool has_reshape =
        std::any_of(transforms.begin(), transforms.end(), [](const WeightTransform& t) {
          return t.kind == WeightTransform::Kind::kReshape;
        });
    if (has_reshape) {
      auto it = their_shapes.find(r.name);
      SKA_CHECK(it != their_shapes.end(), ValueError, "weight map ", map.origin,
                ": exporting ours '", name, "' undoes a reshape and needs the shape of theirs '",
                r.name, "'");
      Tensor probe = Tensor::empty(it->second, value.dtype());
      for (size_t i = 0; i < transforms.size(); ++i) {
        before[i] = probe.shape();
        probe = apply(transforms[i], probe);
      }
    }
    Tensor x = value.detach();
    for (size_t i = transforms.size(); i-- > 0;) x = undo(transforms[i], x, before[i]);
    result[r.name] = x.contiguous();
  }
  return result;
}

WeightMap parse_weight_map(const Config& config, const std::string& origin) {
  const ConfigNode root = config.root();
  WeightMap map;
  map.origin = origin;
  map.description = root.get<std::string>("description", "");
  map.ignore = root.get<std::vector<std::string>>("ignore", {});
  map.keep = root.get<std::vector<std::string>>("keep", {});
  const ConfigNode rules = root["rules"];
  if (!rules.is_list() || rules.size() == 0) fail_at(rules, "expected a non-empty list of rules");
  for (size_t i = 0; i < rules.size(); ++i) map.rules.push_back(read_rule(rules.at(i), origin));
  config.check_unused();
  return map;
}

WeightMap load_weight_map(const std::string& path) {
  return parse_weight_map(Config::load(path), path);
}

}  // namespace ska
