// Declarative import of weights saved by other code (timm, the authors' PyTorch): a YAML map file
// lists rules `ours <- theirs` with placeholders and optional transforms, and the importer builds
// our state dict from their tensors, reporting every problem at once.
//
// Map file (configs/weight_maps/*.yaml):
//   description: timm MetaFormer (caformer/convformer) -> ours     # optional
//   ignore: ["*.num_batches_tracked"]      # their names to drop silently (glob: * and ?)
//   keep: ["blocks.*.attn.mask"]           # our names left at their current value
//   rules:
//     - "stem.conv.weight <- stem.conv.weight"
//     - "stages.{i}.blocks.{j}.{*rest} <- stages.{i}.{j}.{*rest}"
//     - {ours: "downsamples.{i}.conv.weight", theirs: "downsample_layers.{i+1}.1.weight"}
//     - {ours: "head.weight", theirs: "fc.weight", transpose: [0, 1]}
//     - {ours: "attn.key", theirs: "attn.K", squeeze: 0}
// Placeholders: `{i}` matches a decimal integer, `{i+K}` / `{i-K}` the same integer offset by K
// (so sail-sg's downsample_layers.{i+1} maps to our downsamples.{i}); `{*name}` matches any
// non-empty text, dots included. A name used twice in one pattern must match the same text.
// Transforms (keys of a rule map other than ours/theirs) are applied to their tensor in the order
// written: reshape: [dims] (one may be -1), transpose: [d0, d1], permute: [dims], squeeze: dim
// or [dims], unsqueeze: dim. For each of our names the first rule whose `ours` pattern matches is used.
// Several tensors of theirs make one of ours, or one of theirs several of ours, before the
// transforms:
//     - {ours: "cls.{i}.to_kv.weight", theirs: ["cls.{i}.to_k.weight", "cls.{i}.to_v.weight"], cat: 0}
//     - {ours: "blocks.{i}.q.weight", theirs: "blocks.{i}.qkv.weight", split: {dim: 0, parts: 3, index: 0}}
// `cat: dim` concatenates the listed tensors of theirs; `split` takes the index-th of `parts`
// equal chunks. `if_ours: glob` applies a rule only to models with a name matching the glob (one
// map serving model variants whose names differ). Exporting runs every rule backwards.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace ska {

struct WeightTransform {
  enum class Kind { kReshape, kTranspose, kPermute, kSqueeze, kUnsqueeze };
  Kind kind;
  std::vector<int64_t> dims;  // reshape: the shape; transpose: 2 dims; permute: the order;
                              // squeeze: dims (size 1); unsqueeze: one dim
};

// One of ours is chunk `index` of `parts` equal chunks of theirs along `dim` (parts 1: whole).
struct WeightSplit {
  int64_t dim = 0;
  int64_t parts = 1;
  int64_t index = 0;
};

struct WeightRule {
  std::string ours;                  // pattern of our state-dict name
  std::vector<std::string> theirs;   // pattern of their name; several are concatenated (cat_dim)
  int64_t cat_dim = 0;               // with several theirs: the dim they are concatenated along
  WeightSplit split;                 // parts > 1: ours is one chunk of theirs
  std::string if_ours;               // glob: the rule applies only when a name of ours matches
  std::vector<WeightTransform> transforms;  // theirs -> ours, in order, after cat / split
  std::string where;                 // "file: rules[3]", for error messages
};

struct WeightMap {
  std::string origin;  // the file (or "<string>")
  std::string description;
  std::vector<WeightRule> rules;
  std::vector<std::string> ignore;  // glob patterns of their names
  std::vector<std::string> keep;    // glob patterns of our names
};

// Parses a map from its config node (ConfigError at the offending path for malformed rules,
// unknown keys, unknown placeholders on one side, bad transforms).
WeightMap parse_weight_map(const Config& config, const std::string& origin);
WeightMap load_weight_map(const std::string& path);

// Builds our state dict from `theirs`. `ours` gives our names, shapes and dtypes (a model's
// state_dict()); the result holds one tensor per name of `ours` (converted to its dtype).
// Throws ValueError listing, one per line, every name of ours that no rule covers, every name of
// theirs a rule asks for that is absent, every tensor whose shape does not fit (before or after
// the transforms), every tensor whose dtype does not convert (nn::dtype_loads_into: integers
// for floats), and every name of theirs that no rule used and `ignore` does not cover; a
// DTypeError with the same list when only dtypes are at fault.
std::map<std::string, Tensor> import_weights(const WeightMap& map,
                                             const std::map<std::string, Tensor>& theirs,
                                             const std::map<std::string, Tensor>& ours);

// The inverse: our state dict under their names, transforms undone, concatenations split and
// splits concatenated (for exporting checkpoints and for round-trip tests). Undoing a reshape
// needs their shape: `their_shapes` gives it by their name (ValueError when absent); a
// concatenation is split by their shapes when given, else into equal parts. ValueError when a
// split's chunks are not all exported. Names under `keep` are not exported.
std::map<std::string, Tensor> export_weights(const WeightMap& map,
                                             const std::map<std::string, Tensor>& ours,
                                             const std::map<std::string, Shape>& their_shapes = {});

// True when `name` matches the glob `pattern` (`*` any text, dots included; `?` one character).
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace ska
