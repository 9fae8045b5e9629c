// Shared pieces of the attention-like mixers.
#include "nn/mixers/attention_parts.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace ska::nn {

Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
  SKA_CHECK(width % heads == 0, ShapeError, "split_heads: width ", width, " is not a multiple of ",
            heads, " heads");
  return x.reshape({batch, tokens, heads, width / heads}).permute({0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& x) {
  const int64_t batch = x.size(0), heads = x.size(1), tokens = x.size(2), width = x.size(3);
  return x.permute({0, 2, 1, 3}).reshape({batch, tokens, heads * width});
}

Tensor diagonal_mask(int64_t rows, int64_t cols, Device device) {
  std::vector<uint8_t> mask(static_cast<size_t>(rows * cols), 0);
  for (int64_t i = 0; i < std::min(rows, cols); ++i) mask[static_cast<size_t>(i * cols + i)] = 1;
  return Tensor::from_vector(mask, {rows, cols}, device);
}

double lowest_finite(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return -DBL_MAX;
    case DType::kBF16:
      return -3.3895313892515355e38;  // largest finite bf16
    case DType::kF16:
      return -65504.0;
    default:
      return -FLT_MAX;
  }
}

LogitScale::LogitScale(Kind kind, int64_t head_dim, Module& owner) : kind_(kind) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (kind == Kind::kFixed) fixed_ = scale;
  if (kind == Kind::kLearnable) {
    temperature_ = owner.register_parameter("temperature", Tensor::full({1}, std::log(scale)));
  }
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

HeadLayout read_head_layout(const ConfigNode& cfg, const models::MixerArgs& args,
                            int64_t default_heads, int64_t default_head_dim) {
  HeadLayout layout;
  layout.head_dim =
      cfg.get_int_in("head_dim", args.head_dim > 0 ? args.head_dim : default_head_dim, 1, 1 << 16);
  int64_t heads = args.heads > 0 ? args.heads : default_heads;
  if (heads <= 0) heads = std::max<int64_t>(1, args.dim / layout.head_dim);
  layout.heads = cfg.get_int_in("heads", heads, 1, 1 << 16);
  return layout;
}

bool read_vit_flavour(const ConfigNode& cfg, const models::MixerArgs& args) {
  const bool vit_like = args.family == "vit" || args.family == "cait";
  return cfg.get_choice("flavour", vit_like ? "vit" : "metaformer", {"vit", "metaformer"}) == "vit";
}

const std::vector<std::string>& AttentionWeights::names() {
  static const std::vector<std::string> kNames = {"softmax", "gelu", "relu", "starrelu"};
  return kNames;
}

AttentionWeights::AttentionWeights(const std::string& activation) : activation_(activation) {
  if (activation != "softmax") {
    elementwise_ = register_module("act", std::make_shared<Activation>(activation));
  }
}

Tensor AttentionWeights::weights(const Tensor& logits, const Tensor& mask) {
  if (!elementwise_) {
    const Tensor masked =
        mask.defined() ? masked_fill(logits, mask, lowest_finite(logits.dtype())) : logits;
    return softmax(masked);
  }
  // Without normalisation a masked pair must contribute nothing, whatever act(-inf) would be.
  const Tensor activated = (*elementwise_)(logits);
  return mask.defined() ? masked_fill(activated, mask, 0.0) : activated;
}

}  // namespace ska::nn
