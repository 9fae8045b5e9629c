// Module-level parts of the attention mixers: logit scale, normalisation, config readers.
#include "nn/mixers/attention_parts.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/ops.h"

namespace ska::nn {

LogitScale::LogitScale(Kind kind, int64_t head_dim, Module& owner) : kind_(kind) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (kind == Kind::kFixed) fixed_ = scale;
  if (kind == Kind::kLearnable) {
    temperature_ = owner.register_parameter("temperature", Tensor::full({1}, std::log(scale)));
  }
}

void LogitScale::configure(AttentionSpec& spec) const {
  spec.scale = fixed_;
  spec.temperature = temperature_;
}

Tensor LogitScale::apply(const Tensor& logits) const {
  switch (kind_) {
    case Kind::kLearnable:
      return mul(logits, exp(temperature_));
    case Kind::kFixed:
      return mul(logits, fixed_);
    default:
      return logits;
  }
}

LogitScale::Kind read_logit_scale(const ConfigNode& cfg, const std::string& scale_key,
                                  bool default_scale, const std::string& default_temperature) {
  const bool scaled = scale_key.empty() || cfg.get<bool>(scale_key, default_scale);
  const std::string temperature =
      cfg.get_choice("temperature", default_temperature, {"fixed", "learnable"});
  if (!scaled) return LogitScale::Kind::kNone;
  return temperature == "learnable" ? LogitScale::Kind::kLearnable : LogitScale::Kind::kFixed;
}

HeadLayout read_head_layout(const ConfigNode& cfg, const MixerArgs& args, int64_t default_heads,
                            int64_t default_head_dim) {
  HeadLayout layout;
  layout.head_dim =
      cfg.get_int_in("head_dim", args.head_dim > 0 ? args.head_dim : default_head_dim, 1, 1 << 16);
  int64_t heads = args.heads > 0 ? args.heads : default_heads;
  if (heads <= 0) heads = std::max<int64_t>(1, args.dim / layout.head_dim);
  layout.heads = cfg.get_int_in("heads", heads, 1, 1 << 16);
  return layout;
}

bool read_vit_flavour(const ConfigNode& cfg, const MixerArgs& args) {
  const std::string fallback = args.flavour == MixerFlavour::kVit ? "vit" : "metaformer";
  return cfg.get_choice("flavour", fallback, {"vit", "metaformer"}) == "vit";
}

AttentionWeights::AttentionWeights(const std::string& activation)
    : kind_(normalise_kind(activation)) {
  if (kind_ != Normalise::kSoftmax) {
    elementwise_ = register_module("act", std::make_shared<Activation>(activation));
  }
}

void AttentionWeights::configure(AttentionSpec& spec) const {
  spec.normalise = kind_;
  if (kind_ == Normalise::kStarRelu) {
    spec.starrelu_scale = elementwise_->scale;
    spec.starrelu_bias = elementwise_->bias;
  }
}

Tensor AttentionWeights::forward(const Tensor& logits) {
  AttentionSpec spec;
  configure(spec);
  return attention_weights(logits, spec);
}

}  // namespace ska::nn
