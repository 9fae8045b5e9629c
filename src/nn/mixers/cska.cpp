// cska: convolutional static-key attention (CSTU in the authors' code).
#include "nn/mixers/cska.h"

#include <cstdint>

#include "nn/init.h"
#include "nn/mixers/mixer_init.h"
#include "ops/ops.h"

namespace ska::nn {

Cska::Cska(int64_t dim, const models::TokenGrid& grid, const CskaOptions& options)
    : options_(options), grid_(grid), num_keys_(grid.tokens()) {
  const int64_t heads = options.layout.heads, width = options.layout.width();
  qv_ = register_module("qv",
                        std::make_shared<Linear>(dim, 2 * width, options.qkv_bias, options.init));
  Conv2dOptions conv;
  conv.padding = 1;
  conv.groups = heads;
  conv.init = options.init;
  to_k_ = register_module("to_k", std::make_shared<Conv2d>(width, heads * num_keys_, 3, conv));
  if (grid.cls_token) {
    cls_k = register_parameter("cls_k",
                               init_normal({heads, num_keys_, options.layout.head_dim}, 0.0, 1.0));
  }
  // One temperature serves both rows when both are learnable (the authors' single tau).
  conv_scale_ = std::make_unique<LogitScale>(options.conv_scale, options.layout.head_dim, *this);
  const bool shared_temperature = options.conv_scale == LogitScale::Kind::kLearnable &&
                                  options.cls_scale == LogitScale::Kind::kLearnable;
  if (grid.cls_token && !shared_temperature) {
    cls_scale_ = std::make_unique<LogitScale>(options.cls_scale, options.layout.head_dim, *this);
  }
  attend_ = register_module("attend", std::make_shared<AttentionWeights>(options.activation));
  proj_ = register_module("proj",
                          std::make_shared<Linear>(width, dim, options.proj_bias, options.init));
  // Registered so that eval() reaches it.
  proj_drop_ = register_module("proj_drop", std::make_shared<Dropout>(options.proj_drop));
}

// q_spatial [B, H*W, A] -> logits [B, h, H*W, N_keys] from the grouped conv over the query image.
Tensor Cska::spatial_logits(const Tensor& q_spatial) {
  const int64_t batch = q_spatial.size(0), width = q_spatial.size(2);
  const Tensor image = q_spatial.transpose(1, 2).reshape({batch, width, grid_.height, grid_.width});
  const Tensor out = (*to_k_)(image);  // [B, h * N_keys, H, W], channel = head * N_keys + key
  const Tensor logits =
      out.reshape({batch, options_.layout.heads, num_keys_, grid_.height * grid_.width})
          .transpose(2, 3);
  return conv_scale_->apply(logits);
}

// q_cls [B, 1, A] -> logits [B, h, 1, N_keys] against the class token's static key.
Tensor Cska::cls_logits(const Tensor& q_cls) {
  const Tensor logits = matmul(split_heads(q_cls, options_.layout.heads), cls_k.transpose(-2, -1));
  return cls_scale_ ? cls_scale_->apply(logits) : conv_scale_->apply(logits);
}

Tensor Cska::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == num_keys_, ShapeError, "cska: expected [B, ", num_keys_,
            ", C] tokens for a ", grid_.height, "x", grid_.width, " grid",
            grid_.cls_token ? " plus a class token" : "", ", got ", shape_str(x.shape()));
  const TensorList qv = chunk((*qv_)(x), 2, -1);
  const Tensor& q = qv[0];
  const int64_t first_spatial = grid_.cls_token ? 1 : 0;
  Tensor logits = spatial_logits(q.narrow(1, first_spatial, num_keys_ - first_spatial));
  if (grid_.cls_token) {
    const Tensor cls = cls_logits(q.narrow(1, 0, 1));
    logits = options_.authors_row_order ? cat({logits, cls}, 2) : cat({cls, logits}, 2);
  }
  const Tensor mask = options_.diagonal_mask
                          ? diagonal_mask(logits.size(-2), logits.size(-1), x.device())
                          : Tensor();
  const Tensor v = split_heads(qv[1], options_.layout.heads);
  const Tensor out = merge_heads(matmul(attend_->weights(logits, mask), v));
  return (*proj_drop_)((*proj_)(out));
}

CskaOptions read_cska_options(const ConfigNode& cfg, const models::MixerArgs& args) {
  const bool vit = read_vit_flavour(cfg, args);
  CskaOptions o;
  o.layout = vit ? read_head_layout(cfg, args, 8, 64) : read_head_layout(cfg, args, 0, 16);
  o.qkv_bias = cfg.get<bool>("qkv_bias", false);
  o.proj_bias = cfg.get<bool>("proj_bias", vit);
  o.proj_drop = cfg.get_double_in("proj_drop", args.proj_drop, 0.0, 1.0);
  o.init = mixer_init_for(args.family);
  const std::string temperature = vit ? "learnable" : "fixed";
  o.conv_scale = read_logit_scale(cfg, "scale", !vit, temperature);
  o.cls_scale = read_logit_scale(cfg, "cls_scale", true, temperature);
  o.diagonal_mask = cfg.get<bool>("diagonal_mask", vit);
  o.activation = cfg.get_choice("activation", "softmax", AttentionWeights::names());
  o.authors_row_order = cfg.get<bool>("authors_row_order", false);
  return o;
}

}  // namespace ska::nn

namespace ska::models {

void register_cska_mixer(Registry<MixerBuilder>& r) {
  r.add("cska", [](const ConfigNode& cfg, const MixerArgs& args) -> nn::ModulePtr {
    return std::make_shared<nn::Cska>(args.dim, args.grid, nn::read_cska_options(cfg, args));
  });
}

}  // namespace ska::models
