// Tests of weight maps: rule parsing and its errors, placeholders ({i}, {i+K}, {*rest}),
// transforms, the all-at-once problem report, and export/import round trips on a synthetic module.
#include <catch2/catch.hpp>
#include <cstdint>

#include "io/weight_map.h"
#include "models/model.h"
#include "nn/module.h"
#include "support/test_util.h"
#include "weight_map_fixtures.h"

namespace {

using namespace ska;
using Catch::Matchers::Contains;

// A module holding parameters of given shapes; forward is not used here.
class Holder : public nn::Module {
 public:
  explicit Holder(const std::vector<std::pair<std::string, Shape>>& params, uint64_t seed = 1) {
    for (const auto& [name, shape] : params) {
      register_parameter(name, test::uniform(shape, seed++, -1, 1, DType::kF32));
    }
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Holder"; }
};

// stem (Conv 3->4, k3) + two stages of one block each + head, MetaFormer-like names.
std::shared_ptr<nn::Module> synthetic_model() {
  auto model = std::make_shared<Holder>(std::vector<std::pair<std::string, Shape>>{});
  model->register_module("stem", std::make_shared<Holder>(
                                      std::vector<std::pair<std::string, Shape>>{
                                          {"weight", {4, 3, 3, 3}}, {"bias", {4}}}, 10));
  for (int i = 0; i < 2; ++i) {
    auto block = std::make_shared<Holder>(
        std::vector<std::pair<std::string, Shape>>{{"key", {2, 5, 2}}}, 20 + 10 * i);
    block->register_module("norm", std::make_shared<Holder>(
                                       std::vector<std::pair<std::string, Shape>>{{"weight", {4}}},
                                       30 + 10 * i));
    auto mixer = std::make_shared<Holder>(
        std::vector<std::pair<std::string, Shape>>{{"weight", {8, 4}}}, 40 + 10 * i);
    block->register_module("mixer", mixer);
    auto blocks = std::make_shared<Holder>(std::vector<std::pair<std::string, Shape>>{});
    blocks->register_module("0", block);
    auto holder = std::make_shared<Holder>(std::vector<std::pair<std::string, Shape>>{});
    holder->register_module("blocks", blocks);
    model->register_module("stage" + std::to_string(i), holder);
  }
  model->register_module("head", std::make_shared<Holder>(
                                      std::vector<std::pair<std::string, Shape>>{
                                          {"weight", {10, 4}}, {"bias", {10}}}, 90));
  return model;
}

// Their layout: the stem is layer 0 of `layers`, stages are layers 1 and 2, block parameters
// named differently, the key stored [1, h, N, d], the mixer weight transposed, the head flat.
const char* kMapText = R"(
description: synthetic test map
ignore: ["*.num_batches_tracked"]
rules:
  - "stem.{*p} <- layers.0.{*p}"
  - "stage{i}.blocks.{j}.norm.weight <- layers.{i+1}.{j}.ln.weight"
  - {ours: "stage{i}.blocks.{j}.key", theirs: "layers.{i+1}.{j}.K", squeeze: 0}
  - {ours: "stage{i}.blocks.{j}.mixer.weight", theirs: "layers.{i+1}.{j}.mix", transpose: [0, 1]}
  - {ours: "head.weight", theirs: "fc.w", reshape: [10, 4]}
  - "head.bias <- fc.b"
)";

WeightMap test_map() { return parse_weight_map(Config::parse(kMapText, "test_map.yaml"), "test_map.yaml"); }

std::map<std::string, Shape> their_shapes() {
  return {{"fc.w", {40}}};
}

}  // namespace

