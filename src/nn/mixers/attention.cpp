// The `mhsa` and `lsa` token mixers: multi-head self-attention over all tokens, and their
// registration.
#include "nn/mixers/attention.h"

#include <algorithm>
#include <cstdint>

#include "nn/mixers/attention_probe.h"
#include "ops/ops.h"

namespace ska::nn {

AttentionOptions AttentionOptions::from_config(const ConfigNode& cfg,
                                               const AttentionOptions& defaults) {
  AttentionOptions o = defaults;
  o.head_dim = cfg.get_int_in("head_dim", o.head_dim, 1, 4096);
  o.heads = cfg.get_int_in("heads", o.heads, 0, 4096);
  o.qkv_bias = cfg.get<bool>("qkv_bias", o.qkv_bias);
  o.proj_bias = cfg.get<bool>("proj_bias", o.proj_bias);
  o.attn_drop = cfg.get_double_in("attn_drop", o.attn_drop, 0.0, 1.0);
  o.proj_drop = cfg.get_double_in("proj_drop", o.proj_drop, 0.0, 1.0);
  return o;
}

AttentionOptions AttentionOptions::lsa_from_config(const ConfigNode& cfg, const MixerArgs& args) {
  AttentionOptions o;
  const HeadLayout layout = read_head_layout(cfg, args, 8, 64);
  o.heads = layout.heads;
  o.head_dim = layout.head_dim;
  o.qkv_bias = cfg.get<bool>("qkv_bias", false);
  o.proj_bias = cfg.get<bool>("proj_bias", true);
  o.proj_drop = cfg.get_double_in("proj_drop", args.proj_drop, 0.0, 1.0);
  o.init = args.init;
  o.scale = read_logit_scale(cfg, "scale", true, "learnable");
  o.diagonal_mask = cfg.get<bool>("diagonal_mask", true);
  return o;
}

Attention::Attention(int64_t dim, const AttentionOptions& o)
    : head_dim_(o.head_dim), diagonal_mask_(o.diagonal_mask) {
  // As in the MetaFormer reference: heads default to dim / head_dim, and a narrow stage still
  // gets one head of the full head width (the attention width may then exceed dim).
  heads_ = o.heads > 0 ? o.heads : std::max<int64_t>(1, dim / o.head_dim);
  const int64_t attention_dim = heads_ * head_dim_;
  qkv_ =
      register_module("qkv", std::make_shared<Linear>(dim, 3 * attention_dim, o.qkv_bias, o.init));
  scale_ = std::make_unique<LogitScale>(o.scale, head_dim_, *this);
  attn_drop_ = register_module("attn_drop", std::make_shared<Dropout>(o.attn_drop));
  proj_ =
      register_module("proj", std::make_shared<Linear>(attention_dim, dim, o.proj_bias, o.init));
  proj_drop_ = register_module("proj_drop", std::make_shared<Dropout>(o.proj_drop));
}

Tensor Attention::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 3, ShapeError, "Attention: expected [B, N, C] tokens, got ", x.str());
  AttentionSpec spec;
  scale_->configure(spec);
  spec.exclude_diagonal = diagonal_mask_;
  spec.dropout = attn_drop_.get();
  const Tensor mixed = merge_heads(attend_qkv((*qkv_)(x), heads_, spec));
  return (*proj_drop_)((*proj_)(mixed));
}

Tensor Attention::forward_first_token(const Tensor& x) {
  // An attention probe records full maps, which only the whole forward makes.
  if (AttentionRecorder::active()) return Module::forward_first_token(x);
  SKA_CHECK(x.dim() == 3 && x.size(1) >= 1, ShapeError,
            "Attention: expected [B, N, C] tokens, got ", x.str());
  AttentionSpec spec;
  scale_->configure(spec);
  spec.exclude_diagonal = diagonal_mask_;  // query 0 is token 0: its own key is excluded
  spec.dropout = attn_drop_.get();
  const Tensor qkv = (*qkv_)(x);
  const int64_t batch = x.size(0), tokens = x.size(1);
  const TensorList parts =
      unbind(qkv.view({batch, tokens, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4}), 0);
  const Tensor mixed = merge_heads(attend_qk(parts[0].narrow(2, 0, 1), parts[1], parts[2], spec));
  return (*proj_drop_)((*proj_)(mixed));
}

void register_attention_mixers(Registry<MixerBuilder>& r) {
  r.add("mhsa", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    // The family's hints (MixerArgs heads / head_dim / proj_drop) replace the mixer's defaults.
    AttentionOptions defaults;
    if (args.heads > 0) defaults.heads = args.heads;
    if (args.head_dim > 0) defaults.head_dim = args.head_dim;
    defaults.proj_drop = args.proj_drop;
    AttentionOptions options = AttentionOptions::from_config(cfg, defaults);
    options.init = args.init;
    return std::make_shared<Attention>(args.dim, options);
  });
  r.add("lsa", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    return std::make_shared<Attention>(args.dim, AttentionOptions::lsa_from_config(cfg, args));
  });
}

}  // namespace ska::nn
