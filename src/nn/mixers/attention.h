// Multi-head self-attention (`mhsa`): softmax(q k^T d^-0.5) v with q, k, v from one qkv Linear,
// then proj. The MetaFormer (CAFormer) attention; generic enough for any [B, N, C] token layout.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "nn/layers.h"

namespace ska::nn {

struct AttentionOptions {
  int64_t head_dim = 32;
  int64_t heads = 0;  // 0: dim / head_dim (at least 1)
  bool qkv_bias = false;
  bool proj_bias = false;
  double attn_drop = 0.0;
  double proj_drop = 0.0;
  Init init = Init::kTruncNormal;

  // Reads the options above from a mixer map; missing keys keep `defaults`.
  static AttentionOptions from_config(const ConfigNode& cfg, const AttentionOptions& defaults);
};

// x [B, N, C] -> [B, N, C]; every token attends to every token (class token included).
class Attention : public Module {
 public:
  Attention(int64_t dim, const AttentionOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Attention"; }

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t heads_, head_dim_;
  std::shared_ptr<Linear> qkv_, proj_;
  std::shared_ptr<Dropout> attn_drop_, proj_drop_;
};

}  // namespace ska::nn
