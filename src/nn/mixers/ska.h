// ska (the authors' STU): attention against a static, learned key. K [h, N_keys, d] is a parameter
// (randn init), so the logits q_h K_h^T depend on the input only through the queries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/mixers/attention_parts.h"

namespace ska::nn {

struct SkaOptions {
  HeadLayout layout;
  // "linear": q and v from one `qv` Linear(C, 2A) (SKA-ViT); "identity": q is x itself split into
  // heads (needs A == C) and v comes from a `v` Linear(C, A) (SKAFormer's STU).
  std::string query = "linear";
  bool qkv_bias = false;
  bool proj_bias = true;
  double proj_drop = 0.0;
  Init init = Init::kTorchDefault;  // Linear / Conv2d weights (static keys are always randn)
  LogitScale::Kind scale = LogitScale::Kind::kFixed;
  bool diagonal_mask = false;          // query i may not use key i (LSA-style)
  std::string activation = "softmax";  // or gelu / relu / starrelu (no normalisation)
};

// x [B, N, C] -> [B, N, C] with N == num_keys (one static key per token position, cls included).
class Ska : public Module {
 public:
  Ska(int64_t dim, int64_t num_keys, const SkaOptions& options);
  Tensor forward(const Tensor& x) override;
  // The first token's output from its query alone (a ViT's last block: the class token against
  // every static key); the whole forward under an attention probe.
  Tensor forward_first_token(const Tensor& x) override;
  std::string type_name() const override { return "SKA"; }
  // With query: identity the input is the query itself (scaled by a temperature, not only read
  // by products).
  bool reads_input_by_matmul_only() const override;
  // proj_drop, after the output projection.
  double take_output_dropout() override { return proj_drop_->take_over(); }
  Tensor k;  // [h, N_keys, d]

 private:
  // The output of every token, or (first_only) of the first alone.
  Tensor mix(const Tensor& x, bool first_only);

  SkaOptions options_;
  int64_t num_keys_;
  std::shared_ptr<Linear> qv_, v_, proj_;
  std::unique_ptr<LogitScale> scale_;
  std::shared_ptr<AttentionWeights> attend_;
  std::shared_ptr<Dropout> proj_drop_;
};

// Flavour defaults (`flavour:` vit|metaformer, from MixerArgs.flavour), every one overridable:
//   vit:        heads 10, head_dim 64, query linear, proj_bias true, temperature learnable,
//               diagonal_mask true
//   metaformer: head_dim 32, heads C/32, query identity, proj_bias false, temperature fixed,
//               diagonal_mask false
// Shared keys: qkv_bias false, proj_drop (family hint), scale true, activation softmax.
SkaOptions read_ska_options(const ConfigNode& cfg, const MixerArgs& args);

}  // namespace ska::nn
