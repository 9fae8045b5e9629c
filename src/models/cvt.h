// CvT (Convolutional vision Transformer, Microsoft's layout as the SKA authors ran CvT-13 on
// CIFAR) with convolutional-projection attention whose keys are projected (mhsa), static (ska)
// or replaced by conv logits (cska); the attention itself is nn/mixers/attention_core, CvT supplies
// the strided keys and values and the class token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/model.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"

namespace ska::models {

struct ConvAttentionOptions {
  nn::AttentionKind kind = nn::AttentionKind::kMhsa;
  int64_t dim = 0;  // C of the tokens (= the attention width)
  int64_t heads = 1;
  int64_t grid_h = 0, grid_w = 0;  // the spatial tokens
  bool cls_token = false;          // a class token comes first
  int64_t kv_stride = 2;           // the depthwise k/v projections' stride (q: 1)
  bool scale = true;               // logits * dim^-0.5 (the FULL width, as CvT does)
  std::string cls_key = "query";   // cska with cls: the cls key column's key (query | static)
};

// Attention over x [B, N, C] (cls first when present) -> [B, N, C]. q/k/v come from `dw_bn`
// projections (depthwise 3x3 conv without bias, BatchNorm) and Linear layers; k/v on the strided
// grid. ska replaces conv_proj_k/proj_k by static keys [h, n_keys, d] (n_keys = strided grid (+1
// cls)); cska by `to_logits`, a 3x3 conv grouped by head over the query grid whose h * n_grid_keys
// outputs are the logits over the strided grid; with a class token, the keys are [cls, grid]:
// the cls query's grid logits use static keys `cls_query_keys` [h, n_grid_keys, d], and the cls
// key column is q . k_cls with k_cls the cls token's own query (cls_key: query, no parameters)
// or a learnable `cls_key` [h, 1, d] (cls_key: static).
class ConvAttention : public nn::Module {
 public:
  explicit ConvAttention(const ConvAttentionOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override;
  int64_t grid_keys() const { return kv_h_ * kv_w_; }

 private:
  Tensor with_cls(const Tensor& cls, const Tensor& tokens) const;
  Tensor conv_logits(const Tensor& q);  // cska: [B, h, N, keys]

  ConvAttentionOptions o_;
  int64_t kv_h_ = 0, kv_w_ = 0;
  std::shared_ptr<nn::Module> conv_proj_q_, conv_proj_k_, conv_proj_v_;
  std::shared_ptr<nn::Linear> proj_q_, proj_k_, proj_v_, proj_;
  std::shared_ptr<nn::Conv2d> to_logits_;
  Tensor keys_, cls_query_keys_, cls_key_;
};

// Builds the `cvt` family from its model config map (see configs/models/cvt_13.yaml).
nn::ModulePtr build_cvt(const ConfigNode& cfg, const ModelInput& input);

}  // namespace ska::models
