// Round trips of the maps to the authors' CIFAR CaiT, Swin and CvT names
// (configs/weight_maps/authors_cifar_{cait,swin,cvt}.yaml) on reduced models of every attention
// variant: export ours under their names, check a few of their names and shapes, import back;
// theirs -> ours -> theirs for every shipped map; the authors' SKA/CSKA-CaiT to_k/to_v import.
#include <catch2/catch.hpp>
#include <string>

#include "io/weight_map.h"
#include "models/model.h"
#include "nn/module.h"
#include "support/test_util.h"
#include "weight_map_fixtures.h"

namespace {

using namespace ska;


// Exports a model built from `model_yaml` under the map's names, imports it back into a fresh
// copy and requires the same state dict. Returns their tensors.
std::map<std::string, Tensor> round_trip(const std::string& map_file, const std::string& model_yaml,
                                         const std::map<std::string, Shape>& their_shapes = {}) {
  const WeightMap map =
      load_weight_map(std::string(SKA_SOURCE_DIR) + "/configs/weight_maps/" + map_file);
  Config config = Config::parse(model_yaml);
  const auto ours = models::build_model(config.root())->state_dict();
  const auto theirs = export_weights(map, ours, their_shapes);
  const auto imported = import_weights(map, theirs, ours);
  REQUIRE(imported.size() == ours.size());
  for (const auto& [name, value] : ours)
    test::require_close(imported.at(name), value, {0, 0}, name);
  return theirs;
}

void require_names(const std::map<std::string, Tensor>& theirs,
                   std::initializer_list<const char*> names) {
  for (const char* name : names) {
    INFO(name);
    REQUIRE(theirs.count(name));
  }
}




}  // namespace

TEST_CASE("weight map: the authors' CIFAR CaiT names round-trip every attention variant",
          "[cpu][io]") {
  // Their LayerScale is [1, 1, dim]; undoing the map's reshape needs that shape.
  std::map<std::string, Shape> their_shapes;
  for (const char* stack : {"patch_transformer", "cls_transformer"}) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        their_shapes[std::string(stack) + ".layers." + std::to_string(i) + "." + std::to_string(j) +
                     ".scale"] = {1, 1, 16};
      }
    }
  }
  for (const std::string mixer : {"mhsa", "ska", "cska"}) {
    INFO(mixer);
    const auto theirs =
        round_trip("authors_cifar_cait.yaml", test::with_mixer(test::kSmallCait, mixer), their_shapes);
    require_names(theirs, {"to_patch_embedding.1.weight", "pos_embedding", "cls_token",
                           "patch_transformer.layers.1.0.fn.norm.weight",
                           "patch_transformer.layers.1.0.fn.fn.to_q.weight",
                           "patch_transformer.layers.1.0.fn.fn.mix_heads_pre_attn",
                           "patch_transformer.layers.1.0.fn.fn.to_out.0.bias",
                           "patch_transformer.layers.1.1.fn.fn.net.3.weight",
                           "cls_transformer.layers.1.1.fn.norm.bias", "mlp_head.0.weight",
                           "mlp_head.1.bias"});
    REQUIRE(theirs.at("cls_transformer.layers.0.1.scale").shape() == Shape{1, 1, 16});
    if (mixer == "mhsa")
      require_names(theirs, {"patch_transformer.layers.0.0.fn.fn.to_kv.weight",
                             "cls_transformer.layers.1.0.fn.fn.to_kv.weight"});
    if (mixer != "mhsa") {  // their SKA/CSKA class attention: to_k and to_v, no to_kv
      REQUIRE(theirs.at("cls_transformer.layers.1.0.fn.fn.to_k.weight").shape() == Shape{8, 16});
      REQUIRE(theirs.at("cls_transformer.layers.1.0.fn.fn.to_v.weight").shape() == Shape{8, 16});
      REQUIRE_FALSE(theirs.count("cls_transformer.layers.1.0.fn.fn.to_kv.weight"));
    }
    if (mixer == "ska") {
      REQUIRE(theirs.at("patch_transformer.layers.0.0.fn.fn.k").shape() == Shape{2, 16, 4});
      require_names(theirs, {"patch_transformer.layers.0.0.fn.fn.to_v.weight"});
    }
    if (mixer == "cska") {
      REQUIRE(theirs.at("patch_transformer.layers.0.0.fn.fn.to_k.weight").shape() ==
              Shape{32, 4, 3, 3});
      require_names(theirs, {"patch_transformer.layers.0.0.fn.fn.to_k.bias",
                             "patch_transformer.layers.0.0.fn.fn.to_v.weight"});
    }
  }
}