TEST_CASE("weight map: parsing rules", "[cpu][io]") {
  const WeightMap map = test_map();
  REQUIRE(map.description == "synthetic test map");
  REQUIRE(map.rules.size() == 6);
  REQUIRE(map.rules[1].ours == "stage{i}.blocks.{j}.norm.weight");
  REQUIRE(map.rules[1].theirs == std::vector<std::string>{"layers.{i+1}.{j}.ln.weight"});
  REQUIRE(map.rules[2].transforms.size() == 1);
  REQUIRE(map.rules[2].transforms[0].kind == WeightTransform::Kind::kSqueeze);
  REQUIRE(map.rules[3].transforms[0].dims == std::vector<int64_t>{0, 1});
  REQUIRE(map.rules[3].where == "test_map.yaml: rules[3]");
  REQUIRE(map.ignore == std::vector<std::string>{"*.num_batches_tracked"});

  auto parse = [](const std::string& text) { return parse_weight_map(Config::parse(text), "m"); };
  REQUIRE_THROWS_WITH(parse("rules: ['a.weight -> b.weight']"),
                      Contains("rules[0]") && Contains("'ours <- theirs'"));
  REQUIRE_THROWS_WITH(parse("rules: ['a.{i}.w <- b.w']"), Contains("same placeholders"));
  REQUIRE_THROWS_WITH(parse("rules: ['a.{i}.w <- b.{*i}']"), Contains("same placeholders"));
  REQUIRE_THROWS_WITH(parse("rules: ['a.{i+}.w <- b.{i}']"), Contains("placeholder '{i+}'"));
  // An offset past any block index (found by fuzzing: std::stoll threw out of range).
  REQUIRE_THROWS_WITH(parse("rules: ['a.{i}.w <- b.{i+99999999999999999999}']"),
                      Contains("has an offset above 1000000000"));
  REQUIRE_THROWS_WITH(parse("rules: [{ours: a, theirs: b, transpos: [0, 1]}]"),
                      Contains("rules[0].transpos") && Contains("did you mean 'transpose'"));
  REQUIRE_THROWS_WITH(parse("rules: [{ours: a, theirs: b, transpose: [0]}]"),
                      Contains("two dims"));
  REQUIRE_THROWS_WITH(parse("rules: [{ours: a, theirs: b, permute: [0, 0]}]"),
                      Contains("not a permutation"));
  REQUIRE_THROWS_WITH(parse("rules: []"), Contains("non-empty list"));
  REQUIRE_THROWS_AS(parse("rules: ['a <- b']\nignor: []"), ConfigError);
}

TEST_CASE("weight map: glob patterns", "[cpu][io]") {
  REQUIRE(glob_match("*.num_batches_tracked", "stages.0.bn.num_batches_tracked"));
  REQUIRE(glob_match("a.?.b", "a.1.b"));
  REQUIRE_FALSE(glob_match("a.?.b", "a.12.b"));
  REQUIRE(glob_match("*", ""));
  REQUIRE_FALSE(glob_match("head.*", "stem.weight"));
}

TEST_CASE("weight map: export then import gives back the state dict", "[cpu][io]") {
  auto model = synthetic_model();
  const WeightMap map = test_map();
  const auto ours = model->state_dict();
  const auto theirs = export_weights(map, ours, their_shapes());

  // Their names, with offsets, transforms and the text placeholder applied.
  REQUIRE(theirs.count("layers.0.weight"));
  REQUIRE(theirs.count("layers.2.0.ln.weight"));
  REQUIRE(theirs.at("layers.1.0.K").shape() == Shape{1, 2, 5, 2});
  REQUIRE(theirs.at("layers.2.0.mix").shape() == Shape{4, 8});
  REQUIRE(theirs.at("fc.w").shape() == Shape{40});
  test::require_close(theirs.at("layers.2.0.mix"), ours.at("stage1.blocks.0.mixer.weight").transpose(0, 1),
                      {0, 0});

  auto with_extra = theirs;
  with_extra["layers.1.bn.num_batches_tracked"] = Tensor::zeros({}, DType::kI64);  // ignored
  const auto imported = import_weights(map, with_extra, ours);
  REQUIRE(imported.size() == ours.size());
  for (const auto& [name, value] : ours) test::require_close(imported.at(name), value, {0, 0}, name);

  // And the model accepts it.
  auto fresh = synthetic_model();
  for (auto& [name, p] : fresh->named_parameters()) p.fill_(0);
  fresh->load_state_dict(imported);
  test::require_close(fresh->state_dict().at("head.weight"), ours.at("head.weight"), {0, 0});
}

TEST_CASE("weight map: every problem is reported at once", "[cpu][io]") {
  auto model = synthetic_model();
  const WeightMap map = test_map();
  const auto ours = model->state_dict();
  auto theirs = export_weights(map, ours, their_shapes());
  theirs.erase("layers.1.0.ln.weight");                          // missing
  theirs["layers.2.0.K"] = Tensor::zeros({1, 2, 6, 2});          // mis-shaped
  theirs["fc.w"] = Tensor::zeros({41});                          // reshape fails
  theirs["layers.3.0.ln.weight"] = Tensor::zeros({4});           // unexpected
  auto ours_plus = ours;
  ours_plus["extra.scale"] = Tensor::zeros({1});                 // no rule

  try {
    import_weights(map, theirs, ours_plus);
    FAIL("import_weights accepted a broken checkpoint");
  } catch (const ValueError& e) {
    const std::string message = e.what();
    INFO(message);
    REQUIRE_THAT(message, Contains("test_map.yaml: 5 problem(s)"));
    REQUIRE_THAT(message, Contains("ours 'extra.scale' [1]: no rule matches"));
    REQUIRE_THAT(message, Contains("theirs 'layers.1.0.ln.weight' (for ours "
                                   "'stage0.blocks.0.norm.weight', test_map.yaml: rules[1]): "
                                   "not in the checkpoint"));
    REQUIRE_THAT(message, Contains("ours 'stage1.blocks.0.key' [2, 5, 2] <- theirs 'layers.2.0.K' "
                                   "[1, 2, 6, 2]"));
    REQUIRE_THAT(message, Contains("ours 'head.weight' [10, 4] <- theirs 'fc.w' [41]"));
    REQUIRE_THAT(message, Contains("theirs 'layers.3.0.ln.weight' [4]: used by no rule"));
  }
}

