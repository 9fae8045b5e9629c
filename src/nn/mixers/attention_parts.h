// Module-level parts of the attention mixers (mhsa, lsa, ska, cska) on top of attention_core:
// the logit scale (fixed or learnable temperature), the normalisation with its parameters, and
// the config readers for heads, scales and flavours.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"
#include "nn/mixers/mixer.h"

namespace ska::nn {

// How logits are scaled: by exp(tau) with a learnable tau (LSA's temperature), by a fixed
// head_dim^-0.5, or not at all.
class LogitScale {
 public:
  enum class Kind { kNone, kFixed, kLearnable };
  // Registers `temperature` [1] (init log(head_dim^-0.5)) on `owner` when learnable.
  LogitScale(Kind kind, int64_t head_dim, Module& owner);
  // Sets spec.scale or spec.temperature (attend() then scales).
  void configure(AttentionSpec& spec) const;
  // Scales logits now (for row blocks with different scales, concatenated before attend()).
  Tensor apply(const Tensor& logits) const;
  Kind kind() const { return kind_; }
  // The learnable temperature [1]; undefined for other kinds.
  const Tensor& temperature() const { return temperature_; }

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
HeadLayout read_head_layout(const ConfigNode& cfg, const MixerArgs& args, int64_t default_heads,
                            int64_t default_head_dim);

// The default flavour of the static-key mixers: `flavour: vit|metaformer`, by default "vit" for
// the ViT-like families with a class token (vit, cait) and "metaformer" otherwise.
bool read_vit_flavour(const ConfigNode& cfg, const MixerArgs& args);

// The normalisation of the logits as a module: softmax, or an elementwise gelu / relu / starrelu
// (Table 4), registered as `act` when it has parameters (StarReLU's scale and bias).
class AttentionWeights : public Module {
 public:
  explicit AttentionWeights(const std::string& activation);
  static const std::vector<std::string>& names() { return normalise_names(); }
  // Sets spec.normalise (and StarReLU's parameters).
  void configure(AttentionSpec& spec) const;
  Tensor forward(const Tensor& logits) override;  // attention_weights() with only this step
  std::string type_name() const override { return "AttentionWeights"; }

 private:
  Normalise kind_;
  std::shared_ptr<Activation> elementwise_;  // undefined for softmax
};

}  // namespace ska::nn