TEST_CASE("weight map: the authors' CIFAR Swin names round-trip every attention variant",
          "[cpu][io]") {
  for (const std::string mixer : {"mhsa", "ska", "cska"}) {
    INFO(mixer);
    const auto theirs = round_trip("authors_cifar_swin.yaml", test::with_mixer(test::kSmallSwin, mixer));
    // Our stages.1.blocks.3 is their stage2.layers.1.1 (the second shifted block).
    const std::string block = "stage2.layers.1.1.";
    require_names(theirs,
                  {"stage1.patch_partition.linear.weight", "stage2.patch_partition.linear.bias",
                   "mlp_head.0.weight", "mlp_head.1.bias"});
    for (const std::string name :
         {"attention_block.fn.norm.weight", "attention_block.fn.fn.pos_embedding",
          "attention_block.fn.fn.upper_lower_mask", "attention_block.fn.fn.left_right_mask",
          "attention_block.fn.fn.to_out.bias", "mlp_block.fn.norm.bias",
          "mlp_block.fn.fn.net.0.weight", "mlp_block.fn.fn.net.2.bias"}) {
      INFO(block + name);
      REQUIRE(theirs.count(block + name));
    }
    REQUIRE_FALSE(theirs.count("stage2.layers.2.0.attention_block.fn.norm.weight"));
    if (mixer == "mhsa")
      require_names(theirs, {"stage2.layers.1.1.attention_block.fn.fn.to_qkv.weight"});
    if (mixer == "ska")
      require_names(theirs, {"stage2.layers.1.1.attention_block.fn.fn.k",
                             "stage1.layers.0.0.attention_block.fn.fn.to_qv.weight"});
    if (mixer == "cska")
      require_names(theirs, {"stage2.layers.1.1.attention_block.fn.fn.to_k.weight",
                             "stage2.layers.1.1.attention_block.fn.fn.to_qv.weight"});
  }
}

TEST_CASE("weight map: the authors' CIFAR CvT names round-trip every attention variant",
          "[cpu][io]") {
  for (const std::string mixer : {"mhsa", "ska", "cska"}) {
    INFO(mixer);
    const auto theirs = round_trip("authors_cifar_cvt.yaml", test::with_mixer(test::kSmallCvt, mixer));
    require_names(theirs, {"stage0.patch_embed.proj.weight", "stage2.patch_embed.norm.bias",
                           "stage2.cls_token", "stage1.blocks.0.attn.conv_proj_q.conv.weight",
                           "stage1.blocks.0.attn.conv_proj_v.bn.running_var",
                           "stage2.blocks.1.attn.proj_q.bias", "stage2.blocks.1.attn.proj.weight",
                           "stage2.blocks.1.mlp.fc2.weight", "stage2.blocks.1.norm1.weight",
                           "norm.weight", "head.bias"});
    if (mixer == "mhsa")
      require_names(theirs, {"stage0.blocks.0.attn.proj_k.weight",
                             "stage2.blocks.0.attn.conv_proj_k.bn.weight"});
    if (mixer == "ska") {
      REQUIRE(theirs.at("stage1.blocks.0.attn.k").shape() == Shape{2, 4, 3});  // 2x2 kv grid
      REQUIRE(theirs.at("stage2.blocks.0.attn.k").shape() == Shape{2, 2, 4});  // + the cls key
    }
    if (mixer == "cska") {
      require_names(theirs, {"stage0.blocks.0.attn.k.weight", "stage1.blocks.0.attn.k.bias",
                             "stage2.blocks.1.attn.k1.weight", "stage2.blocks.1.attn.k2"});
      REQUIRE_FALSE(theirs.count("stage2.blocks.1.attn.k.weight"));
    }
  }
}

