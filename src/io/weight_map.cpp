// Weight maps (see weight_map.h): parsing rules and placeholders, matching state-dict names,
// applying and undoing transforms, and the all-at-once problem report of an import.
#include "io/weight_map.h"

#include "core/checked_math.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <regex>
#include <set>

#include "core/checked_math.h"
#include "nn/module.h"
#include "ops/ops.h"

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

// The largest block index or offset a placeholder stands for.
constexpr int64_t kMaxIndex = 1000000000;

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
  if (m[2].matched) {
    const std::optional<int64_t> offset = parse_decimal(m[3], kMaxIndex);
    SKA_CHECK(offset.has_value(), ValueError, "pattern '", pattern, "': placeholder '{", inside,
              "}' has an offset above ", kMaxIndex);
    piece.offset = (m[2] == "-" ? -1 : 1) * *offset;
  }
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
    if (p.kind == PatternPiece::Kind::kInteger) {
      const std::optional<int64_t> index = parse_decimal(value, kMaxIndex);
      if (!index) return false;  // not an index of ours (absurdly long digits)
      value = std::to_string(*index - p.offset);
    }
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

bool any_glob(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return glob_match(p, name); });
}

struct CompiledRule {
  const WeightRule* rule;
  Pattern ours;
  std::vector<Pattern> theirs;
};

// The rules that apply to a model with the names of `ours` (if_ours), compiled.
std::vector<CompiledRule> compile_rules(const WeightMap& map,
                                        const std::map<std::string, Tensor>& ours) {
  std::vector<CompiledRule> compiled;
  for (const WeightRule& rule : map.rules) {
    const bool applies =
        rule.if_ours.empty() || std::any_of(ours.begin(), ours.end(), [&](const auto& entry) {
          return glob_match(rule.if_ours, entry.first);
        });
    if (!applies) continue;
    CompiledRule c{&rule, compile_pattern(rule.ours), {}};
    for (const std::string& theirs : rule.theirs) c.theirs.push_back(compile_pattern(theirs));
    compiled.push_back(std::move(c));
  }
  return compiled;
}

// Maps one of our names through the first rule whose `ours` pattern matches it to their names.
struct Resolved {
  const CompiledRule* rule = nullptr;
  std::vector<std::string> names;
};
Resolved resolve(const std::vector<CompiledRule>& rules, const std::string& name) {
  for (const CompiledRule& rule : rules) {
    Bindings bindings;
    if (!match(rule.ours, name, &bindings)) continue;
    Resolved r{&rule, {}};
    for (const Pattern& theirs : rule.theirs) {
      std::optional<std::string> other = render(theirs, bindings);
      if (!other) break;
      r.names.push_back(*other);
    }
    if (r.names.size() == rule.theirs.size()) return r;
  }
  return {};
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : " + '") + n + "'";
  return out;
}

// --- Transforms ---

// Squeezes the size-1 dims `dims` (of x, as torch.squeeze with a tuple): the highest first.
Tensor squeeze_dims(Tensor x, std::vector<int64_t> dims) {
  const int64_t ndim = x.dim();
  for (int64_t& d : dims) d = wrap_dim(d, ndim, "squeeze");
  std::sort(dims.rbegin(), dims.rend());
  for (int64_t d : dims) {
    SKA_CHECK(x.size(d) == 1, ShapeError, "squeeze(", d, ") of shape ", shape_str(x.shape()),
              ": that dim is not 1");
    x = x.squeeze(d);
  }
  return x;
}

// Undoes squeeze_dims: unsqueezes the dims of the result's rank, the lowest first.
Tensor unsqueeze_dims(Tensor x, std::vector<int64_t> dims) {
  const int64_t ndim = x.dim() + static_cast<int64_t>(dims.size());
  for (int64_t& d : dims) d = wrap_dim(d, ndim, "squeeze");
  std::sort(dims.begin(), dims.end());
  for (int64_t d : dims) x = x.unsqueeze(d);
  return x;
}

Tensor apply(const WeightTransform& t, const Tensor& x) {
  switch (t.kind) {
    case WeightTransform::Kind::kReshape: return x.reshape(t.dims);
    case WeightTransform::Kind::kTranspose: return x.transpose(t.dims[0], t.dims[1]);
    case WeightTransform::Kind::kPermute: return x.permute(t.dims);
    case WeightTransform::Kind::kSqueeze: return squeeze_dims(x, t.dims);
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
    case WeightTransform::Kind::kSqueeze: return unsqueeze_dims(x, t.dims);
    case WeightTransform::Kind::kUnsqueeze: return x.squeeze(t.dims[0]);
  }
  return x;
}

