// Swin Transformer for small images (berniwal's layout, as the SKA authors ran it on CIFAR) with
// window attention whose keys come from a projection (mhsa), static keys (ska) or a conv (cska);
// the attention itself is nn/mixers/attention_core, Swin supplies the windows, bias and masks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/model.h"
#include "nn/layers.h"
#include "nn/mixers/attention_core.h"

namespace ska::models {

struct WindowAttentionOptions {
  nn::AttentionKind kind = nn::AttentionKind::kMhsa;
  int64_t dim = 0;  // C of the tokens
  int64_t heads = 1;
  int64_t head_dim = 32;
  int64_t window = 4;
  int64_t grid_h = 0, grid_w = 0;  // the stage's token grid (multiples of window)
  bool shifted = false;            // cyclic shift by window / 2, with the boundary masks
  bool scale = true;               // logits * head_dim^-0.5
};

// Window attention over x [B, H, W, C] (channels last) -> [B, H, W, C].
// Parameters: to_qkv (mhsa) or to_qv; keys [h, n_windows, w*w, d] (ska); to_k, a conv grouped
// per head and window (cska); pos_embedding [(2w-1), (2w-1)] shared across heads; to_out; and
// for shifted windows the two -inf masks upper_lower_mask / left_right_mask [w*w, w*w] stored as
// non-trainable parameters (as the authors' checkpoints hold them).
class WindowAttention : public nn::Module {
 public:
  explicit WindowAttention(const WindowAttentionOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override;
  bool reads_input_by_matmul_only() const override { return true; }  // rolled, then projected

 private:
  Tensor to_windows(const Tensor& t) const;    // [B, H, W, h*d] -> [B, h, nw, w*w, d]
  Tensor from_windows(const Tensor& t) const;  // the inverse
  Tensor conv_keys(const Tensor& q);           // cska: keys from each window's queries
  Tensor window_bias(const Tensor& like);      // relative position bias (+ shift masks)
  void place_constants(Device device);

  WindowAttentionOptions o_;
  int64_t n_windows_ = 0;
  std::shared_ptr<nn::Linear> to_qkv_, to_qv_, to_out_;
  std::shared_ptr<nn::Conv2d> to_k_;
  Tensor keys_, pos_embedding_, upper_lower_mask_, left_right_mask_;
  // Constants derived from the geometry, kept on the device of the last input.
  Tensor relative_index_;       // [w^4] i64 into the flattened bias table
  Tensor last_row_, last_col_;  // [nw, 1, 1] u8: windows that get each shift mask
};

// Builds the `swin` family from its model config map (see configs/models/swin_t.yaml).
nn::ModulePtr build_swin(const ConfigNode& cfg, const ModelInput& input);

}  // namespace ska::models