TEST_CASE("weight map: the authors' SKA/CSKA-CaiT class attention imports from to_k and to_v",
          "[cpu][io]") {
  const WeightMap map = load_weight_map(std::string(SKA_SOURCE_DIR) +
                                        "/configs/weight_maps/authors_cifar_cait.yaml");
  for (const std::string mixer : {"ska", "cska"}) {
    INFO(mixer);
    Config config = Config::parse(test::with_mixer(test::kSmallCait, mixer));
    const auto ours = models::build_model(config.root())->state_dict();
    // Their checkpoint as their code names it, with values of its own.
    std::map<std::string, Tensor> theirs;
    uint64_t seed = 7;
    for (const auto& [name, value] : export_weights(map, ours))
      theirs[name] = test::uniform(value.shape(), seed++, -1, 1, DType::kF32);
    const auto imported = import_weights(map, theirs, ours);
    for (int i = 0; i < 2; ++i) {
      const std::string layer = "cls_transformer.layers." + std::to_string(i) + ".0.fn.fn.";
      const Tensor kv = imported.at("class_layers." + std::to_string(i) + ".attn.to_kv.weight");
      REQUIRE(kv.shape() == Shape{16, 16});
      test::require_close(kv.narrow(0, 0, 8), theirs.at(layer + "to_k.weight"), {0, 0}, "to_k");
      test::require_close(kv.narrow(0, 8, 8), theirs.at(layer + "to_v.weight"), {0, 0}, "to_v");
    }
  }
}

TEST_CASE("weight map: every shipped map takes theirs to ours and back unchanged", "[cpu][io]") {
  // Their names and shapes come from exporting a model; their values are fresh, so the check is
  // theirs -> ours -> theirs on tensors that never were ours.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"timm_metaformer.yaml", test::kSmallMetaFormer},
      {"authors_metaformer.yaml", test::kSmallMetaFormer},
      {"authors_cifar_vit.yaml", test::with_mixer(test::kSmallVit, "lsa")},
      {"authors_cifar_vit.yaml", test::with_mixer(test::kSmallVit, "ska")},
      {"authors_cifar_vit.yaml", test::with_mixer(test::kSmallVit, "cska")},
      {"authors_cifar_cait.yaml", test::with_mixer(test::kSmallCait, "mhsa")},
      {"authors_cifar_cait.yaml", test::with_mixer(test::kSmallCait, "ska")},
      {"authors_cifar_cait.yaml", test::with_mixer(test::kSmallCait, "cska")},
      {"authors_cifar_swin.yaml", test::with_mixer(test::kSmallSwin, "mhsa")},
      {"authors_cifar_swin.yaml", test::with_mixer(test::kSmallSwin, "ska")},
      {"authors_cifar_swin.yaml", test::with_mixer(test::kSmallSwin, "cska")},
      {"authors_cifar_cvt.yaml", test::with_mixer(test::kSmallCvt, "mhsa")},
      {"authors_cifar_cvt.yaml", test::with_mixer(test::kSmallCvt, "ska")},
      {"authors_cifar_cvt.yaml", test::with_mixer(test::kSmallCvt, "cska")}};
  for (const auto& [map_file, yaml] : cases) {
    INFO(map_file << "\n" << yaml);
    const WeightMap map =
        load_weight_map(std::string(SKA_SOURCE_DIR) + "/configs/weight_maps/" + map_file);
    Config config = Config::parse(yaml);
    const auto ours = models::build_model(config.root())->state_dict();
    std::map<std::string, Tensor> theirs;
    uint64_t seed = 100;
    for (const auto& [name, value] : export_weights(map, ours)) {
      theirs[name] = value.is_floating()
                         ? test::uniform(value.shape(), seed++, -1, 1, value.dtype())
                         : value;
    }
    const auto back = export_weights(map, import_weights(map, theirs, ours));
    REQUIRE(back.size() == theirs.size());
    for (const auto& [name, value] : theirs) {
      INFO(name);
      REQUIRE(back.count(name));
      REQUIRE(back.at(name).dtype() == value.dtype());
      test::require_close(back.at(name), value, {0, 0}, name);
    }
  }
}
