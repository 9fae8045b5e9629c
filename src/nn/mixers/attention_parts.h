// Pieces shared by the attention-like mixers (lsa, ska, cska): head split/merge, the diagonal
// mask, the logit scale (fixed or learnable temperature) and the logits -> weights step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "models/model.h"
#include "nn/layers.h"

namespace ska::nn {

// [B, N, h*d] -> [B, h, N, d] (channels grouped by head, as '(h d)').
Tensor split_heads(const Tensor& x, int64_t heads);
// [B, h, N, d] -> [B, N, h*d].
Tensor merge_heads(const Tensor& x);

// u8 [rows, cols], 1 where row == col: a token may not attend to its own key (LSA).
Tensor diagonal_mask(int64_t rows, int64_t cols, Device device);
// The most negative finite value of a floating dtype (torch's -finfo(dtype).max).
double lowest_finite(DType dtype);

// How logits are scaled: by exp(tau) with a learnable tau (LSA's temperature), by a fixed
// head_dim^-0.5, or not at all.
class LogitScale {
 public:
  enum class Kind { kNone, kFixed, kLearnable };
  // Registers `temperature` [1] (init log(head_dim^-0.5)) on `owner` when learnable.
  LogitScale(Kind kind, int64_t head_dim, Module& owner);
  Tensor apply(const Tensor& logits) const;
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
  double fixed_ = 1.0;
  Tensor temperature_;
};

// Reads `temperature: fixed|learnable` (and `scale: true|false` when scale_key is not empty) into
// a LogitScale kind.
LogitScale::Kind read_logit_scale(const ConfigNode& cfg, const std::string& scale_key,
                                  bool default_scale, const std::string& default_temperature);

// Heads and head width of a mixer: `heads` / `head_dim` from its YAML map, else the family's
// hints (MixerArgs), else the defaults given; a default of 0 heads means dim / head_dim (at
// least 1). Non-positive values fail at the config path.
struct HeadLayout {
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t width() const { return heads * head_dim; }  // A = h * d
};
HeadLayout read_head_layout(const ConfigNode& cfg, const models::MixerArgs& args,
                            int64_t default_heads, int64_t default_head_dim);

// The default flavour of the static-key mixers: `flavour: vit|metaformer`, by default "vit" for
// the ViT-like families with a class token (vit, cait) and "metaformer" otherwise.
bool read_vit_flavour(const ConfigNode& cfg, const models::MixerArgs& args);

// Logits -> attention weights: softmax over the keys, or (Table 4 ablations) an elementwise
// activation with no normalisation. Masked pairs get weight 0 either way.
class AttentionWeights : public Module {
 public:
  explicit AttentionWeights(const std::string& activation);
  static const std::vector<std::string>& names();  // softmax, gelu, relu, starrelu
  // mask: u8 broadcastable to logits, or undefined.
  Tensor weights(const Tensor& logits, const Tensor& mask);
  Tensor forward(const Tensor& logits) override { return weights(logits, Tensor()); }
  std::string type_name() const override { return "AttentionWeights"; }

 private:
  std::string activation_;
  std::shared_ptr<Activation> elementwise_;  // undefined for softmax
};

}  // namespace ska::nn