TEST_CASE("weight map: keep, first match wins, repeated placeholders", "[cpu][io]") {
  const WeightMap map = parse_weight_map(Config::parse(R"(
keep: ["buffers.*"]
rules:
  - "a.{i}.{i}.w <- diag.{i}"
  - "a.{i}.{j}.w <- off.{i}.{j}"
  - "{*all} <- {*all}"
)"), "m");
  std::map<std::string, Tensor> ours = {{"a.1.1.w", Tensor::zeros({2})},
                                        {"a.1.2.w", Tensor::zeros({2})},
                                        {"b.w", Tensor::zeros({3})},
                                        {"buffers.mask", Tensor::ones({2})}};
  std::map<std::string, Tensor> theirs = {{"diag.1", Tensor::full({2}, 1.0)},
                                          {"off.1.2", Tensor::full({2}, 2.0)},
                                          {"b.w", Tensor::full({3}, 3.0, DType::kF64)}};
  const auto imported = import_weights(map, theirs, ours);
  REQUIRE(imported.at("a.1.1.w").to_vector<float>() == std::vector<float>{1, 1});
  REQUIRE(imported.at("a.1.2.w").to_vector<float>() == std::vector<float>{2, 2});
  REQUIRE(imported.at("b.w").dtype() == DType::kF32);  // converted to our dtype
  REQUIRE(imported.at("buffers.mask").to_vector<float>() == std::vector<float>{1, 1});
  REQUIRE_FALSE(export_weights(map, ours).count("buffers.mask"));
  // A name whose index has more digits than any index is matched by no placeholder.
  std::map<std::string, Tensor> long_index = {{"off.1.99999999999999999999999", Tensor::zeros({2})}};
  REQUIRE_NOTHROW(export_weights(map, {{"a.1.2.w", Tensor::zeros({2})}}));
  REQUIRE_THROWS_AS(import_weights(map, long_index, ours), Error);
}

namespace {

// Exports a model built from `model_yaml` under the map's names, imports it back into a fresh
// copy and requires the same state dict. Returns their names.
std::map<std::string, Tensor> round_trip(const std::string& map_file, const std::string& model_yaml) {
  const WeightMap map = load_weight_map(std::string(SKA_SOURCE_DIR) + "/configs/weight_maps/" + map_file);
  Config config = Config::parse(model_yaml);
  const auto ours = models::build_model(config.root())->state_dict();
  const auto theirs = export_weights(map, ours);
  const auto imported = import_weights(map, theirs, ours);
  REQUIRE(imported.size() == ours.size());
  for (const auto& [name, value] : ours) test::require_close(imported.at(name), value, {0, 0}, name);
  return theirs;
}



}  // namespace

TEST_CASE("weight maps in configs/weight_maps round-trip our models", "[cpu][io]") {
  SECTION("timm MetaFormer names") {
    const auto theirs = round_trip("timm_metaformer.yaml", test::kSmallMetaFormer);
    for (const char* name :
         {"stem.conv.weight", "stem.norm.weight", "stages.1.downsample.norm.weight",
          "stages.3.downsample.conv.bias", "stages.0.blocks.0.token_mixer.pwconv1.weight",
          "stages.0.blocks.0.token_mixer.act1.scale", "stages.3.blocks.0.token_mixer.qkv.weight",
          "stages.3.blocks.0.res_scale1.scale", "stages.3.blocks.0.mlp.act.bias",
          "head.norm.weight", "head.fc.fc1.weight", "head.fc.norm.bias", "head.fc.fc2.weight"}) {
      INFO(name);
      REQUIRE(theirs.count(name));
    }
  }
  SECTION("the authors' sail-sg MetaFormer names") {
    const auto theirs = round_trip("authors_metaformer.yaml", test::kSmallMetaFormer);
    for (const char* name :
         {"downsample_layers.0.conv.weight", "downsample_layers.1.pre_norm.weight",
          "stages.1.0.token_mixer.to_k.weight", "stages.1.0.token_mixer.qv.weight",
          "stages.2.0.token_mixer.k", "stages.2.0.token_mixer.v.weight", "norm.weight",
          "head.fc2.bias"}) {
      INFO(name);
      REQUIRE(theirs.count(name));
    }
  }
  SECTION("the authors' CIFAR ViT names, every attention variant") {
    for (const std::string mixer : {"lsa", "ska", "cska"}) {
      std::string yaml = test::kSmallVit;
      yaml.replace(yaml.find("MIXER"), 5, mixer);
      const auto theirs = round_trip("authors_cifar_vit.yaml", yaml);
      REQUIRE(theirs.count("to_patch_embedding.to_patch_tokens.2.weight"));
      REQUIRE(theirs.at("transformer.layers.1.0.fn.temperature").dim() == 0);
      REQUIRE(theirs.count("transformer.layers.1.1.fn.net.3.bias"));
      REQUIRE(theirs.count("mlp_head.1.weight"));
      if (mixer == "cska") REQUIRE(theirs.count("transformer.layers.0.0.fn.k2"));
      if (mixer == "ska") REQUIRE(theirs.count("transformer.layers.0.0.fn.k"));
    }
  }
}

TEST_CASE("weight map: concatenation, split and if_ours, both ways", "[cpu][io]") {
  // Their fused qkv split into our q, k, v; their to_k and to_v concatenated into our kv when
  // the model has q (if_ours), else their to_kv.
  const char* qkv_text = R"(
rules:
  - {ours: "q", theirs: "qkv.weight", split: {dim: 0, parts: 3, index: 0}}
  - {ours: "k", theirs: "qkv.weight", split: {dim: 0, parts: 3, index: 1}}
  - {ours: "v", theirs: "qkv.weight", split: {dim: 0, parts: 3, index: 2}}
  - {ours: "kv", theirs: ["to_k", "to_v"], cat: 0, if_ours: "q"}
  - "kv <- to_kv"
)";
  const WeightMap map = parse_weight_map(Config::parse(qkv_text, "qkv.yaml"), "qkv.yaml");
  Holder with_q({{"q", {2, 3}}, {"k", {2, 3}}, {"v", {2, 3}}, {"kv", {4, 3}}});
  const auto ours = with_q.state_dict();
  const auto theirs = export_weights(map, ours);
  REQUIRE(theirs.size() == 3);  // qkv.weight, to_k, to_v
  REQUIRE(theirs.at("qkv.weight").shape() == Shape{6, 3});
  test::require_close(theirs.at("qkv.weight").narrow(0, 2, 2), ours.at("k"), {0, 0}, "k");
  test::require_close(theirs.at("to_v"), ours.at("kv").narrow(0, 2, 2), {0, 0}, "to_v");
  const auto imported = import_weights(map, theirs, ours);
  for (const auto& [name, value] : ours) test::require_close(imported.at(name), value, {0, 0}, name);

  // Without q (if_ours fails) kv comes from their to_kv.
  Holder without_q({{"kv", {4, 3}}});
  const auto plain = export_weights(map, without_q.state_dict());
  REQUIRE(plain.size() == 1);
  REQUIRE(plain.count("to_kv"));

  // A split whose chunks are not all exported, a cat whose sizes do not fit.
  Holder only_q({{"q", {2, 3}}});
  REQUIRE_THROWS_WITH(export_weights(map, only_q.state_dict()),
                      Contains("theirs 'qkv.weight' needs all 3 parts") && Contains("1, 2"));
  auto broken = theirs;
  broken["to_v"] = Tensor::zeros({3, 3});
  REQUIRE_THROWS_WITH(import_weights(map, broken, ours),
                      Contains("ours 'kv' [4, 3] <- theirs 'to_k' + 'to_v' [2, 3] + [3, 3]"));
}

TEST_CASE("weight map: malformed cat and split rules name the rule", "[cpu][io]") {
  auto parse = [](const std::string& rule) {
    return parse_weight_map(Config::parse("rules:\n  - " + rule + "\n", "m.yaml"), "m.yaml");
  };
  REQUIRE_THROWS_WITH(parse(R"({ours: "a", theirs: ["b", "c"]})"), Contains("needs 'cat: dim'"));
  REQUIRE_THROWS_WITH(parse(R"({ours: "a", theirs: "b", cat: 0})"), Contains("is one name"));
  REQUIRE_THROWS_WITH(parse(R"({ours: "a", theirs: "b", split: {dim: 0, parts: 2, index: 2}})"),
                      Contains("rules[0].split.index") && Contains("[0, 1], got 2"));
  REQUIRE_THROWS_WITH(parse(R"({ours: "a.{i}", theirs: ["b.{i}", "c"], cat: 0})"),
                      Contains("same placeholders"));
  REQUIRE_THROWS_WITH(parse(R"({ours: "a", theirs: "b", splt: 1})"), Contains("did you mean 'split'"));
}
