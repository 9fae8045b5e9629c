// The `vit` family: lucidrains' "ViT for small datasets" (Shifted Patch Tokenization, pre-norm
// blocks of a configurable token mixer, class-token head) as used for the paper's CIFAR ViT-S.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "models/block_chain.h"
#include "models/model.h"
#include "nn/layers.h"

namespace ska::models {

// Shifted Patch Tokenization: the image and its four 1-pixel shifts (right, left,
// down, up; zero fill) are stacked to 5C channels, cut into p x p patches flattened in
// (p1 p2 c) order, then LayerNorm and Linear. [B, C, H, W] -> [B, (H/p)(W/p), dim].
class ShiftedPatchEmbedding : public nn::Module {
 public:
  ShiftedPatchEmbedding(int64_t in_channels, int64_t patch_size, int64_t dim);
  Tensor forward(const Tensor& images) override;
  std::string type_name() const override { return "ShiftedPatchEmbedding"; }

 private:
  int64_t patch_size_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> proj_;
};

// x + mixer(norm1(x)), then x + mlp(norm2(x)); the MLP is Linear -> GELU -> dropout -> Linear ->
// dropout. The dropouts closing the two branches run inside the residual sums
// (nn::residual_sum). [B, N, C] -> [B, N, C].
class VitBlock : public ChainedBlock {
 public:
  VitBlock(int64_t dim, nn::ModulePtr mixer, int64_t mlp_dim, double dropout);
  std::string type_name() const override { return "VitBlock"; }
  nn::LayerNorm& first_norm() override { return *norm1_; }
  ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) override;
  // Set on a ViT's last block, of whose output only the class token is read: the mixer computes
  // that token's output alone (Module::first_token; attention: the class token's query against
  // every key), the rest of the block runs on it (the MLP is per token, so its values are the
  // same) and the block returns [B, 1, C].
  bool class_token_output = false;

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  nn::ModulePtr mixer_;
  std::shared_ptr<nn::Mlp> mlp_;
  // The probabilities of the dropouts that close the mixer's and the MLP's branches, taken over
  // from them (Module::take_output_dropout) and applied in the residual sums.
  double mixer_drop_ = 0.0, mlp_drop_ = 0.0;
};

// What ViT tells the mixers it hosts (PyTorch's default initialisation, the ViT flavour), on a
// `dim`-wide token grid; also for building a mixer on its own.
MixerArgs vit_mixer_args(int64_t dim, TokenGrid grid);

struct VitOptions {
  int64_t patch_size = 4;
  int64_t dim = 512;
  int64_t depth = 6;
  int64_t mlp_dim = 512;
  double dropout = 0.1;      // attention output and MLP
  double emb_dropout = 0.1;  // after adding the position embedding
};

// [B, C, H, W] -> [B, num_classes]. Parameters: patch_embed.{norm,proj}, cls_token [1, 1, dim],
// pos_embed [1, N + 1, dim] (both randn), blocks.<i>.{norm1,mixer,norm2,mlp}, norm, head.
class Vit : public nn::Module {
 public:
  // make_mixer(i, args) builds block i's token mixer.
  Vit(const ModelInput& input, const VitOptions& options,
      const std::function<nn::ModulePtr(int64_t, const MixerArgs&)>& make_mixer,
      const MixerArgs& mixer_args);
  Tensor forward(const Tensor& images) override;
  std::string type_name() const override { return "ViT"; }
  Tensor cls_token, pos_embed;

 private:
  std::shared_ptr<ShiftedPatchEmbedding> patch_embed_;
  std::shared_ptr<nn::Dropout> emb_drop_;
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace ska::models
