// cska (the authors' CSTU): convolutional static key. A grouped 3x3 conv over the queries laid out
// as an image gives, at each position, that query's logits over the keys: no q k^T product.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/mixers/attention_parts.h"

namespace ska::nn {

struct CskaOptions {
  HeadLayout layout;
  bool qkv_bias = false;
  bool proj_bias = false;
  double proj_drop = 0.0;
  Init init = Init::kTorchDefault;  // Linear / Conv2d weights (static keys are always randn)
  // Scale of the conv logits (kNone: unscaled, as in CSKA-ViT and the "no scaling" ablation).
  LogitScale::Kind conv_scale = LogitScale::Kind::kFixed;
  // Scale of the class token's static-key logits (only with a class token).
  LogitScale::Kind cls_scale = LogitScale::Kind::kLearnable;
  bool diagonal_mask = false;
  std::string activation = "softmax";
  // The authors' CSKA-ViT stacks the logit rows as [patches..., cls] against values ordered
  // [cls, patches...] (a defect of the authors' code). Off by default.
  bool authors_row_order = false;
};

// x [B, N, C] laid out as `grid` (class token first when present) -> [B, N, C]. The spatial
// queries become an image [B, A, H, W] with channels grouped by head; to_k's output channel
// head * N_keys + key at (y, x) is the logit of query (y, x) of that head over that key.
// Parameters: qv (Linear C -> 2A), to_k (Conv2d A -> h * N_keys, 3x3, groups h, bias),
// cls_k [h, N_keys, d] (class token only), temperature [1] (learnable scales only), proj.
class Cska : public Module {
 public:
  Cska(int64_t dim, const TokenGrid& grid, const CskaOptions& options);
  Tensor forward(const Tensor& x) override;
  // With a class token first (not authors_row_order), its output alone: its row of logits
  // against the class token's static keys, no conv logits at all (a ViT's last block). The whole
  // forward otherwise and under an attention probe.
  Tensor forward_first_token(const Tensor& x) override;
  std::string type_name() const override { return "CSKA"; }
  bool reads_input_by_matmul_only() const override { return true; }  // the qv projection
  // proj_drop, after the output projection.
  double take_output_dropout() override { return proj_drop_->take_over(); }
  Tensor cls_k;

 private:
  Tensor spatial_logits(const Tensor& q_spatial, bool scaled, const Tensor& place = Tensor());
  Tensor cls_logits(const Tensor& q_cls, bool scaled);
  // The output of every token, or (first_only) of the class token alone.
  Tensor mix(const Tensor& x, bool first_only);

  CskaOptions options_;
  TokenGrid grid_;
  int64_t num_keys_;
  std::shared_ptr<Linear> qv_, proj_;
  std::shared_ptr<Conv2d> to_k_;
  std::unique_ptr<LogitScale> conv_scale_, cls_scale_;
  std::shared_ptr<AttentionWeights> attend_;
  std::shared_ptr<Dropout> proj_drop_;
};

// Flavour defaults (`flavour:` vit|metaformer, from MixerArgs.flavour), every one overridable:
//   vit:        heads 8, head_dim 64, proj_bias true, scale false (conv logits unscaled),
//               temperature learnable, diagonal_mask true
//   metaformer: head_dim 16, heads C/16, proj_bias false, scale true, temperature fixed,
//               diagonal_mask false
// Shared keys: qkv_bias false, proj_drop (family hint), activation softmax, cls_scale true,
// authors_row_order false. `temperature` applies to both the conv and the cls logits.
CskaOptions read_cska_options(const ConfigNode& cfg, const MixerArgs& args);

}  // namespace ska::nn
