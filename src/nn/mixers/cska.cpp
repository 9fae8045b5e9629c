// cska: convolutional static-key attention (CSTU in the authors' code).
#include "nn/mixers/cska.h"

#include <cstdint>

#include "nn/mixers/attention_probe.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace ska::nn {

Cska::Cska(int64_t dim, const TokenGrid& grid, const CskaOptions& options)
    : options_(options), grid_(grid), num_keys_(grid.tokens()) {
  const int64_t heads = options.layout.heads, width = options.layout.width();
  qv_ = register_module("qv",
                        std::make_shared<Linear>(dim, 2 * width, options.qkv_bias, options.init));
  to_k_ = register_module("to_k", make_conv_logits(width, heads, num_keys_, options.init));
  if (grid.cls_token) {
    cls_k =
        register_parameter("cls_k", init_static_keys({heads, num_keys_, options.layout.head_dim}));
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

// q_spatial [B, h, H*W, d] -> logits [B, h, H*W, N_keys] from the grouped conv over the queries,
// scaled when `scaled`; unscaled, written into `place` where the form writes there (conv_logits).
Tensor Cska::spatial_logits(const Tensor& q_spatial, bool scaled, const Tensor& place) {
  const bool unscaled = !scaled || conv_scale_->kind() == LogitScale::Kind::kNone;
  const Tensor logits =
      conv_logits(q_spatial, *to_k_, grid_.height, grid_.width, unscaled ? place : Tensor());
  return scaled ? conv_scale_->apply(logits) : logits;
}

// q_cls [B, h, 1, d] -> logits [B, h, 1, N_keys] against the class token's static key, scaled
// when `scaled`.
Tensor Cska::cls_logits(const Tensor& q_cls, bool scaled) {
  const Tensor logits = static_key_logits(q_cls, cls_k);
  if (!scaled) return logits;
  return cls_scale_ ? cls_scale_->apply(logits) : conv_scale_->apply(logits);
}

Tensor Cska::forward(const Tensor& x) { return mix(x, false); }

Tensor Cska::forward_first_token(const Tensor& x) {
  // An attention probe records full maps, which only the whole forward makes; without a class
  // token first the first token is a patch, whose logits are conv logits like the others'.
  if (AttentionRecorder::active() || !grid_.cls_token || options_.authors_row_order) {
    return Module::forward_first_token(x);
  }
  return mix(x, true);
}

Tensor Cska::mix(const Tensor& x, bool first_only) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == num_keys_, ShapeError, "cska: expected [B, ", num_keys_,
            ", C] tokens for a ", grid_.height, "x", grid_.width, " grid",
            grid_.cls_token ? " plus a class token" : "", ", got ", shape_str(x.shape()));
  const int64_t width = options_.layout.width();
  // q and v as the heads of one projection: one node, whose gradient's producers write it in place.
  const TensorList qv = split_heads((*qv_)(x), {width, width}, options_.layout.heads);
  const Tensor& q = qv[0];
  // The class row (static keys) and the spatial rows (conv) may be scaled differently: then each
  // block is scaled here and attend() leaves the scale at 1. With one scale for both (no class
  // token, or a shared temperature) attend() applies it, inside the fused op when it runs.
  const bool one_scale = cls_scale_ == nullptr;
  AttentionSpec spec;
  if (one_scale) conv_scale_->configure(spec);
  attend_->configure(spec);
  spec.exclude_diagonal = options_.diagonal_mask;
  const Tensor& v = qv[1];
  if (first_only) {  // the class row alone (query 0 is token 0: the diagonal mask still applies)
    Tensor cls = cls_logits(q.narrow(2, 0, 1), !one_scale);
    if (autocast_state().enabled && attend_fuses(cls, v, spec))
      cls = cls.to(autocast_state().dtype);
    const Tensor out = (*proj_drop_)((*proj_)(merge_heads(attend(cls, v, spec))));
    // The class row never reads the conv logits: their filters (and a temperature of their own)
    // get the zero gradients the whole forward gives them.
    TensorList unused = {to_k_->weight};
    if (to_k_->bias.defined()) unused.push_back(to_k_->bias);
    if (!one_scale && conv_scale_->temperature().defined()) {
      unused.push_back(conv_scale_->temperature());
    }
    return with_zero_grads(out, unused);
  }
  if (!grid_.cls_token) {
    return (*proj_drop_)((*proj_)(merge_heads(attend(spatial_logits(q, !one_scale), v, spec))));
  }
  // The class row and the spatial rows of q as one split: its backward writes their gradients
  // side by side, where two narrows would each zero-fill a q-sized gradient and add them up.
  const TensorList rows = split(q, {1, num_keys_ - 1}, 2);
  Tensor cls = cls_logits(rows[0], !one_scale);
  // Scaled by an f32 temperature, a block comes out f32 under autocast, and cat would widen the
  // other to f32 with it: [B, h, N, N] in f32 through the cat, and a cast of it to the autocast
  // dtype in the fused op (the reverse in the backward pass). Where the fused op reads the
  // logits, each block is rounded to that dtype first instead: the same values reach it.
  const AutocastState autocast = autocast_state();
  const bool rounded = autocast.enabled && attend_fuses(cls, v, spec);
  if (rounded) cls = cls.to(autocast.dtype);
  // Where the spatial rows' logits are the convolution's output as it is (unscaled) and in the
  // class row's dtype, every row's logits are one tensor made before its pieces: the direct conv
  // logits write the spatial rows there, and the cat copies the class row alone.
  const DType conv_dtype =
      autocast.enabled && q.dtype() == DType::kF32 ? autocast.dtype : q.dtype();
  // Read by the fused op, its rows padded to 16 bytes (empty_aligned_rows), and so their
  // gradient's: the conv logits' backward kernels stage those rows 16 bytes at a time.
  const bool unscaled = one_scale || conv_scale_->kind() == LogitScale::Kind::kNone;
  Tensor all;
  if (unscaled && cls.dtype() == conv_dtype) {
    const Shape shape{q.size(0), q.size(1), num_keys_, num_keys_};
    all = attend_fuses(cls, v, spec) ? empty_aligned_rows(shape, conv_dtype, q.device())
                                     : Tensor::empty(shape, conv_dtype, q.device());
  }
  const int64_t spatial_row = options_.authors_row_order ? 0 : 1;
  Tensor logits = spatial_logits(
      rows[1], !one_scale, all.defined() ? all.narrow(2, spatial_row, num_keys_ - 1) : Tensor());
  if (rounded) logits = logits.to(autocast.dtype);
  const TensorList pieces =
      options_.authors_row_order ? TensorList{logits, cls} : TensorList{cls, logits};
  logits = all.defined() ? cat(pieces, 2, all) : cat(pieces, 2);
  return (*proj_drop_)((*proj_)(merge_heads(attend(logits, v, spec))));
}

