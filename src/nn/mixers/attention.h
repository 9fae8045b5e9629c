// Multi-head self-attention over all tokens (class token included): `mhsa`, softmax(q k^T d^-0.5) v
// with q, k, v from one qkv Linear, then proj (the MetaFormer/CAFormer attention); and `lsa`, the
// same module with a learnable temperature and a masked diagonal (ViT for small datasets).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "nn/layers.h"
#include "nn/mixers/attention_parts.h"

namespace ska::nn {

struct AttentionOptions {
  int64_t head_dim = 32;
  int64_t heads = 0;  // 0: dim / head_dim (at least 1)
  bool qkv_bias = false;
  bool proj_bias = false;
  double attn_drop = 0.0;
  double proj_drop = 0.0;
  Init init = Init::kTruncNormal;
  LogitScale::Kind scale = LogitScale::Kind::kFixed;  // lsa: kLearnable, exp(tau)
  bool diagonal_mask = false;  // lsa: logits[i][i] = lowest finite value before the softmax

  // Reads the mhsa options above from a mixer map; missing keys keep `defaults`.
  static AttentionOptions from_config(const ConfigNode& cfg, const AttentionOptions& defaults);
  // The lsa options (keys: heads, head_dim, qkv_bias, proj_bias, proj_drop, temperature:
  // learnable|fixed, scale, diagonal_mask), defaults 8 heads x 64, proj bias, learnable
  // temperature, diagonal mask.
  static AttentionOptions lsa_from_config(const ConfigNode& cfg, const MixerArgs& args);
};

// x [B, N, C] -> [B, N, C]; every token attends to every token (class token included).
// Parameters: qkv (Linear C -> 3A), temperature [1] (learnable scale only), proj (Linear A -> C).
class Attention : public Module {
 public:
  Attention(int64_t dim, const AttentionOptions& options);
  Tensor forward(const Tensor& x) override;
  // The class token's output alone: its query against every key and value (q, k, v of every
  // token still come from one projection), then the output projection on that one token.
  Tensor forward_first_token(const Tensor& x) override;
  std::string type_name() const override { return "Attention"; }
  bool reads_input_by_matmul_only() const override { return true; }  // the qkv projection
  // proj_drop, after the output projection.
  double take_output_dropout() override { return proj_drop_->take_over(); }

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t heads_, head_dim_;
  bool diagonal_mask_;
  std::shared_ptr<Linear> qkv_, proj_;
  std::unique_ptr<LogitScale> scale_;
  std::shared_ptr<Dropout> attn_drop_, proj_drop_;
};

}  // namespace ska::nn