Tensor apply_all(const std::vector<WeightTransform>& transforms, Tensor x) {
  for (const WeightTransform& t : transforms) x = apply(t, x);
  return x.contiguous();
}

// Their tensors (one, or several to concatenate) -> the tensor the transforms start from.
Tensor combine(const WeightRule& rule, const TensorList& parts) {
  Tensor x = parts.size() == 1 ? parts[0] : cat(parts, rule.cat_dim);
  const WeightSplit& s = rule.split;
  if (s.parts == 1) return x;
  const int64_t dim = wrap_dim(s.dim, x.dim(), "split");
  SKA_CHECK(x.size(dim) % s.parts == 0, ShapeError, "split of shape ", shape_str(x.shape()),
            " into ", s.parts, " equal parts along dim ", s.dim, ": ", x.size(dim),
            " is not a multiple of ", s.parts);
  const int64_t chunk = x.size(dim) / s.parts;
  return x.narrow(dim, s.index * chunk, chunk);
}

// The shape `combine` gives from their shapes (for replaying transforms when exporting).
Shape combined_shape(const WeightRule& rule, const std::vector<Shape>& shapes) {
  TensorList probes;
  for (const Shape& shape : shapes) probes.push_back(Tensor::empty(shape, DType::kF32));
  return combine(rule, probes).shape();
}

// --- Exporting: rules run backwards ---

// The shape the transforms of `r` start from, replayed from their shapes; nullopt when one of
// them is not given.
std::optional<Shape> start_shape(const Resolved& r,
                                 const std::map<std::string, Shape>& their_shapes) {
  std::vector<Shape> shapes;
  for (const std::string& their_name : r.names) {
    auto it = their_shapes.find(their_name);
    if (it == their_shapes.end()) return std::nullopt;
    shapes.push_back(it->second);
  }
  return combined_shape(*r.rule->rule, shapes);
}

// Our `value` with the rule's transforms undone (the tensor that cat / split produced).
Tensor undo_transforms(const WeightMap& map, const Resolved& r, const std::string& name,
                       const Tensor& value, const std::map<std::string, Shape>& their_shapes) {
  const auto& transforms = r.rule->rule->transforms;
  // The shape before each transform, replayed from their shape when a reshape needs it.
  std::vector<Shape> before(transforms.size());
  const bool has_reshape =
      std::any_of(transforms.begin(), transforms.end(), [](const WeightTransform& t) {
        return t.kind == WeightTransform::Kind::kReshape;
      });
  if (has_reshape) {
    const std::optional<Shape> start = start_shape(r, their_shapes);
    SKA_CHECK(start.has_value(), ValueError, "weight map ", map.origin, ": exporting ours '", name,
              "' undoes a reshape and needs the shape of theirs ", join_names(r.names));
    Tensor probe = Tensor::empty(*start, value.dtype());
    for (size_t i = 0; i < transforms.size(); ++i) {
      before[i] = probe.shape();
      probe = apply(transforms[i], probe);
    }
  }
  Tensor x = value.detach();
  for (size_t i = transforms.size(); i-- > 0;) x = undo(transforms[i], x, before[i]);
  return x;
}

// Splits an undone concatenation into their tensors: at their shapes when all are given, else
// into equal parts.
void split_concatenation(const WeightMap& map, const Resolved& r, const std::string& name,
                         const Tensor& x, const std::map<std::string, Shape>& their_shapes,
                         std::map<std::string, Tensor>* result) {
  const int64_t dim = wrap_dim(r.rule->rule->cat_dim, x.dim(), "cat");
  const int64_t n = static_cast<int64_t>(r.names.size());
  std::vector<int64_t> sizes;
  for (const std::string& their_name : r.names) {
    auto it = their_shapes.find(their_name);
    if (it == their_shapes.end() || static_cast<int64_t>(it->second.size()) <= dim) break;
    sizes.push_back(it->second[static_cast<size_t>(dim)]);
  }
  if (static_cast<int64_t>(sizes.size()) != n) {
    SKA_CHECK(x.size(dim) % n == 0, ValueError, "weight map ", map.origin, ": exporting ours '",
              name, "' ", shape_str(x.shape()), " as ", n, " equal parts along dim ", dim,
              " of theirs ", join_names(r.names), ": ", x.size(dim), " does not divide");
    sizes.assign(static_cast<size_t>(n), x.size(dim) / n);
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t size = sizes[static_cast<size_t>(i)];
    SKA_CHECK(offset + size <= x.size(dim), ValueError, "weight map ", map.origin,
              ": exporting ours '", name, "' ", shape_str(x.shape()), ": the shapes of theirs ",
              join_names(r.names), " need more than its ", x.size(dim), " along dim ", dim);
    (*result)[r.names[static_cast<size_t>(i)]] = x.narrow(dim, offset, size).contiguous();
    offset += size;
  }
}

