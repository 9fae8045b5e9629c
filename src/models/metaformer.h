// The MetaFormer family (ConvFormer, CAFormer, CSKAFormer, SKAFormer, PoolFormerV2-like layouts):
// 4 stages of conv downsampling + MetaFormer blocks with a per-stage token mixer, then an MLP head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/block_chain.h"
#include "models/model.h"
#include "nn/layers.h"

namespace ska::models {

// What the `metaformer` family reads from a model map (besides image_size, in_channels,
// num_classes); defaults are CAFormer-S18's.
// What the MetaFormer family tells the mixers it hosts (the reference's trunc_normal(.02) and zero
// biases, the MetaFormer flavour), on a `dim`-wide token grid; also for building a mixer alone.
MixerArgs metaformer_mixer_args(int64_t dim, TokenGrid grid);

struct MetaFormerConfig {
  std::vector<int64_t> depths = {3, 3, 9, 3};
  std::vector<int64_t> dims = {64, 128, 320, 512};
  std::vector<ConfigNode> mixers;  // one per stage: a mixer name or a map with `type:`
  double mlp_ratio = 4.0;
  std::string mlp_activation = "starrelu";
  double drop_path_rate = 0.0;
  std::vector<int64_t> res_scale_stages = {2, 3};  // stages whose residuals get a learnable scale
  double norm_eps = 1e-6;                          // block, stem and downsampling norms
  double head_mlp_ratio = 4.0;
  std::string head_activation = "squared_relu";
  double head_norm_eps = 1e-6;  // timm's value; the authors' MlpHead used PyTorch's 1e-5
  double head_dropout = 0.0;

  static MetaFormerConfig from_config(const ConfigNode& cfg);
};

// Conv downsampling between stages. Channels-last in and out, except the stem, which takes the
// [B, C, H, W] image: stem = conv -> post_norm; later ones = pre_norm -> conv.
class Downsampling : public nn::Module {
 public:
  Downsampling(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
               bool is_stem, double norm_eps);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Downsampling"; }

 private:
  bool is_stem_;
  std::shared_ptr<nn::LayerNorm> pre_norm_, post_norm_;
  std::shared_ptr<nn::Conv2d> conv_;
};

// x [B, H, W, C] -> [B, H, W, C]:
//   x = rs1(x) + drop_path(mixer(norm1(x)));  x = rs2(x) + drop_path(mlp(norm2(x))).
class MetaFormerBlock : public ChainedBlock {
 public:
  MetaFormerBlock(const MixerArgs& args, nn::ModulePtr token_mixer, const MetaFormerConfig& config,
                  double drop_path, bool res_scale);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MetaFormerBlock"; }
  nn::LayerNorm& first_norm() override { return *norm1_; }
  ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) override;

 private:
  void check_input(const Tensor& x) const;  // [B, H, W, C] of this block's grid

  TokenGrid grid_;
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  nn::ModulePtr token_mixer_, res_scale1_, res_scale2_, mlp_;
  std::shared_ptr<nn::DropPath> drop_path1_, drop_path2_;
};

// fc1 (C -> rC) -> SquaredReLU -> LayerNorm -> dropout -> fc2 (rC -> classes), all with biases.
class MlpHead : public nn::Module {
 public:
  MlpHead(int64_t dim, int64_t num_classes, const MetaFormerConfig& config);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MlpHead"; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
  std::shared_ptr<nn::Activation> act_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Dropout> head_dropout_;
};

// Image [B, in_channels, S, S] -> logits [B, num_classes].
class MetaFormer : public nn::Module {
 public:
  MetaFormer(const MetaFormerConfig& config, const ModelInput& input);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MetaFormer"; }

 private:
  ModelInput input_;
  std::shared_ptr<nn::Sequential> downsample_layers_, stages_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<MlpHead> head_;
};

}  // namespace ska::models