CskaOptions read_cska_options(const ConfigNode& cfg, const MixerArgs& args) {
  const bool vit = read_vit_flavour(cfg, args);
  CskaOptions o;
  o.layout = vit ? read_head_layout(cfg, args, 8, 64) : read_head_layout(cfg, args, 0, 16);
  o.qkv_bias = cfg.get<bool>("qkv_bias", false);
  o.proj_bias = cfg.get<bool>("proj_bias", vit);
  o.proj_drop = cfg.get_double_in("proj_drop", args.proj_drop, 0.0, 1.0);
  o.init = args.init;
  const std::string temperature = vit ? "learnable" : "fixed";
  o.conv_scale = read_logit_scale(cfg, "scale", !vit, temperature);
  o.cls_scale = read_logit_scale(cfg, "cls_scale", true, temperature);
  o.diagonal_mask = cfg.get<bool>("diagonal_mask", vit);
  o.activation = cfg.get_choice("activation", "softmax", AttentionWeights::names());
  o.authors_row_order = cfg.get<bool>("authors_row_order", false);
  return o;
}

void register_cska_mixer(Registry<MixerBuilder>& r) {
  r.add("cska", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    return std::make_shared<Cska>(args.dim, args.grid, read_cska_options(cfg, args));
  });
}

}  // namespace ska::nn