// The chunks of ours that one tensor of theirs was split into (rules with `split`).
struct PendingSplit {
  const WeightRule* rule = nullptr;
  TensorList chunks;               // by index; undefined until exported
  std::vector<std::string> ours;   // our name of each chunk
};

// Their tensor from all its chunks; ValueError naming the chunks no name of ours gave.
Tensor join_split(const WeightMap& map, const std::string& their_name, const PendingSplit& p) {
  std::string absent;
  for (size_t i = 0; i < p.chunks.size(); ++i) {
    if (!p.chunks[i].defined()) absent += (absent.empty() ? "" : ", ") + std::to_string(i);
  }
  SKA_CHECK(absent.empty(), ValueError, "weight map ", map.origin, ": exporting theirs '",
            their_name, "' needs all ", p.chunks.size(), " parts of its split (",
            p.rule->where, "); no name of ours gave part(s) ", absent);
  return cat(p.chunks, p.rule->split.dim).contiguous();
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
  // squeeze takes one dim or a list of them (squeeze: [0, 1] turns [1, 1, C] into [C]).
  const bool list = t.kind == WeightTransform::Kind::kSqueeze && rule[key].is_list();
  t.dims = list ? rule.get<std::vector<int64_t>>(key) : std::vector<int64_t>{rule.get<int64_t>(key)};
  if (t.dims.empty()) rule.fail(key, "expected a dim or a non-empty list of dims");
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
  rule->theirs = {trim(text.substr(arrow + 2))};
  if (rule->ours.empty() || rule->theirs[0].empty()) {
    fail_at(node, "a rule string is 'ours <- theirs', got '" + text + "'");
  }
}

// Both sides must use the same placeholders, of the same kinds, so each side can be rendered
// from the other's match.
void check_placeholders(const ConfigNode& node, const WeightRule& rule) {
  for (const std::string& their_pattern : rule.theirs) {
    std::map<std::string, bool> ours, theirs;
    try {
      ours = placeholders(compile_pattern(rule.ours));
      theirs = placeholders(compile_pattern(their_pattern));
    } catch (const ValueError& e) {
      fail_at(node, e.what());
    }
    if (ours != theirs) {
      fail_at(node, "'" + rule.ours + "' and '" + their_pattern +
                        "' must use the same placeholders (and {*name} on both sides or neither)");
    }
  }
}

// `theirs`: one pattern, or a list of them to concatenate (then `cat: dim` is required).
void read_theirs(const ConfigNode& node, WeightRule* rule) {
  const ConfigNode theirs = node["theirs"];
  if (!theirs.is_list()) {
    rule->theirs = {node.get<std::string>("theirs")};
    if (node.has("cat")) node.fail("cat", "concatenates a list of theirs; 'theirs' is one name");
    return;
  }
  rule->theirs = node.get<std::vector<std::string>>("theirs");
  if (rule->theirs.size() < 2) node.fail("theirs", "a list of theirs needs at least two names");
  if (!node.has("cat")) node.fail("theirs", "a list of theirs needs 'cat: dim' to concatenate them");
  rule->cat_dim = node.get<int64_t>("cat");
}

// `split: {dim, parts, index}`: ours is the index-th of `parts` equal chunks of theirs.
WeightSplit read_split(const ConfigNode& node, const WeightRule& rule) {
  const ConfigNode split = node["split"];
  if (!split.is_map()) node.fail("split", "expected a map {dim: D, parts: N, index: K}");
  if (rule.theirs.size() != 1) node.fail("split", "splits one of theirs, not a list");
  WeightSplit s;
  s.dim = split.get<int64_t>("dim");
  s.parts = split.get<int64_t>("parts");
  s.index = split.get<int64_t>("index");
  if (s.parts < 2) split.fail("parts", "expected at least 2, got " + std::to_string(s.parts));
  if (s.index < 0 || s.index >= s.parts) {
    split.fail("index", "expected an integer in [0, " + std::to_string(s.parts - 1) + "], got " +
                            std::to_string(s.index));
  }
  return s;
}

