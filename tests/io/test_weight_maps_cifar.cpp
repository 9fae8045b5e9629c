// Round trips of the maps to the authors' CIFAR CaiT, Swin and CvT names
// (configs/weight_maps/authors_cifar_{cait,swin,cvt}.yaml) on reduced models of every attention
// variant: export ours under their names, check a few of their names and shapes, import back.
#include <catch2/catch.hpp>
#include <string>

#include "io/weight_map.h"
#include "models/model.h"
#include "nn/module.h"
#include "support/test_util.h"

namespace {

using namespace ska;

// `text` with every "MIXER" replaced by `mixer`.
std::string with_mixer(std::string text, const std::string& mixer) {
  for (size_t at = text.find("MIXER"); at != std::string::npos; at = text.find("MIXER", at)) {
    text.replace(at, 5, mixer);
  }
  return text;
}

// Exports a model built from `model_yaml` under the map's names, imports it back into a fresh
// copy and requires the same state dict. Returns their tensors.
std::map<std::string, Tensor> round_trip(const std::string& map_file, const std::string& model_yaml,
                                         const std::map<std::string, Shape>& their_shapes = {}) {
  const WeightMap map =
      load_weight_map(std::string(SKA_SOURCE_DIR) + "/configs/weight_maps/" + map_file);
  Config config = Config::parse(model_yaml);
  const auto ours = models::build_model(config.root())->state_dict();
  const auto theirs = export_weights(map, ours, their_shapes);
  REQUIRE(theirs.size() == ours.size());
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

const char* kSmallCait = R"(
family: cait
image_size: 8
in_channels: 3
num_classes: 3
patch_size: 2
dim: 16
depth: 2
cls_depth: 2
heads: 2
head_dim: 4
mlp_dim: 24
mixer: MIXER
)";

// Two stages, the second with 4 blocks (layers.0 and layers.1 pairs on their side).
const char* kSmallSwin = R"(
family: swin
image_size: 16
in_channels: 3
num_classes: 3
mixer: MIXER
hidden_dim: 8
depths: [2, 4]
heads: [1, 2]
head_dim: 4
window_size: 2
downscaling_factors: [2, 2]
mlp_ratio: 2
)";

// CvT-13's shape in miniature: three stages, the class token in the last (stage 2).
const char* kSmallCvt = R"(
family: cvt
image_size: 16
in_channels: 3
num_classes: 3
mixers: [MIXER, MIXER, MIXER]
dims: [4, 6, 8]
heads: [1, 2, 2]
depths: [1, 1, 2]
kernels: [3, 3, 3]
strides: [2, 2, 2]
paddings: [1, 1, 1]
mlp_ratio: 2
)";

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
        round_trip("authors_cifar_cait.yaml", with_mixer(kSmallCait, mixer), their_shapes);
    require_names(theirs, {"to_patch_embedding.1.weight", "pos_embedding", "cls_token",
                           "patch_transformer.layers.1.0.fn.norm.weight",
                           "patch_transformer.layers.1.0.fn.fn.to_q.weight",
                           "patch_transformer.layers.1.0.fn.fn.mix_heads_pre_attn",
                           "patch_transformer.layers.1.0.fn.fn.to_out.0.bias",
                           "patch_transformer.layers.1.1.fn.fn.net.3.weight",
                           "cls_transformer.layers.1.0.fn.fn.to_kv.weight",
                           "cls_transformer.layers.1.1.fn.norm.bias", "mlp_head.0.weight",
                           "mlp_head.1.bias"});
    REQUIRE(theirs.at("cls_transformer.layers.0.1.scale").shape() == Shape{1, 1, 16});
    if (mixer == "mhsa") require_names(theirs, {"patch_transformer.layers.0.0.fn.fn.to_kv.weight"});
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
    const auto theirs = round_trip("authors_cifar_swin.yaml", with_mixer(kSmallSwin, mixer));
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
    const auto theirs = round_trip("authors_cifar_cvt.yaml", with_mixer(kSmallCvt, mixer));
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
