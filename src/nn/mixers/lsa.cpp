// lsa: multi-head self-attention with a learnable temperature and a masked diagonal.
#include "nn/mixers/lsa.h"

#include <cstdint>

#include "nn/mixers/mixer_init.h"
#include "ops/ops.h"

namespace ska::nn {

Lsa::Lsa(int64_t dim, const LsaOptions& options) : options_(options) {
  const int64_t width = options.layout.width();
  qkv_ = register_module("qkv",
                         std::make_shared<Linear>(dim, 3 * width, options.qkv_bias, options.init));
  scale_ = std::make_unique<LogitScale>(options.scale, options.layout.head_dim, *this);
  attend_ = register_module("attend", std::make_shared<AttentionWeights>("softmax"));
  proj_ = register_module("proj",
                          std::make_shared<Linear>(width, dim, options.proj_bias, options.init));
  // Registered so that eval() reaches it.
  proj_drop_ = register_module("proj_drop", std::make_shared<Dropout>(options.proj_drop));
}

Tensor Lsa::forward(const Tensor& x) {
  const TensorList qkv = chunk((*qkv_)(x), 3, -1);
  const int64_t heads = options_.layout.heads;
  const Tensor q = split_heads(qkv[0], heads), k = split_heads(qkv[1], heads);
  const Tensor v = split_heads(qkv[2], heads);
  const Tensor logits = scale_->apply(matmul(q, k.transpose(-2, -1)));  // [B, h, N, N]
  const Tensor mask = options_.diagonal_mask
                          ? diagonal_mask(logits.size(-2), logits.size(-1), x.device())
                          : Tensor();
  const Tensor out = merge_heads(matmul(attend_->weights(logits, mask), v));
  return (*proj_drop_)((*proj_)(out));
}

LsaOptions read_lsa_options(const ConfigNode& cfg, const models::MixerArgs& args) {
  LsaOptions o;
  o.layout = read_head_layout(cfg, args, 8, 64);
  o.qkv_bias = cfg.get<bool>("qkv_bias", false);
  o.proj_bias = cfg.get<bool>("proj_bias", true);
  o.proj_drop = cfg.get_double_in("proj_drop", args.proj_drop, 0.0, 1.0);
  o.init = mixer_init_for(args.family);
  o.scale = read_logit_scale(cfg, "scale", true, "learnable");
  o.diagonal_mask = cfg.get<bool>("diagonal_mask", true);
  return o;
}

}  // namespace ska::nn

namespace ska::models {

void register_lsa_mixer(Registry<MixerBuilder>& r) {
  r.add("lsa", [](const ConfigNode& cfg, const MixerArgs& args) -> nn::ModulePtr {
    return std::make_shared<nn::Lsa>(args.dim, nn::read_lsa_options(cfg, args));
  });
}

}  // namespace ska::models