WeightRule read_rule(const ConfigNode& node, const std::string& origin) {
  WeightRule rule;
  rule.where = origin + ": " + node.path();
  if (node.is_scalar()) {
    split_arrow(node, node.as<std::string>(), &rule);
  } else if (node.is_map()) {
    rule.ours = node.get<std::string>("ours");
    read_theirs(node, &rule);
    if (node.has("split")) rule.split = read_split(node, rule);
    rule.if_ours = node.get<std::string>("if_ours", "");
    std::vector<std::string> known = kTransformKeys;
    known.insert(known.begin(), {"ours", "theirs", "cat", "split", "if_ours"});
    for (const std::string& key : node.keys()) {
      if (key == "ours" || key == "theirs" || key == "cat" || key == "split" || key == "if_ours")
        continue;
      if (std::find(kTransformKeys.begin(), kTransformKeys.end(), key) == kTransformKeys.end()) {
        const std::string hint = closest_match(key, known);
        node.fail(key, "unknown rule key" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                           " (known: ours, theirs, cat, split, if_ours, reshape, transpose, "
                           "permute, squeeze, unsqueeze)");
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
  const std::vector<CompiledRule> rules = compile_rules(map, ours);
  std::vector<std::string> uncovered, missing, mis_shaped, mis_typed, unexpected;
  std::set<std::string> used;
  std::map<std::string, Tensor> result;
  for (const auto& [name, target] : ours) {
    if (any_glob(map.keep, name)) {
      result[name] = target;
      continue;
    }
    const Resolved r = resolve(rules, name);
    if (!r.rule) {
      uncovered.push_back("ours '" + name + "' " + shape_str(target.shape()) + ": no rule matches");
      continue;
    }
    const WeightRule& rule = *r.rule->rule;
    TensorList parts;
    std::string their_shapes;
    for (const std::string& their_name : r.names) {
      used.insert(their_name);
      auto it = theirs.find(their_name);
      if (it == theirs.end()) {
        missing.push_back("theirs '" + their_name + "' (for ours '" + name + "', " + rule.where +
                          "): not in the checkpoint");
        continue;
      }
      parts.push_back(it->second.detach());
      their_shapes += (their_shapes.empty() ? "" : " + ") + shape_str(it->second.shape());
    }
    if (parts.size() != r.names.size()) continue;
    Tensor value;
    std::string why;
    try {
      value = apply_all(rule.transforms, combine(rule, parts));
    } catch (const Error& e) {
      why = e.what();
    }
    if (why.empty() && value.shape() != target.shape()) {
      why = "gives " + shape_str(value.shape()) + " after the transforms";
    }
    if (!why.empty()) {
      mis_shaped.push_back("ours '" + name + "' " + shape_str(target.shape()) + " <- theirs " +
                           join_names(r.names) + " " + their_shapes + " (" + rule.where +
                           "): " + why);
      continue;
    }
    if (!nn::dtype_loads_into(value.dtype(), target.dtype())) {
      mis_typed.push_back("ours '" + name + "' " + dtype_name(target.dtype()) + " <- theirs " +
                          join_names(r.names) + " " + dtype_name(value.dtype()) + " (" +
                          rule.where + "): only floating dtypes convert into each other");
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
  const std::vector<CompiledRule> rules = compile_rules(map, ours);
  std::map<std::string, Tensor> result;
  std::map<std::string, PendingSplit> splits;  // their name -> our chunks of it
  for (const auto& [name, value] : ours) {
    if (any_glob(map.keep, name)) continue;
    const Resolved r = resolve(rules, name);
    SKA_CHECK(r.rule, ValueError, "weight map ", map.origin, ": no rule for ours '", name, "'");
    const Tensor x = undo_transforms(map, r, name, value, their_shapes);
    const WeightRule& rule = *r.rule->rule;
    if (r.names.size() > 1) {
      split_concatenation(map, r, name, x, their_shapes, &result);
    } else if (rule.split.parts > 1) {
      PendingSplit& pending = splits[r.names[0]];
      pending.rule = &rule;
      pending.chunks.resize(static_cast<size_t>(rule.split.parts));
      pending.ours.resize(static_cast<size_t>(rule.split.parts));
      pending.chunks[static_cast<size_t>(rule.split.index)] = x;
      pending.ours[static_cast<size_t>(rule.split.index)] = name;
    } else {
      result[r.names[0]] = x.contiguous();
    }
  }
  for (const auto& [their_name, pending] : splits) {
    result[their_name] = join_split(map, their_name, pending);
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
