// lsa: Locality Self-Attention of "Vision Transformer for Small-Size Datasets" (lucidrains'
// vit_for_small_dataset): multi-head self-attention with a learnable temperature and no self-pairs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/mixers/attention_parts.h"

namespace ska::nn {

struct LsaOptions {
  HeadLayout layout{8, 64};
  bool qkv_bias = false;
  bool proj_bias = true;
  double proj_drop = 0.0;
  Init init = Init::kTorchDefault;  // Linear / Conv2d weights (static keys are always randn)
  LogitScale::Kind scale = LogitScale::Kind::kLearnable;  // exp(tau), tau init log(d^-0.5)
  bool diagonal_mask = true;  // logits[i][i] = lowest finite value before the softmax
};

// x [B, N, C] -> [B, N, C]: softmax(q k^T * exp(tau), diagonal masked) v, then proj + dropout.
// Parameters: qkv (Linear C -> 3A), temperature [1], proj (Linear A -> C).
class Lsa : public Module {
 public:
  Lsa(int64_t dim, const LsaOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LSA"; }

 private:
  LsaOptions options_;
  std::shared_ptr<Linear> qkv_, proj_;
  std::unique_ptr<LogitScale> scale_;
  std::shared_ptr<AttentionWeights> attend_;
  std::shared_ptr<Dropout> proj_drop_;
};

// Reads an LsaOptions from a mixer map (keys: heads, head_dim, qkv_bias, proj_bias, proj_drop,
// temperature: learnable|fixed, scale, diagonal_mask).
LsaOptions read_lsa_options(const ConfigNode& cfg, const models::MixerArgs& args);

}  // namespace ska::nn
